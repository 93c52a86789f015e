"""The same blast radius as the compact form, computed with a plain BFS over the networkx
graph. It is the readable statement of the semantics and the yardstick the benchmark
measures the compact form against (bench/chaos_blast_radius.py); the tests check the two
agree, and both against brute-force reachability.
"""
from __future__ import annotations

from collections import deque

from .blast import initial_failures
from .model import POWER, Topology


class NetworkxBlastRadius:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.memberships = topology.memberships()
        self.anchors = topology.anchors(self.memberships)
        self.contained = topology.contained()
        self.baseline = self._connected(frozenset())

    def removed_by(self, failed: list[str]) -> set[str]:
        """Failed devices, their components, and devices whose every power feed is gone."""
        graph = self.topology.graph
        removed = set(failed)
        queue = deque(failed)
        while queue:
            device = queue.popleft()
            nxt = list(self.contained.get(device, ()))
            if graph.nodes[device]["kind"] == "pdu":
                for fed, kind in graph.succ[device].items():
                    if kind["kind"] == POWER and all(pdu in removed for pdu in self.topology.power_feeds(fed)):
                        nxt.append(fed)
            for other in nxt:
                if other not in removed:
                    removed.add(other)
                    queue.append(other)
        return removed

    def _reach(self, removed: frozenset[str] | set[str], adjacency) -> set[tuple[str, str]]:
        """(device, partition) states reached from the live anchors along up edges of
        `adjacency` (graph.succ: anchors reach it; graph.pred: it reaches an anchor)."""
        memberships = self.memberships
        seen: set[tuple[str, str]] = set()
        queue: deque[tuple[str, str]] = deque()
        for part, anchors in self.anchors.items():
            for anchor in anchors:
                if anchor not in removed:
                    seen.add((anchor, part))
                    queue.append((anchor, part))
        while queue:
            device, part = queue.popleft()
            for other, data in adjacency[device].items():
                if data["kind"] == POWER or data["state"] != "up" or data["partition"] != part:
                    continue
                if other in removed or part not in memberships[other]:
                    continue
                state = (other, part)
                if state not in seen:
                    seen.add(state)
                    queue.append(state)
        return seen

    def _connected(self, removed) -> set[tuple[str, str]]:
        graph = self.topology.graph
        return self._reach(removed, graph.succ) & self._reach(removed, graph.pred)

    def affected(self, device: str, failure_type: str = "device_failure") -> tuple[set[str], set[str]]:
        """(affected devices, affected active jobs)."""
        removed = self.removed_by(initial_failures(self.topology, device, failure_type))
        connected = self._connected(removed)
        cut = {d for d, p in self.baseline - connected if d not in removed}
        affected = removed | cut
        jobs = {job.name for job in self.topology.active_jobs() if job.devices() & affected}
        return affected, jobs
