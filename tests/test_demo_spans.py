"""The demo's synthetic spans: paths cross the cluster, and only requests whose path
crosses a node under an active fault run over the 2 s SLO."""
from __future__ import annotations

from fabricscope.demo.scenario import load_scenario
from fabricscope.demo.spans import SyntheticSpans, nodes_under_fault

SCENARIO = {"seed": 3, "cluster": {"name": "s", "nodes": 4, "gpus_per_node": 8, "hcas_per_node": 1},
            "tick_seconds": 1,
            "faults": [{"kind": "microburst", "node": 1, "at": 100, "duration": 50},
                       {"kind": "straggler_rank", "at": 200, "duration": 50, "target": {"rank": 27}}]}


def test_faulted_nodes_follow_the_timeline_and_ranks_map_to_their_node():
    scenario = load_scenario(SCENARIO)
    assert nodes_under_fault(scenario, 50) == set()
    assert nodes_under_fault(scenario, 120) == {"gpu-node-1"}
    assert nodes_under_fault(scenario, 220) == {"gpu-node-3"}      # rank 27 / 8 GPUs per node


def test_only_paths_across_a_fault_violate_the_slo():
    scenario = load_scenario(SCENARIO)
    source = SyntheticSpans(scenario)
    healthy = source.batch(50, 1_800_000_000_000, 200)
    assert all(s["duration_ms"] < 2000 for s in healthy)
    during = source.batch(120, 1_800_000_000_000, 400)
    crossing = [s for s in during if "gpu-node-1" in s["network_path"]]
    clear = [s for s in during if "gpu-node-1" not in s["network_path"]]
    assert crossing and clear
    assert all(s["duration_ms"] > 2000 for s in crossing)
    assert all(s["duration_ms"] < 2000 for s in clear)
    span = during[0]
    assert len(span["network_path"]) == 3 and span["network_path"][1].startswith("ib-leaf-")
    assert span["end_time_ms"] - span["start_time_ms"] == int(span["duration_ms"]) or \
        abs(span["end_time_ms"] - span["start_time_ms"] - span["duration_ms"]) <= 1
