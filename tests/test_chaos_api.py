"""POST /graph/chaos-simulate and GET /graph/chaos-results/<id>: lifecycle, budget, bad
input, persistence across a restart."""
from __future__ import annotations

import time

import pytest

from fabricscope.queryapi.app import create_app
from fabricscope.queryapi.config import ConfigError
from fabricscope.demo.stack import free_port
from tests.procs import wait_for
from tests.sidecar_helpers import bearer, make_keys

INVENTORY = "name: lab\ngenerate: {hosts: 8, job_hosts: 4}\n"
WRITERS = {f"writer-{i}": "write" for i in range(6)}


@pytest.fixture
def env(tmp_path):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(INVENTORY)
    keys = make_keys(tmp_path / "keys.yaml", WRITERS)
    settings = {"insecure_no_tls": True, "database": str(tmp_path / "sidecar.db"),
                "keys_file": str(tmp_path / "keys.yaml"), "chaos_topology": str(inventory),
                "chaos_refresh_seconds": 0, "prometheus_url": f"http://127.0.0.1:{free_port()}"}
    apps = []

    def make_app(**overrides):
        app = create_app({**settings, **overrides})
        apps.append(app)
        return app

    yield make_app, keys
    for app in apps:
        app.extensions["fabricscope"].close()


def submit(client, token, **body):
    return client.post("/graph/chaos-simulate", json=body, headers=bearer(token))


def poll(client, token, sim_id):
    def done():
        response = client.get(f"/graph/chaos-results/{sim_id}", headers=bearer(token))
        return response if response.status_code != 202 else None
    return wait_for(done, 30, f"simulation {sim_id}", interval=0.02)


def test_submit_then_poll_until_the_result(env):
    make_app, keys = env
    client = make_app().test_client()
    response = submit(client, keys["writer-0"], device="gpu-node-1", failure_type="rack_failure")
    assert response.status_code == 202
    body = response.get_json()
    assert body["status"] == "running" and len(body["simulation_id"]) == 32
    assert response.headers["Location"] == f"/graph/chaos-results/{body['simulation_id']}"
    result = poll(client, keys["reader"], body["simulation_id"])
    assert result.status_code == 200
    data = result.get_json()
    assert data["status"] == "complete"
    assert data["affected_jobs"] == ["job-0"] and data["total_active_jobs"] == 2
    assert {f"gpu-node-{i}" for i in range(4)} <= set(data["affected_devices"])
    assert data["impact_score"] == pytest.approx(0.4 * data["affected_device_count"] / data["total_devices"] + 0.3)
    assert data["path"][0] == {"device": "gpu-node-0", "via": None, "reason": "rack"}
    topology = client.get("/graph/chaos-topology", headers=bearer(keys["reader"])).get_json()
    assert data["topology_version"] == topology["version"]
    assert topology["summary"]["kinds"]["gpu"] == 64
    # A switch failure that cuts one GPU per host cuts both jobs.
    sim_id = submit(client, keys["writer-0"], device="leaf-su0-r2", failure_type="switch_failure",
                    include_jobs=True).get_json()["simulation_id"]
    assert poll(client, keys["reader"], sim_id).get_json()["affected_jobs"] == ["job-0", "job-1"]


def test_sixth_simulation_in_a_minute_gets_429_with_retry_after(env):
    make_app, keys = env
    client = make_app().test_client()
    for _ in range(5):
        assert submit(client, keys["writer-1"], device="core-0").status_code == 202
    refused = submit(client, keys["writer-1"], device="core-0")
    assert refused.status_code == 429
    assert refused.get_json()["error"]["code"] == "chaos_rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 12
    # The budget is per key.
    assert submit(client, keys["writer-2"], device="core-0").status_code == 202
    # Other endpoints are not charged to it.
    assert client.get("/graph/chaos-topology", headers=bearer(keys["writer-1"])).status_code == 200


