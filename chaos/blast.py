"""Blast radius: what a failure takes down, which jobs it cuts, and the impact score.

    engine = BlastRadiusEngine(topology)          # compact form built once per version
    result = engine.simulate("leaf-su0-r3", "switch_failure")
    result.impact_score, result.affected_jobs, result.path

Failure types (seed §14.5):
- device_failure (default): the device goes offline (a server takes its GPUs, HCAs and
  NICs with it).
- power_failure: the device's power domain fails: every PDU feeding it (or the PDU
  itself); devices that lose all their feeds go dark.
- rack_failure: every device in the device's rack (or the named rack).
- switch_failure: a switch goes offline; endpoints downstream that lose all their paths
  are cut off (a host dual-homed to two leaves survives one).
In every case, surviving devices that lose connectivity in a partition they were
connected in are affected too (see compact.py for the traversal).

impact_score = 0.4 * affected_devices / total_devices + 0.6 * affected_jobs / total_active_jobs
"""
from __future__ import annotations

import bisect
import difflib
import re
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .compact import CompactTopology
from .model import LINK_KINDS, SWITCH_KINDS, Topology

FAILURE_TYPES = ("device_failure", "power_failure", "rack_failure", "switch_failure")
DEVICE_WEIGHT, JOB_WEIGHT = 0.4, 0.6
SUGGESTION_WINDOW = 200
MAX_WORDS = 4
MAX_PATH = 10_000          # a whole-cluster failure lists the first 10k steps, says it cut the rest


