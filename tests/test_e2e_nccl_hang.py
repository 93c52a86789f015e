"""One hung job, one page: demo cluster (4 nodes) → real Prometheus with the rules → real
Alertmanager with the repository's routing → webhook.

The scenario holds only an NCCL hang: rank 5 (on gpu-node-2) stops while every other rank
of the 8-rank job enters the next collective and waits. Every rank's operation is then in
flight far past its average, on every node. The webhook must receive exactly one firing
notification for it, carrying one FabricNcclHang for the communicator that names rank 5.
"""
from __future__ import annotations

import time

import pytest

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
        yield job_comm(run.cluster.engine.cluster), [n.payload for n in run.receiver.notifications]


def test_one_firing_notification_with_one_alert_naming_the_stopped_rank(notifications):
    comm, payloads = notifications
    firing = [p for p in payloads if p["status"] == "firing"]
    assert len(firing) == 1, [[(a["labels"]["alertname"], a["status"]) for a in p["alerts"]] for p in payloads]
    [alert] = firing[0]["alerts"]
    assert alert["labels"] == {"alertname": "FabricNcclHang", "severity": "critical", "cluster": CLUSTER,
                               "comm": comm}
    assert firing[0]["groupLabels"] == {"cluster": CLUSTER, "comm": comm}
    assert alert["annotations"]["culprit"] == "rank 5 on gpu-node-2 (not_entered)"
    assert "7 rank(s) waiting for rank 5 on gpu-node-2 (not_entered)" in alert["annotations"]["description"]


def test_the_page_resolves_when_the_rank_comes_back(notifications):
    _, payloads = notifications
    resolved = [p for p in payloads if p["status"] == "resolved"]
    assert len(resolved) == 1 and [a["labels"]["alertname"] for a in resolved[0]["alerts"]] == ["FabricNcclHang"]
