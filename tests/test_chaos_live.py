"""Live enrichment from a real Prometheus scraping the demo's real exporters."""
from __future__ import annotations

import pytest
import requests

from fabricscope.chaos.blast import BlastRadiusEngine
from fabricscope.chaos.live import QUERIES, Observations, apply, enrich, observe
from fabricscope.demo.cluster import DemoCluster
from fabricscope.demo.scenario import load_scenario
from fabricscope.demo.topology import demo_job_name, demo_topology
from tests.procs import prometheus, wait_for

# gpu-node-1's HCA mlx5_1 is down; GPU 1 of gpu-node-0 loses all four links to NVSwitch 1
# (links 5-8 on an HGX H100 board).
FAULTS = [{"kind": "link_down", "node": 1, "at": "0s", "target": {"device": "mlx5_1", "port": 1}}] + [
    {"kind": "nvlink_down", "node": 0, "at": "0s", "target": {"gpu": 1, "link": link},
     "params": {"precursor_seconds": 0}} for link in (5, 6, 7, 8)] + [
    # One of the four links of gpu-node-1's GPU 0 to NVSwitch 0: the edge stays up.
    {"kind": "nvlink_down", "node": 1, "at": "0s", "target": {"gpu": 0, "link": 1}, "params": {"precursor_seconds": 0}}]
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
                     and len(query("fabric_infiniband_port_state")) == 6
                     and len(query("fabric_nvlink_state < 1")) == 5
                     and len(query('fabric_nvlink_remote_links{state="inactive"}')) == 2,
                     60, "the demo's metrics in Prometheus")
            yield scenario, query


def test_observations_from_the_exporters(live):
    scenario, query = live
    obs = observe(query)
    assert obs.port_up[("gpu-node-1", "mlx5_1", 1)] is False
    assert obs.port_up[("gpu-node-0", "mlx5_1", 1)] is True
    # Per edge (GPU -> the remote end's bus): links, active links. GPU 1 of gpu-node-0 has
    # all four of its links to NVSwitch 1 down; GPU 0 of gpu-node-1 one of its links to NVSwitch 0.
    not_all_active = {edge: counts for edge, counts in obs.nvlink.items() if counts[0] != counts[1]}
    assert not_all_active == {("gpu-node-0", 1, "00000000:C1:00.0"): (4, 0),
                              ("gpu-node-1", 0, "00000000:C0:00.0"): (5, 4)}
    assert len(obs.nvlink) == 2 * 2 * 4 and sum(links for links, _ in obs.nvlink.values()) == 72
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
    assert graph["gpu-node-1/gpu0"]["gpu-node-1/nvswitch0"]["state"] == "up"      # 4 of 5 links active
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


def per_link_edges(query) -> dict[tuple[str, int, str], tuple[int, int]]:
    """(links, active links) of each edge from every link's state and info series: how the
    merge read them before the exporter counted them (288,000 series at 1,000 nodes)."""
    info = {(m["node"], int(m["gpu"]), int(m["link"])): m["remote_pci_bus_id"]
            for m in (row["metric"] for row in query("fabric_nvlink_info"))}
    edges: dict[tuple[str, int, str], tuple[int, int]] = {}
    for row in query("fabric_nvlink_state"):
        m = row["metric"]
        edge = (m["node"], int(m["gpu"]), info[(m["node"], int(m["gpu"]), int(m["link"]))])
        links, active = edges.get(edge, (0, 0))
        edges[edge] = (links + 1, active + (float(row["value"][1]) >= 1))
    return edges


def test_edge_states_are_the_per_link_merge(live):
    """The exporter's per-edge counts give what merging every link's state and info gives:
    the same links and active links on every edge, so the same merge."""
    scenario, query = live
    per_link = per_link_edges(query)
    assert observe(query).nvlink == per_link
    assert [edge for edge, (_, active) in per_link.items() if active == 0] == [("gpu-node-0", 1, "00000000:C1:00.0")]
    # Merged over the inventory: the same topology, version included.
    topology, from_links = demo_topology(scenario), demo_topology(scenario)
    assert apply(topology, observe(query)).to_dict() == apply(from_links, Observations(
        port_up=observe(query).port_up, nvlink=per_link, ranks=observe(query).ranks)).to_dict()
    assert topology.version == from_links.version


def test_the_merge_reads_no_per_link_series(live):
    """Every query the merge asks reads the per-edge counts, never a link's state or info
    (144,000 series each at 1,000 nodes)."""
    scenario, query = live
    asked = []
    observe(lambda promql: asked.append(promql) or query(promql))
    assert asked == list(QUERIES.values())
    assert not [q for q in asked if "fabric_nvlink_state" in q or "fabric_nvlink_info" in q]


def test_an_edge_no_link_reports_keeps_the_inventory_state():
    """A node whose NVLink series vanished (its exporter or NVML gone) says nothing about
    its edges: they keep the inventory's state; an edge the inventory has down is up again
    once one of its links reports active."""
    scenario = load_scenario({**SCENARIO, "faults": []})
    topology = demo_topology(scenario)
    topology.set_link_state("gpu-node-0/gpu0", "gpu-node-0/nvswitch0", "down")
    topology.set_link_state("gpu-node-1/gpu0", "gpu-node-1/nvswitch0", "down")
    # Only gpu-node-1 reports, GPU 0's five links to NVSwitch 0 all active.
    report = apply(topology, Observations(nvlink={("gpu-node-1", 0, "00000000:C0:00.0"): (5, 5)}))
    assert report.nvlinks == 1 and report.unmatched == []
    assert topology.graph["gpu-node-0/gpu0"]["gpu-node-0/nvswitch0"]["state"] == "down"
    assert topology.graph["gpu-node-1/gpu0"]["gpu-node-1/nvswitch0"]["state"] == "up"


def test_malformed_series_are_skipped_not_fatal():
    answers = {
        QUERIES["port_state"]: [{"metric": {"node": "n", "device": "mlx5_0", "port": "x", "state": "ACTIVE"},
                                 "value": [0, "4"]}, {"metric": {}, "value": "bad"}, {}],
        QUERIES["nvlink_links"]: [
            {"metric": {"node": "n", "gpu": "zero", "remote_pci_bus_id": "0:c0:00.0", "state": "active"},
             "value": [0, "4"]}, {"metric": {"gpu": "0", "state": "active"}, "value": [0, "4"]},
            {"metric": {"node": "n", "gpu": "0", "remote_pci_bus_id": "0:c0:00.0", "state": "up"}, "value": [0, "4"]},
            {"metric": {"node": "n", "gpu": "0", "remote_pci_bus_id": "0:c0:00.0", "state": "active"},
             "value": [0, "NaN"]}],
        QUERIES["rank_info"]: [],
        QUERIES["comm_info"]: [{"metric": {"comm": "c", "rank": "-", "node": "n"}, "value": [0, "1"]}],
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
