"""One hung job, one page: demo cluster (4 nodes) → real Prometheus with the rules → real
Alertmanager with the repository's routing → webhook.

The scenario holds only an NCCL hang: rank 5 (on gpu-node-2) stops while every other rank
of the 8-rank job enters the next collective and waits. Every rank's operation is then in
flight far past its average, on every node. The webhook must receive exactly one firing
notification for it, carrying one FabricNcclHang for the communicator that names rank 5
and carries its node and GPU. While it fires, the Fleet overview's own panel expressions
(read from dashboards/json/, as Grafana runs them) show the hang: its node fatal, the
hung rank among the slowest ranks, and a straggler cost above zero.
"""
from __future__ import annotations

import time

import pytest

from fabricscope.dashboards import model
from fabricscope.demo import stack
from tests import procs

pytestmark = pytest.mark.slow

CLUSTER = "e2e-hang"
NODES, GPUS_PER_NODE = 4, 2
HANG = {"kind": "nccl_hang", "at": 20, "duration": 35, "target": {"rank": 5}}
SCENARIO = {"seed": 7, "cluster": {"name": CLUSTER, "nodes": NODES, "gpus_per_node": GPUS_PER_NODE,
                                   "hcas_per_node": 1},
            "tick_seconds": 0.5, "faults": [HANG]}
RULE_OVERRIDES = {"intervals": {group: "1s" for group in ("tcp", "nccl", "infiniband", "nvlink", "kernel", "pipeline")},
                  "for": {"ncclHang": "5s"}}


@pytest.fixture(scope="module")
def notifications(tmp_path_factory):
    from fabricscope.demo.sources.nccl import job_comm

    work = tmp_path_factory.mktemp("e2e-hang")
    rules = stack.render_rules(RULE_OVERRIDES, work / "rules")
    with procs.demo_pipeline(SCENARIO, rules, work, CLUSTER) as run:
        # Until the hang has ended and its resolution has been sent (or a deadline).
        end = run.t0 + HANG["at"] + HANG["duration"]
        while time.time() < end + 30:
            resolved = [n for n in run.receiver.notifications if n.payload.get("status") == "resolved"]
            if time.time() > end and resolved:
                break
            time.sleep(1)
        yield job_comm(run.cluster.engine.cluster), [n.payload for n in run.receiver.notifications], \
            fleet_panels_mid_hang(run)


def fleet_panels_mid_hang(run) -> dict[str, list[dict]]:
    """Each Fleet overview panel's first query, as an instant query (what the panel shows
    "now") at the middle of the time FabricNcclHang fired, with the dashboard's variables
    resolved as Grafana resolves them ("All", the $/GPU-hour default)."""
    prometheus = run.prometheus
    start, end = run.t0, time.time()
    fired = prometheus.get("/api/v1/query_range", query='ALERTS{alertname="FabricNcclHang", alertstate="firing"}',
                           start=start, end=end, step=1)["data"]["result"]
    times = sorted({float(t) for series in fired for t, _ in series["values"]})
    assert times, "FabricNcclHang never fired"
    at = times[len(times) // 2]
    board = model.load_all()["fleet"]
    variables = model.resolve_variables(
        board, lambda label, selector: prometheus.get(f"/api/v1/label/{label}/values", start=start, end=end,
                                                      **({"match[]": selector} if selector else {}))["data"],
        model.builtin_variables(start, end, 1, 1))
    return {panel["title"]: prometheus.get("/api/v1/query", query=variables.substitute(panel["targets"][0]["expr"]),
                                           time=at)["data"]["result"]
            for panel in model.panels(board) if panel.get("targets")}


def test_one_firing_notification_with_one_alert_naming_the_stopped_rank(notifications):
    comm, payloads, _ = notifications
    firing = [p for p in payloads if p["status"] == "firing"]
    assert len(firing) == 1, [[(a["labels"]["alertname"], a["status"]) for a in p["alerts"]] for p in payloads]
    [alert] = firing[0]["alerts"]
    # The culprit's node and GPU (rank 5 is the second local rank of gpu-node-2: GPU 1).
    assert alert["labels"] == {"alertname": "FabricNcclHang", "severity": "critical", "cluster": CLUSTER,
                               "comm": comm, "node": "gpu-node-2", "rank": "5", "gpu": "1"}
    assert firing[0]["groupLabels"] == {"cluster": CLUSTER, "comm": comm}
    assert alert["annotations"]["culprit"] == "rank 5 on gpu-node-2 (not_entered)"
    assert "7 rank(s) waiting for rank 5 on gpu-node-2 (not_entered)" in alert["annotations"]["description"]


def test_the_page_resolves_when_the_rank_comes_back(notifications):
    _, payloads, _ = notifications
    resolved = [p for p in payloads if p["status"] == "resolved"]
    assert len(resolved) == 1 and [a["labels"]["alertname"] for a in resolved[0]["alerts"]] == ["FabricNcclHang"]


def _values(rows: list[dict]) -> list[float]:
    return [float(row["value"][1]) for row in rows]


def test_the_fleet_overview_shows_the_hang_while_it_fires(notifications):
    comm, _, panels = notifications
    # The hang is the scenario's only fault: the node it names is the fatal one.
    assert _values(panels["Fatal nodes"]) == [1.0], panels["Fatal nodes"]
    health = {row["metric"]["node"]: float(row["value"][1]) for row in panels["Node health"]}
    assert health.get("gpu-node-2") == 2.0, health
    # The hung rank is the slowest: late by the time its peers have waited (seconds,
    # where ordinary arrival spread is milliseconds).
    slowest = sorted(panels["Slowest ranks"], key=lambda row: -float(row["value"][1]))
    assert slowest and slowest[0]["metric"]["rank"] == "5" and slowest[0]["metric"]["comm"] == comm, slowest
    assert float(slowest[0]["value"][1]) > 1.0, slowest[0]
    # Every GPU of the 8-rank job waits: 8 GPUs at the default $2.50 per GPU-hour.
    assert _values(panels["Straggler cost now"]) == [8 * 2.5], panels["Straggler cost now"]
