"""Synthetic inference spans for the demo: requests that cross the simulated cluster.

Each request enters on one GPU node, crosses a leaf switch and is served on another node
(network_path [src, ib-leaf-k, dst]). Its latency is a healthy lognormal around 700 ms,
plus 2–3.5 s while a fault is active on a node of its path (the request waits on the
congested port, the stalled collective, the flapping link), so SLO violations line up
with the demo's faults and the sidecar's correlations appear on their own. Job-level
faults (a straggler or hung rank) count against the node hosting that rank.
"""
from __future__ import annotations

import math
import random
import uuid
from typing import Any

SERVICE = "llm-inference"
OPERATION = "generate"
HEALTHY_MEDIAN_MS = 700.0
FAULT_PENALTY_MS = (2000.0, 3500.0)


def nodes_under_fault(scenario, now: float) -> set[str]:
    nodes = set()
    for fault in scenario.active_faults(now):
        if fault.node is not None:
            nodes.add(fault.node)
        elif "rank" in fault.target:
            nodes.add(scenario.node_name(int(fault.target["rank"]) // scenario.gpus_per_node))
    return nodes


class SyntheticSpans:
    def __init__(self, scenario, seed: int | None = None) -> None:
        self.scenario = scenario
        self.rng = random.Random(scenario.seed if seed is None else seed)

    def path(self) -> list[str]:
        nodes = self.scenario.nodes
        src = self.rng.randrange(nodes)
        leaf = f"ib-leaf-{src % 2}"
        if nodes == 1:
            return [self.scenario.node_name(src), leaf]
        dst = self.rng.choice([i for i in range(nodes) if i != src])
        return [self.scenario.node_name(src), leaf, self.scenario.node_name(dst)]

    def batch(self, scenario_now: float, wall_ms: int, count: int) -> list[dict[str, Any]]:
        """`count` spans ending around `wall_ms`, with latencies for scenario time `scenario_now`."""
        faulty = nodes_under_fault(self.scenario, scenario_now)
        spans = []
        for _ in range(count):
            path = self.path()
            duration = self.rng.lognormvariate(math.log(HEALTHY_MEDIAN_MS), 0.2)
            if faulty.intersection(path):
                duration += self.rng.uniform(*FAULT_PENALTY_MS)
            end = wall_ms - self.rng.randrange(0, 1000)
            spans.append({"trace_id": uuid.UUID(int=self.rng.getrandbits(128)).hex,
                          "span_id": f"{self.rng.getrandbits(64):016x}", "service": SERVICE,
                          "operation": OPERATION, "start_time_ms": int(end - duration), "end_time_ms": end,
                          "duration_ms": round(duration, 3), "network_path": path,
                          "attributes": {"model": "llama-3-70b", "request_tokens": self.rng.randrange(128, 4096),
                                         "response_tokens": self.rng.randrange(16, 1024)}})
        return spans
