"""Two "nodes" on one kernel (network, PID and mount namespaces joined by veth pairs), each
with its own exporter scoped to its PID namespace, the fake libnccl's ranks synchronising
over the veth network, one real Prometheus per clock skew of the second node evaluating
the mixin: the straggler rank, the late node and the hang's culprit are named on the right
node whatever that node's clock says (bench/device/nccl_multinode.py, the harness the GPU
host runs too).

About 2 minutes of wall time, most of it waiting: rendering the mixin (~20 s here), the
exporters attaching, and each fault held until its alert fires under shortened rule
windows (10 s) and `for:` (seconds), so one run covers the scoping, three faults and two
clock skews against real Prometheus servers; each fault would be its own run otherwise.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import could_not_run, require_tool

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "bench" / "device" / "nccl_multinode.py"
# The production thresholds; windows, rule intervals and `for:` shortened so that each
# fault fires within seconds (the production ones are what the device run measures).
OVERRIDES = {"intervals": {"nccl": "2s"}, "for": {"straggler": "4s", "ncclHang": "2s"},
             "windows": {"ncclLag": "10s", "ncclNodeOffset": "10s", "ncclClockOffsetSettle": "15s"}, "thresholds": {"ncclHangMinElapsedSeconds": 3}}
SKEWS_MS = ("-50", "50")
# A third Prometheus sees node-b's clock drift from 0 at 200 ppm (0.2 ms more every second):
# its offset estimate goes stale, so node-b must never be named wrongly there.
DRIFT = "d200"
# Alert latency of real processes: run after the parallel pass, alone (Makefile).
pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root: namespaces, veth pairs and uprobes")
    from fabricscope.exporter.bpf_loader import objects, reasons

    problem = reasons.preflight()
    if problem:
        pytest.skip(f"eBPF unavailable here: {problem[1]}")
    ok, output = objects.build()
    if not ok:
        could_not_run(f"cannot build the BPF objects: {output[-300:]}")
    prometheus = require_tool("prometheus")
    out = tmp_path_factory.mktemp("multinode")
    done = subprocess.run([sys.executable, str(HARNESS), "--backend", "fake", "--plan", "test",
                           "--skews-ms=" + ",".join(SKEWS_MS + (DRIFT,)), "--boundary-ops", "256", "--overrides",
                           json.dumps(OVERRIDES), "--prometheus", prometheus, "--out", str(out)],
                          capture_output=True, text=True, timeout=400)
    log = done.stdout[-4000:] + done.stderr[-2000:]
    if not (out / "nccl_multinode.json").is_file():
        pytest.fail(f"the harness wrote no results: {log}")
    results = json.loads((out / "nccl_multinode.json").read_text())
    if "uprobes unavailable" in json.dumps(results.get("node_logs", {})):
        could_not_run(f"NCCL uprobes could not load in a node: {results['node_logs']}")
    assert done.returncode == 0 and "error" not in results, log
    return results, log


def faults(results: dict, kind: str) -> list[dict]:
    return [r for p in results["phases"] if p["fault"] and p["fault"]["kind"] == kind for r in p["repeats"]]


def test_each_exporter_sees_only_its_own_nodes_ranks(run):
    results, _ = run
    assert results["exporter_sees"] == {"node-a": ["0", "1"], "node-b": ["2", "3"]}


def test_nothing_is_flagged_without_a_fault(run):
    results, log = run
    assert all(not flags for flags in results["summary"]["false_flags"].values()), log


@pytest.mark.parametrize("kind, alert, rank", [("rank", "FabricNcclStragglerRank", "3"),
                                               ("node", "FabricNcclStragglerNode", None)])
def test_the_late_rank_or_node_is_named_on_its_node_at_every_skew(run, kind, alert, rank):
    results, log = run
    [record] = faults(results, kind)
    for skew in SKEWS_MS:
        seen = record["skews"][str(float(skew))]
        assert seen["firing_after_s"] is not None, log
        assert {"alert": alert, "node": "node-b", "rank": rank, "state": "firing"} in seen["named"], log
        assert seen["wrong"] == [], log


def test_the_hang_page_names_the_stopped_rank_and_its_node_at_every_skew(run):
    results, log = run
    [record] = faults(results, "hang")
    for skew in SKEWS_MS:
        seen = record["skews"][str(float(skew))]
        assert seen["culprit"] == "rank 3 on node-b (not_entered)", log
        assert seen["wrong"] == [], log


def test_a_drifting_clock_never_names_a_node_wrongly(run):
    results, log = run
    for phase in results["phases"]:
        records = phase.get("repeats", []) or []
        for record in records:
            assert record["skews"]["drift200ppm"]["wrong"] == [], log
    assert results["summary"]["false_flags"]["drift200ppm"] == [], log


def test_the_rules_measure_the_skew_within_the_late_node_floor(run):
    results, log = run
    for skew in SKEWS_MS:
        assert abs(results["clock_estimates"][str(float(skew))]["error_ms"]) < 2.0, log