class ChaosInputError(ValueError):
    """A simulation request that names something the topology does not have.
    `field` is the request field at fault; `choices` the valid values (or close matches)."""

    def __init__(self, field: str, message: str, choices: list[str] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.choices = choices or []


def impact_score(affected_devices: int, total_devices: int, affected_jobs: int, total_active_jobs: int) -> float:
    devices = affected_devices / total_devices if total_devices else 0.0
    jobs = affected_jobs / total_active_jobs if total_active_jobs else 0.0
    return DEVICE_WEIGHT * devices + JOB_WEIGHT * jobs


def close_device_names(topology: Topology, device: str, n: int = 5) -> list[str]:
    """Names of the topology close to an unknown `device`; never empty while the topology
    has devices. First the names sorted next to it (a typo past the first characters lands
    beside the intended name: the same cost on 300k devices as on 30); then the names that
    share a word with it (a typo in the first characters, or the words in another order);
    last the names it sorts between."""
    names = topology.sorted_names()
    at = bisect.bisect_left(names, device)
    neighbourhood = names[max(0, at - SUGGESTION_WINDOW):at + SUGGESTION_WINDOW]
    close = difflib.get_close_matches(device, neighbourhood, n=n, cutoff=0.6)
    if not close:
        # A few words, each scanned once: a hostile name of many words costs no more than
        # a real one (the scan is linear in the topology).
        words = list(dict.fromkeys(w for w in re.split(r"[^a-z0-9]+", device.lower()) if len(w) >= 3))[:MAX_WORDS]
        sharing = [name for name in names if any(w in name.lower() for w in words)][:SUGGESTION_WINDOW * 25]
        close = difflib.get_close_matches(device, sharing, n=n, cutoff=0.4)
    return close or names[max(0, at - n // 2):max(0, at - n // 2) + n]


def unknown_device(topology: Topology, device: str) -> ChaosInputError:
    close = close_device_names(topology, device)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    return ChaosInputError("device", f"unknown device {device!r} (the topology has {len(topology)} devices"
                                     f"{hint})", close)


def initial_failures(topology: Topology, device: str, failure_type: str) -> list[str]:
    """The devices that fail first for this failure type (ChaosInputError if it cannot apply)."""
    if failure_type not in FAILURE_TYPES:
        raise ChaosInputError("failure_type", f"unknown failure_type {failure_type!r} "
                                              f"(valid: {', '.join(FAILURE_TYPES)})", list(FAILURE_TYPES))
    if failure_type == "rack_failure":
        rack = device if device in topology.racks else None
        if rack is None:
            if device not in topology:
                raise unknown_device(topology, device)
            rack = topology.graph.nodes[device]["rack"]
            if rack is None:
                raise ChaosInputError("device", f"device {device!r} is in no rack, so rack_failure cannot apply "
                                                f"(valid failure types for it: device_failure"
                                                f"{', power_failure' if topology.power_feeds(device) else ''})")
        return sorted(topology.racks[rack])
    if device not in topology:
        raise unknown_device(topology, device)
    kind = topology.kind(device)
    if failure_type == "switch_failure" and kind not in SWITCH_KINDS:
        raise ChaosInputError("device", f"device {device!r} is a {kind}, not a switch: switch_failure needs one of "
                                        f"the kinds {', '.join(sorted(SWITCH_KINDS))}", sorted(SWITCH_KINDS))
    if failure_type == "power_failure":
        if kind == "pdu":
            return [device]
        feeds = topology.power_feeds(device)
        if not feeds:
            host = topology.graph.nodes[device]["host"]
            feeds = topology.power_feeds(host) if host is not None else []
        if not feeds:
            raise ChaosInputError("device", f"device {device!r} has no power feed in the topology, so "
                                            f"power_failure cannot apply (use device_failure)")
        return sorted(feeds)
    return [device]


@dataclass
class BlastResult:
    device: str
    failure_type: str
    topology_version: str
    impact_score: float
    affected_devices: list[str]
    affected_device_count: int
    total_devices: int
    affected_jobs: list[str] | None
    affected_job_count: int
    total_active_jobs: int
    removed_devices: list[str]
    disconnected_devices: dict[str, list[str]]     # device -> partitions it lost
    path: list[dict]                              # BFS order: {device, via, reason}
    path_truncated: bool = False
    affected_by_kind: dict[str, int] = field(default_factory=dict)
    elapsed_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class BlastRadiusEngine:
    """One topology version and its compact form; simulate() is safe to call from many
    threads at once (it reads the arrays, never writes them)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.compact = CompactTopology(topology)

    @property
    def version(self) -> str:
        return self.compact.version

    def simulate(self, device: str, failure_type: str = "device_failure", include_jobs: bool = True) -> BlastResult:
        began = time.perf_counter()
        first = initial_failures(self.topology, device, failure_type)
        c = self.compact
        outcome = c.simulate(np.array([c.index[d] for d in first], dtype=np.int32))
        names = c.names
        removed, cut = outcome.removed.tolist(), outcome.cut_devices.tolist()
        # Partition names once per distinct bitmask (a whole-cluster failure has few).
        masks = outcome.cut_lost.tolist()
        lost_of = {m: [p for k, p in enumerate(c.partitions) if m >> k & 1] for m in set(masks)}
        disconnected = {names[d]: lost_of[m] for d, m in zip(cut, masks)}
        # The path: removals in the order they went down, then the cut-off devices in BFS
        # order, each with the device it hung from. Built only as far as it is returned.
        reason_of_first = {"rack_failure": "rack", "power_failure": "power_domain"}.get(failure_type, "failed")
        path: list[dict] = []
        for dev, cause, reason in zip(removed[:MAX_PATH], outcome.removed_cause.tolist(), outcome.removed_reason):
            path.append({"device": names[dev], "via": None if cause < 0 else names[cause],
                         "reason": reason_of_first if reason == "failed" else reason})
        room = MAX_PATH - len(path)
        for dev, cause, kind, mask in zip(cut[:room], outcome.cut_cause.tolist(), outcome.cut_link_kind.tolist(),
                                          masks):
            path.append({"device": names[dev], "via": names[cause],
                         "reason": f"lost {', '.join(lost_of[mask])} ({LINK_KINDS[kind]} link)"})
        affected_index = c.sorted_by_name(np.concatenate([outcome.removed, outcome.cut_devices]))
        affected = [names[d] for d in affected_index.tolist()]
        by_kind = c.count_kinds(affected_index)
        jobs = [c.job_names[j] for j in outcome.affected_jobs.tolist()]
        total_jobs = len(c.job_names)
        score = impact_score(len(affected), c.n, len(jobs), total_jobs)
        return BlastResult(
            device=device, failure_type=failure_type, topology_version=c.version, impact_score=score,
            affected_devices=affected, affected_device_count=len(affected), total_devices=c.n,
            affected_jobs=sorted(jobs) if include_jobs else None, affected_job_count=len(jobs),
            total_active_jobs=total_jobs, removed_devices=[names[d] for d in removed], disconnected_devices=disconnected,
            path=path, path_truncated=len(removed) + len(cut) > MAX_PATH, affected_by_kind=by_kind,
            elapsed_seconds=time.perf_counter() - began)
