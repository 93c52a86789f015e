"""Live enrichment from a real Prometheus scraping the demo's real exporters."""
from __future__ import annotations

import pytest
import requests

from fabricscope.chaos.blast import BlastRadiusEngine
from fabricscope.chaos.live import enrich, observe
from fabricscope.demo.cluster import DemoCluster
from fabricscope.demo.scenario import load_scenario
from fabricscope.demo.topology import demo_job_name, demo_topology
from tests.procs import prometheus, wait_for

# gpu-node-1's HCA mlx5_1 is down; GPU 1 of gpu-node-0 loses all four links to NVSwitch 1
# (links 5-8 on an HGX H100 board).
FAULTS = [{"kind": "link_down", "node": 1, "at": "0s", "target": {"device": "mlx5_1", "port": 1}}] + [
    {"kind": "nvlink_down", "node": 0, "at": "0s", "target": {"gpu": 1, "link": link},
     "params": {"precursor_seconds": 0}} for link in (5, 6, 7, 8)]
SCENARIO = {"seed": 5, "cluster": {"name": "live", "nodes": 2, "gpus_per_node": 2, "hcas_per_node": 2},
            "tick_seconds": 0.5, "faults": FAULTS}


class PrometheusQuery:
    """Instant queries over the real HTTP API (the sidecar passes its own client instead)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, promql: str) -> list[dict]:
        response = requests.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]["result"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("chaos-live")
    scenario = load_scenario(SCENARIO)
    with DemoCluster(scenario, workdir / "demo") as cluster:
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                  "scrape_configs": [{"job_name": "fabric", "honor_labels": True,
                                      "static_configs": [{"targets": [a for _, a in cluster.targets]}]}]}
        with prometheus(config, workdir) as server:
            query = PrometheusQuery(server.url)
            wait_for(lambda: len(query("fabric_nccl_comm_info")) == 4 and len(query("fabric_nvlink_state")) == 72
                     and len(query("fabric_infiniband_port_state")) == 6, 60, "the demo's metrics in Prometheus")
            yield scenario, query


def test_observations_from_the_exporters(live):
    scenario, query = live
    obs = observe(query)
    assert obs.port_up[("gpu-node-1", "mlx5_1", 1)] is False
    assert obs.port_up[("gpu-node-0", "mlx5_1", 1)] is True
    assert obs.nvlink[("gpu-node-0", 1, 5)][0] is False
    assert sorted(obs.ranks[demo_job_name(scenario)]) == [(0, "gpu-node-0", 0), (1, "gpu-node-0", 1), (2, "gpu-node-1", 0),
                                      (3, "gpu-node-1", 1)]


def test_live_state_merges_over_the_generated_topology(live):
    scenario, query = live
    topology = demo_topology(scenario)
    before = topology.version
    report = enrich(topology, query)
    assert report.unmatched == []
    assert report.ports == 6 and report.jobs == 1 and report.nvlinks == 2 * 2 * 4 and report.nvlinks_added == 0
    graph = topology.graph
    assert graph["gpu-node-1/mlx5_1"]["leaf-su0-r1"]["state"] == "down"
    assert graph["leaf-su0-r1"]["gpu-node-1/mlx5_1"]["state"] == "down"
    assert graph["gpu-node-0/gpu1"]["gpu-node-0/nvswitch1"]["state"] == "down"
    assert graph["gpu-node-0/gpu1"]["gpu-node-0/nvswitch0"]["state"] == "up"
    assert topology.version != before
    (job,) = topology.jobs.values()
    assert job.source == "prometheus" and [r.gpu for r in job.ranks] == [
        "gpu-node-0/gpu0", "gpu-node-0/gpu1", "gpu-node-1/gpu0", "gpu-node-1/gpu1"]
    # Rail 1's leaf: gpu-node-1's HCA on it was already down, so only gpu-node-0's side is lost.
    result = BlastRadiusEngine(topology).simulate("leaf-su0-r1", "switch_failure")
    assert result.disconnected_devices == {"gpu-node-0/mlx5_1": ["compute"], "gpu-node-0/gpu1": ["compute"]}
    assert result.affected_jobs == [job.name]
    # The same observations give the same version: a refresh with nothing new reuses the engine.
    again = demo_topology(scenario)
    enrich(again, query)
    assert again.version == topology.version


def test_malformed_series_are_skipped_not_fatal():
    answers = {
        "fabric_infiniband_port_state": [{"metric": {"node": "n", "device": "mlx5_0", "port": "x", "state": "ACTIVE"},
                                          "value": [0, "4"]}, {"metric": {}, "value": "bad"}, {}],
        "fabric_nvlink_info": [{"metric": {"node": "n", "gpu": "0", "link": "0"}, "value": [0, "1"]}],
        "fabric_nvlink_state": [{"metric": {"node": "n", "gpu": "zero", "link": "0"}, "value": [0, "1"]}],
        "fabric_nccl_rank_info": [],
        "fabric_nccl_comm_info": [{"metric": {"comm": "c", "rank": "-", "node": "n"}, "value": [0, "1"]}],
    }
    obs = observe(lambda promql: answers[promql])
    assert obs.port_up == {} and obs.nvlink == {} and obs.ranks == {}


def test_the_sidecar_simulates_on_the_live_topology(live, tmp_path):
    from fabricscope.demo.topology import write_demo_inventory
    from fabricscope.queryapi.app import create_app
    from tests.sidecar_helpers import bearer, make_keys

    scenario, query = live
    keys = make_keys(tmp_path / "keys.yaml")
    app = create_app({"insecure_no_tls": True, "database": str(tmp_path / "db"), "keys_file": str(tmp_path / "keys.yaml"),
                      "chaos_topology": str(write_demo_inventory(scenario, tmp_path / "demo.yaml")),
                      "prometheus_url": query.url, "chaos_refresh_seconds": 30})
    try:
        client = app.test_client()
        inventory_only = client.get("/graph/chaos-topology", headers=bearer(keys["reader"])).get_json()
        assert inventory_only["live_report"] is None
        # What the refresh worker does every chaos_refresh_seconds, run once here.
        worker = next(w for w in app.extensions["fabricscope"].workers if w.name == "chaos-topology")
        worker.run_once()
        status = client.get("/graph/chaos-topology", headers=bearer(keys["reader"])).get_json()
        assert status["live"] is True and status["live_error"] is None
        assert status["live_report"]["ports"] == 6 and status["live_report"]["jobs"] == 1
        assert status["version"] != inventory_only["version"]
        sim = client.post("/graph/chaos-simulate", json={"device": "leaf-su0-r1", "failure_type": "switch_failure"},
                          headers=bearer(keys["writer"])).get_json()["simulation_id"]
        poll = lambda: client.get(f"/graph/chaos-results/{sim}", headers=bearer(keys["reader"]))  # noqa: E731
        result = wait_for(lambda: poll().status_code == 200 and poll().get_json(), 30, "the simulation")
        assert result["topology_version"] == status["version"]
        assert result["disconnected_devices"] == {"gpu-node-0/mlx5_1": ["compute"], "gpu-node-0/gpu1": ["compute"]}
        assert result["affected_jobs"] == [demo_job_name(scenario)]
    finally:
        app.extensions["fabricscope"].close()