def test_bad_requests_get_422_naming_the_valid_choices(env):
    make_app, keys = env
    client = make_app().test_client()
    token = keys["writer-3"]
    unknown = submit(client, token, device="gpu-node-99")
    assert unknown.status_code == 422
    error = unknown.get_json()["error"]
    assert error["code"] == "chaos_invalid_device" and "gpu-node-7" in error["detail"]["choices"]
    assert error["detail"]["failure_types"] == ["device_failure", "power_failure", "rack_failure", "switch_failure"]
    bad_type = submit(client, token, device="core-0", failure_type="meteor")
    assert bad_type.status_code == 422
    assert "'device_failure', 'power_failure', 'rack_failure' or 'switch_failure'" in str(bad_type.get_json())
    not_a_switch = submit(client, token, device="gpu-node-0", failure_type="switch_failure")
    assert not_a_switch.status_code == 422 and "leaf_switch" in not_a_switch.get_json()["error"]["detail"]["choices"]
    token = keys["writer-4"]
    assert submit(client, token, failure_type="rack_failure").status_code == 422          # no device
    assert submit(client, token, device="core-0", colour="red").status_code == 422       # unknown key
    response = client.post("/graph/chaos-simulate", data="device=core-0", headers=bearer(token),
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415


def test_unknown_ids_scopes_and_no_topology(env):
    make_app, keys = env
    client = make_app().test_client()
    missing = client.get("/graph/chaos-results/nope", headers=bearer(keys["reader"]))
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "simulation_not_found"
    assert client.get("/graph/chaos-results/" + "x" * 500, headers=bearer(keys["reader"])).status_code == 404
    assert submit(client, keys["reader"], device="core-0").status_code == 403
    assert client.post("/graph/chaos-simulate", json={"device": "core-0"}).status_code == 401
    devices = client.get("/graph/chaos-devices?kind=core_switch", headers=bearer(keys["reader"])).get_json()
    assert [d["name"] for d in devices["devices"]] == ["core-0", "core-1", "core-2", "core-3"]
    bare = make_app(chaos_topology=None, database=str(env_db(client))).test_client()
    response = submit(bare, keys["writer-5"], device="core-0")
    assert response.status_code == 404 and response.get_json()["error"]["code"] == "chaos_no_topology"


def env_db(client):
    return client.application.extensions["fabricscope"].config.database + "-bare"


def test_results_survive_a_restart(env, tmp_path):
    make_app, keys = env
    app = make_app()
    client = app.test_client()
    sim_id = submit(client, keys["writer-0"], device="pdu-rack-su0-1-a",
                    failure_type="power_failure").get_json()["simulation_id"]
    before = poll(client, keys["reader"], sim_id).get_json()
    # A simulation whose sidecar stopped before finishing it is reported, not left running.
    app.extensions["fabricscope"].storage.save_simulation(
        "orphan", "running", {"request": {"device": "core-0"}, "submitted_ms": 1, "instance": "gone"})
    app.extensions["fabricscope"].close()
    restarted = make_app().test_client()
    after = restarted.get(f"/graph/chaos-results/{sim_id}", headers=bearer(keys["reader"]))
    assert after.status_code == 200 and after.get_json() == before
    orphan = restarted.get("/graph/chaos-results/orphan", headers=bearer(keys["reader"]))
    assert orphan.status_code == 200 and orphan.get_json()["status"] == "failed"
    assert "interrupted" in orphan.get_json()["error"]


def test_a_bad_inventory_stops_start_up(env, tmp_path):
    make_app, _ = env
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [{name: a, kind: toaster}]\n")
    with pytest.raises(ConfigError, match=r"chaos_topology: .*bad.yaml: devices\[0\]\.kind"):
        make_app(chaos_topology=str(bad), database=str(tmp_path / "other.db"))


def alert(name, severity, **labels):
    return {"status": "firing", "labels": {"alertname": name, "severity": severity, **labels},
            "annotations": {}, "startsAt": "2026-11-26T06:00:00Z", "endsAt": "0001-01-01T00:00:00Z",
            "fingerprint": f"{name}-{sorted(labels.items())}"[:60]}


def test_critical_alerts_get_the_blast_radius_of_their_device(env):
    make_app, keys = env
    app = make_app()
    state = app.extensions["fabricscope"]
    received = [alert("FabricInfinibandPortDown", "critical", node="gpu-node-2", device="mlx5_1", port="1"),
                alert("FabricExporterDown", "critical", node="gpu-node-6"),
                alert("FabricNcclHang", "critical", comm="0123456789abcdef"),
                alert("FabricInfinibandDegraded", "warning", node="gpu-node-5", device="mlx5_0", port="1")]
    state.storage.record_alerts(received, int(time.time() * 1000))
    service = app.extensions["fabricscope"].chaos
    assert service.alerts.run_once() == 2
    assert service.alerts.run_once() == 0          # once per alert episode
    listed = app.test_client().get("/graph/chaos-alerts", headers=bearer(keys["reader"])).get_json()["alerts"]
    by_name = {a["alertname"]: a for a in listed}
    assert set(by_name) == {"FabricInfinibandPortDown", "FabricExporterDown", "FabricNcclHang"}
    port = by_name["FabricInfinibandPortDown"]["blast_radius"]
    assert port["device"] == "gpu-node-2/mlx5_1" and port["affected_jobs"] == ["job-0"]
    assert port["affected_by_kind"] == {"gpu": 1, "hca": 1}
    host = by_name["FabricExporterDown"]["blast_radius"]
    assert host["device"] == "gpu-node-6" and host["affected_jobs"] == ["job-1"]
    assert by_name["FabricNcclHang"]["blast_radius"] is None
    assert by_name["FabricNcclHang"]["blast_radius_state"] == "no_device"
    # Each is also a simulation result of its own.
    from fabricscope.queryapi.chaos_api import alert_simulation_id
    for sent, status in ((received[0], "complete"), (received[2], "no_device")):
        got = app.test_client().get(f"/graph/chaos-results/{alert_simulation_id(sent['fingerprint'], sent['startsAt'])}",
                                    headers=bearer(keys["reader"]))
        assert got.status_code == 200 and got.get_json()["status"] == status



def test_refused_requests_do_not_spend_the_simulation_budget(env):
    make_app, keys = env
    client = make_app().test_client()
    token = keys["writer-5"]
    for _ in range(20):
        assert submit(client, token, device="no-such-device").status_code == 422
        assert submit(client, token, device="gpu-node-0", failure_type="switch_failure").status_code == 422
    for _ in range(5):
        assert submit(client, token, device="core-0").status_code == 202
    assert submit(client, token, device="core-0").status_code == 429


@pytest.mark.parametrize("typo", ["gpu-node-99", "gpunode-1", "xgpu-node-1", "node-gpu-1", "zzzz"])
def test_every_unknown_device_gets_close_matches(env, typo):
    """Typos past the first characters, in the first characters, words swapped, or
    nothing alike: the 422 always names devices to try."""
    make_app, keys = env
    error = submit(make_app().test_client(), keys["writer-0"], device=typo).get_json()["error"]
    assert error["code"] == "chaos_invalid_device" and error["detail"]["choices"], error
    assert "close matches:" in error["message"]


def test_every_critical_alert_of_a_storm_gets_its_blast_radius_oldest_first(env):
    """1,500 critical alerts at once (newer than the 500 a page used to hold): each gets a
    blast radius, one simulation per device however many alerts name it, and the key
    budget of the API is untouched."""
    make_app, keys = env
    app = make_app()
    state = app.extensions["fabricscope"]
    now = int(time.time() * 1000)
    storm = [alert("FabricInfinibandPortDown", "critical", node=f"gpu-node-{i % 8}", device="mlx5_0", port="1",
                   incident=str(i)) for i in range(1500)]
    for i, sent in enumerate(storm):
        sent["fingerprint"] = f"storm-{i:04d}"
    for offset, start in enumerate(range(0, 1500, 300)):
        state.storage.record_alerts(storm[start:start + 300], now - 1000 + offset)
    worker = app.extensions["fabricscope"].chaos.alerts
    simulated = []
    real_simulate = app.extensions["fabricscope"].chaos.topology.engine().simulate

    def counting(device, *args, **kwargs):
        simulated.append(device)
        return real_simulate(device, *args, **kwargs)

    app.extensions["fabricscope"].chaos.topology.engine().simulate = counting
    assert worker.run_once() == 1500
    assert sorted(simulated) == sorted({f"gpu-node-{i}/mlx5_0" for i in range(8)})
    from fabricscope.queryapi.chaos_api import alert_simulation_id
    for sent in (storm[0], storm[777], storm[-1]):
        assert state.storage.load_simulation(alert_simulation_id(sent["fingerprint"], sent["startsAt"]))["status"] \
            == "complete"
    assert worker.run_once() == 0
    # The API key budget is the API's alone.
    assert submit(app.test_client(), keys["writer-1"], device="core-0").status_code == 202


def test_alert_budget_defers_and_never_skips(env):
    """Past its own budget the worker stops where it is; the next pass goes on from the
    first alert it left, so the oldest are never skipped."""
    make_app, keys = env
    app = make_app(chaos_alert_simulations_per_minute=2)
    state = app.extensions["fabricscope"]
    now = int(time.time() * 1000)
    alerts = [alert("FabricExporterDown", "critical", node=f"gpu-node-{i}") for i in range(4)]
    for i, sent in enumerate(alerts):
        sent["fingerprint"] = f"down-{i}"
    for i, sent in enumerate(alerts):
        state.storage.record_alerts([sent], now - 100 + i)
    worker = app.extensions["fabricscope"].chaos.alerts
    assert worker.run_once() == 2
    assert worker.run_once() == 0                  # budget spent: nothing skipped, nothing done
    worker.limiter = type(worker.limiter)()        # a minute later
    assert worker.run_once() == 2
    from fabricscope.queryapi.chaos_api import alert_simulation_id
    assert all(state.storage.load_simulation(alert_simulation_id(a["fingerprint"], a["startsAt"])) for a in alerts)


def test_webhook_simulations_are_charged_to_the_posting_key(env):
    """Past its own per-minute budget a key's alerts are stored over_budget and never
    simulated; another key's alerts, posted after, still get theirs."""
    make_app, keys = env
    app = make_app(chaos_alert_simulations_per_key_per_minute=2)
    client = app.test_client()

    def post(key, nodes, prefix):
        sent = [alert("FabricExporterDown", "critical", node=f"gpu-node-{i}") for i in nodes]
        for i, one in zip(nodes, sent):
            one["fingerprint"] = f"{prefix}{i}"
        reply = client.post("/alerts/webhook", json={"receiver": "r", "alerts": sent}, headers=bearer(keys[key]))
        assert reply.status_code == 200, reply.get_json()
        return sent

    flooded = post("writer-1", range(0, 6), "flood")
    other = post("writer-2", range(6, 8), "other")
    worker = app.extensions["fabricscope"].chaos.alerts
    assert worker.run_once() == 4                   # 2 of the flooding key's, 2 of the other's
    from fabricscope.queryapi.chaos_api import alert_simulation_id
    state = app.extensions["fabricscope"].storage

    def status(sent):
        return state.load_simulation(alert_simulation_id(sent["fingerprint"], sent["startsAt"]))["status"]

    assert [status(a) for a in flooded] == ["complete"] * 2 + ["over_budget"] * 4
    assert [status(a) for a in other] == ["complete"] * 2


def test_real_sidecar_process_simulates_and_keeps_results_across_a_restart(tmp_path):
    """`fabricscope sidecar` (TLS): the pool and the refresh worker run in the serving
    process, and a result outlives the process."""
    import requests

    from fabricscope.demo.stack.sidecar import start_sidecar

    inventory = tmp_path / "cluster.yaml"
    inventory.write_text(INVENTORY)
    keys = make_keys(tmp_path / "keys.yaml")
    unreachable = f"http://127.0.0.1:{free_port()}"

    def start():
        return start_sidecar(tmp_path, "127.0.0.1", free_port(), unreachable, tmp_path / "keys.yaml",
                             extra_args=["--chaos-topology", str(inventory), "--chaos-refresh-seconds", "1",
                                         "--prometheus-timeout", "1"])

    def call(process, method, path, key, **kwargs):
        return requests.request(method, process.url + path, headers=bearer(keys[key]), timeout=15,
                                verify=str(process.certs.ca), **kwargs)

    process = start()
    try:
        sim_id = call(process, "POST", "/graph/chaos-simulate", "writer",
                      json={"device": "leaf-su0-r5", "failure_type": "switch_failure"}).json()["simulation_id"]
        done = wait_for(lambda: (r := call(process, "GET", f"/graph/chaos-results/{sim_id}", "reader")).status_code
                        == 200 and r.json(), 30, "the simulation in the real sidecar")
        assert done["affected_jobs"] == ["job-0", "job-1"]
        # Prometheus is unreachable: the refresh worker says so and simulations go on.
        status = wait_for(lambda: call(process, "GET", "/graph/chaos-topology", "reader").json()["live_error"],
                          30, "the live refresh to report the unreachable Prometheus")
        # ... in words that name no internal address.
        assert status == "PrometheusError: Prometheus is unreachable: ConnectionError"
    finally:
        process.stop()
    process = start()
    try:
        again = call(process, "GET", f"/graph/chaos-results/{sim_id}", "reader")
        assert again.status_code == 200 and again.json() == done
    finally:
        process.stop()


def test_neighbors_tool_names_close_matches_for_an_unknown_device(env):
    make_app, keys = env
    client = make_app().test_client()
    response = client.post("/api/v1/tools/device_neighbors", json={"device": "gpu-nod-1"}, headers=bearer(keys["reader"]))
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "invalid_params" and "close matches: gpu-node-1" in error["message"]
    assert error["detail"] == {"param": "device", "choices": error["detail"]["choices"]}
    assert "gpu-node-1" in error["detail"]["choices"]
    known = client.post("/api/v1/tools/device_neighbors", json={"device": "gpu-node-1"}, headers=bearer(keys["reader"]))
    assert known.status_code == 200 and known.get_json()["results"]
