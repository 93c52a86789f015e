"""End to end, on real components: a late rank whose NIC port is erroring is diagnosed as
such. Demo cluster (one node, rank i on GPU i, GPU i beside mlx5_i) -> real Prometheus with
the rules -> real Alertmanager. Rank 3 enters every collective 100 ms late while mlx5_3
port 1 counts symbol errors: FabricNcclStragglerRank must carry gpu 3 / mlx5_3 / port 1,
its diagnosis must name the symbol errors, and Alertmanager must put it in one group with
the port's own degradation alert. Rank 1 is not late, and its NIC is healthy."""
from __future__ import annotations

import time

import pytest

from fabricscope.demo import stack
from tests import procs

pytestmark = pytest.mark.slow

CLUSTER = "e2e-attr"
FAULT_AT = 15
SCENARIO = {"seed": 7, "cluster": {"name": CLUSTER, "nodes": 1, "gpus_per_node": 4, "hcas_per_node": 4},
            "tick_seconds": 0.5, "faults": [
                {"kind": "straggler_rank", "at": FAULT_AT, "duration": 120, "target": {"rank": 3},
                 "params": {"lag_seconds": 0.1}},
                {"kind": "symbol_error_storm", "node": 0, "at": FAULT_AT, "duration": 120,
                 "target": {"device": "mlx5_3", "port": 1}, "params": {"rate_per_second": 25}}]}
RULE_OVERRIDES = {
    "intervals": {group: "1s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")},
    "windows": {"ncclLag": "10s", "attributionCause": "20s"},
    "for": {"straggler": "3s", "ibDegraded": "2s"},
}
DEADLINE = 90


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    work = tmp_path_factory.mktemp("e2e-attribution")
    rules = stack.render_rules(RULE_OVERRIDES, work / "rules")
    with procs.demo_pipeline(SCENARIO, rules, work, CLUSTER) as run:
        prom, am, t0 = run.prometheus, run.alertmanager, run.t0

        def straggler_with_its_link_group():
            alerts = [a for a in prom.get("/api/v1/alerts")["data"]["alerts"]
                      if a["labels"]["alertname"] == "FabricNcclStragglerRank" and a["state"] == "firing"]
            groups = [sorted(a["labels"]["alertname"] for a in g["alerts"])
                      for g in am.get("/api/v2/alerts/groups")
                      if g["receiver"]["name"] == "ticket" and g["labels"].get("device") == "mlx5_3"]
            if alerts and any("FabricNcclStragglerRank" in g and "FabricInfinibandDegraded" in g
                              for g in groups):
                return (alerts, groups,
                        prom.get("/api/v1/query", query="comm_rank:fabric_nccl_rank_location:info"),
                        prom.get("/api/v1/query", query="fabric_nccl_rank_info"))
            return None

        alerts, groups, location, rank_info = procs.wait_for(
            straggler_with_its_link_group, t0 + FAULT_AT + DEADLINE - time.time(),
            "the straggler alert to fire and join its NIC's Alertmanager group", interval=1)
        yield {"alerts": alerts, "groups": groups, "location": location["data"]["result"],
               "rank_info": rank_info["data"]["result"],
               "seconds": time.time() - t0 - FAULT_AT}


def test_ranks_are_located_on_their_gpu_and_its_nic(diagnosed):
    rows = {r["metric"]["rank"]: r["metric"] for r in diagnosed["location"]}
    assert {rank: (m["gpu"], m.get("device"), m.get("port"), m.get("path")) for rank, m in rows.items()} == {
        str(i): (str(i), f"mlx5_{i}", "1", "same_switch") for i in range(4)}
    # The demo's ranks name no job: the exported job_id="" is stored as no label.
    assert all("job_id" not in m for m in rows.values())
    # The scrape's own job label survives honor_labels (a rank label named job replaced it).
    ranks = [r["metric"] for r in diagnosed["rank_info"]]
    assert len(ranks) == 4 and all(m.get("job") == stack.SCRAPE_JOB and "job_id" not in m for m in ranks), ranks


def test_the_late_rank_alert_names_its_gpu_nic_and_the_errors(diagnosed):
    [alert] = diagnosed["alerts"]
    labels = alert["labels"]
    assert (labels["rank"], labels["node"], labels["gpu"], labels["device"], labels["port"]) == \
        ("3", "gpu-node-0", "3", "mlx5_3", "1")
    diagnosis = alert["annotations"]["diagnosis"]
    assert diagnosis.startswith("rank 3 (gpu-node-0 GPU 3, mlx5_3 port 1) enters each collective "), diagnosis
    assert "; mlx5_3 port 1 symbol errors " in diagnosis and "/h" in diagnosis, diagnosis
    assert "no errors" not in diagnosis, diagnosis
    print(f"\ndiagnosed {diagnosed['seconds']:.0f}s after the fault: {diagnosis}")


def test_alertmanager_groups_the_rank_with_its_link_alert(diagnosed):
    assert any(set(g) >= {"FabricNcclStragglerRank", "FabricInfinibandDegraded"} for g in diagnosed["groups"])
