"""What the sidecar acknowledged survives a kill -9, on SQLite and on PostgreSQL.

Clients post span batches while the sidecar is killed with SIGKILL (master and worker);
after a restart on the same database every batch that got a 200 is there, and so are the
correlations computed before the kill. Correlations come from a real Prometheus whose
rule keeps one anomaly alert firing on one node."""
from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import pytest
import requests

from fabricscope.demo import stack
from fabricscope.demo.stack.sidecar import start_sidecar
from tests import procs
from tests.sidecar_helpers import bearer, make_keys, seed_span

pytestmark = pytest.mark.slow

ANOMALOUS_NODE = "gpu-node-9"
# A real rule evaluated by real Prometheus: the alert is always firing on one node.
ALWAYS_FIRING = {"groups": [{"name": "always", "interval": "1s", "rules": [{
    "alert": "FabricTcpMicroburst", "expr": f'label_replace(vector(7), "node", "{ANOMALOUS_NODE}", "", "")',
    "labels": {"severity": "warning"}}]}]}


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("prom")
    rules = stack.write_yaml(work / "always.yml", ALWAYS_FIRING)
    config = stack.prometheus_config("durability", work / "targets.json", f"127.0.0.1:{stack.free_port()}",
                                     [rules], scrape_interval="1s", evaluation_interval="1s")
    with procs.prometheus(config, work) as prom:
        procs.wait_for(lambda: prom.get("/api/v1/query", query="ALERTS")["data"]["result"], 30, "ALERTS")
        yield prom.url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request, tmp_path_factory):
    if request.param == "sqlite":
        yield str(tmp_path_factory.mktemp("sqlite") / "sidecar.db")
    else:
        with procs.postgres(tmp_path_factory.mktemp("pg")) as url:
            yield url


def kill_9(process) -> None:
    os.killpg(process.process.process.pid, signal.SIGKILL)
    process.process.process.wait()
    process.process.stop()       # closes the log file; the process is already gone


def test_acknowledged_spans_and_correlations_survive_kill_9(tmp_path, prometheus, database):
    keys = make_keys(tmp_path / "keys.yaml")
    port = stack.free_port()
    args = ["--database", database]

    def start():
        return start_sidecar(tmp_path, "127.0.0.1", port, prometheus, tmp_path / "keys.yaml", extra_args=args)

    sidecar = start()
    ca = str(sidecar.certs.ca)
    url = sidecar.url

    def get(path, **params):
        response = requests.get(url + path, params=params, headers=bearer(keys["reader"]), verify=ca, timeout=10)
        response.raise_for_status()
        return response.json()

    # Correlated before the kill.
    correlated = uuid.uuid4().hex
    requests.post(url + "/tracing/spans", json={"spans": [seed_span(correlated, "c", 3000, [ANOMALOUS_NODE])]},
                  headers=bearer(keys["writer"]), verify=ca, timeout=10).raise_for_status()
    procs.wait_for(lambda: get("/tracing/correlations", trace_id=correlated)["correlations"], 30, "a correlation")

    acknowledged: list[str] = []
    stop = threading.Event()

    def client():
        session = requests.Session()
        while not stop.is_set():
            trace_id = uuid.uuid4().hex
            batch = [seed_span(trace_id, f"s{i}", 2500, ["gpu-node-0", "ib-sw-01"]) for i in range(20)]
            try:
                response = session.post(url + "/tracing/spans", json={"spans": batch},
                                        headers=bearer(keys["writer"]), verify=ca, timeout=10)
            except requests.RequestException:
                continue      # the kill: this batch was never acknowledged
            if response.status_code == 200:
                acknowledged.append(trace_id)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for thread in threads:
        thread.start()
    procs.wait_for(lambda: len(acknowledged) >= 10, 60, "acknowledged batches before the kill")
    kill_9(sidecar)
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()

    sidecar = start()
    try:
        stored = {v["trace_id"] for v in get("/tracing/slo-violations", limit=5000)["violations"]}
        missing = [t for t in acknowledged if t not in stored]
        assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged batches lost by kill -9"
        (correlation,) = get("/tracing/correlations", trace_id=correlated)["correlations"]
        assert correlation["confidence"] == 1.0
    finally:
        sidecar.stop()


def test_replicas_share_postgresql_and_a_second_sqlite_writer_is_refused(tmp_path, prometheus, database):
    keys = make_keys(tmp_path / "keys.yaml")

    def replica(name: str):
        return start_sidecar(tmp_path / name, "127.0.0.1", stack.free_port(), prometheus, tmp_path / "keys.yaml",
                             extra_args=["--database", database])

    a = replica("a")
    try:
        if not database.startswith("postgresql://"):
            with pytest.raises(stack.StackError, match="locked by another sidecar process"):
                replica("b").stop()
            return
        b = replica("b")
        try:
            trace = uuid.uuid4().hex
            batch = [seed_span(trace, f"s{i}", 3000, [ANOMALOUS_NODE, "ib-sw-01"]) for i in range(20)]
            requests.post(a.url + "/tracing/spans", json={"spans": batch}, headers=bearer(keys["writer"]),
                          verify=str(a.certs.ca), timeout=10).raise_for_status()

            def correlations_at_b():
                answer = requests.get(b.url + "/tracing/correlations", params={"trace_id": trace},
                                      headers=bearer(keys["reader"]), verify=str(b.certs.ca), timeout=10).json()
                return answer["correlations"] if answer["pending"] == 0 else None
            found = procs.wait_for(correlations_at_b, 30, "both replicas' correlators to finish the batch")
            # Each violation correlated exactly once, whichever replica claimed it.
            assert sorted(c["span_id"] for c in found) == sorted(f"s{i}" for i in range(20))
            assert {c["confidence"] for c in found} == {0.5}
        finally:
            b.stop()
    finally:
        a.stop()


@pytest.mark.parametrize("path, matched", [
    ([ANOMALOUS_NODE], {ANOMALOUS_NODE}),
    ([".*"], set()),                                            # a regex in a device name is literal text
    (["gpu-node-.", "gpu-node-9|x"], set()),
    ([f'{ANOMALOUS_NODE}"}} or vector(1) # ', "ib\\sw\n"], set()),   # quotes, backslashes, newlines
])
def test_device_names_reach_prometheus_only_as_literal_values(prometheus, path, matched):
    from fabricscope.queryapi.prom import PrometheusClient
    from fabricscope.queryapi.tracing.correlate import anomalies_on_path

    found = anomalies_on_path(PrometheusClient(prometheus), path, time.time())
    assert set(found) == matched
