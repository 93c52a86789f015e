"""Live enrichment: the exporters' own metrics, merged over the inventory.

What the metrics say wins over what the inventory says:
- InfiniBand/RoCE port states (`fabric_infiniband_port_state{node, device, port, state}`):
  a port that is not ACTIVE takes its link down in both directions.
- NVLink (`fabric_nvlink_remote_links{node, gpu, remote_pci_bus_id, remote_type, state}`:
  the exporter's count of a GPU's links to each remote end, by state, from the same sample
  as its per-link `fabric_nvlink_state` and `_info`): the GPU's edge to each NVSwitch (or
  peer GPU) it reaches is up while any of its links there is active; an edge the inventory
  lacks is added; an edge no series reports (the node's series vanished) keeps the
  inventory's state. One query of the per-edge counts, not of every link: at 1,000 8-GPU
  nodes 32,000 rows, where every link's state or info is 144,000 series that a store takes
  1.5-3 s to read whatever it returns (docs/scale.md). A node whose exporter predates that
  count reports no edges: they keep the inventory's state.
- NCCL communicators -> jobs: `fabric_nccl_rank_info{comm, rank, gpu, job_id, node}` where the
  exporter knows each rank's GPU; otherwise `fabric_nccl_comm_info{comm, rank, node}` (only
  of communicators no rank_info describes, filtered on the engine), where a rank's GPU is
  taken to be the host's GPU whose index is the rank's position among the communicator's
  ranks on that host (the LOCAL_RANK = CUDA device convention of torchrun and the demo). A
  job named like an inventory job replaces it.

The Prometheus client is not imported here: callers pass `query`, any callable that runs
an instant query and returns the API's `data.result` list ({"metric": {...}, "value": [t, v]})
or samples with `.labels` and `.value`. The sidecar passes its own client's `query`.

LiveTopology keeps the current engine: each refresh rebuilds the inventory, merges the
metrics, and swaps in a new compact form only when the version changed.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Mapping, Sequence

from fabricscope.exporter.nvml.remotes import ACTIVE as NVLINK_ACTIVE, INACTIVE as NVLINK_INACTIVE

from .blast import BlastRadiusEngine
from .model import Job, Rank, Topology

log = logging.getLogger("fabricscope.chaos.live")

InstantQuery = Callable[[str], Sequence]
ACTIVE_PORT_STATES = frozenset({"ACTIVE", "ACTIVE_DEFER"})
NVLINK_PARTITION = "nvlink"
QUERIES = {
    "port_state": "fabric_infiniband_port_state",
    # Per NVLink edge its active links (every edge) and inactive ones (only where there are
    # some); summed to the labels read, so the answer carries no scrape labels.
    "nvlink_links": "sum by (node, gpu, remote_pci_bus_id, state) (fabric_nvlink_remote_links)",
    "rank_info": "fabric_nccl_rank_info",
    "comm_info": 'fabric_nccl_comm_info unless on (comm) fabric_nccl_rank_info{node!="", rank=~"[-+]?[0-9]+"}',
}
# The metrics those queries read (what a store must hold for the merge).
METRICS = ("fabric_infiniband_port_state", "fabric_nvlink_remote_links", "fabric_nccl_rank_info",
           "fabric_nccl_comm_info")


def comm_job_name(comm: str) -> str:
    """The job name of an NCCL communicator that no `job` label names."""
    return f"nccl-{comm}"


@lru_cache(maxsize=65536)
def _bus(bus_id: str) -> str:
    """PCI bus ids compare without the domain width or case: 00000000:C0:00.0 == 0000:c0:00.0.
    (Cached: a fleet's NVLink series name the same few dozen bus ids over and over.)"""
    parts = bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return bus_id.strip().lower()
    try:
        return f"{int(parts[0], 16):x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return bus_id.strip().lower()


@dataclass
class Observations:
    port_up: dict[tuple[str, str, int], bool] = field(default_factory=dict)            # (node, device, port)
    # (node, gpu, remote_pci_bus_id as exported) -> (links, active links)
    nvlink: dict[tuple[str, int, str], tuple[int, int]] = field(default_factory=dict)
    ranks: dict[str, list[tuple[int, str, int | None]]] = field(default_factory=dict)  # job -> (rank, node, gpu)


def _labels(result: Sequence) -> Iterable[tuple[dict, float]]:
    """(labels, value) of each series: API result items ({"metric", "value": [t, v]}) or
    sample objects with `.labels` and `.value` (the sidecar client's)."""
    for series in result:
        try:
            # A plain dict (a decoded API answer) first: isinstance() against the abstract
            # Mapping costs more than the rest of the loop at 300k series.
            if type(series) is dict or isinstance(series, Mapping):
                metric, value = series.get("metric") or {}, float(series["value"][1])
            else:
                metric, value = series.labels, float(series.value)
        except (AttributeError, KeyError, IndexError, TypeError, ValueError):
            continue
        if type(metric) is dict or isinstance(metric, Mapping):
            yield metric, value


def _int(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def observe(query: InstantQuery) -> Observations:
    """Read the metrics above (parsing only; nothing is applied to a topology)."""
    obs = Observations()
    for m, _ in _labels(query(QUERIES["port_state"])):
        port = _int(m.get("port"))
        if m.get("node") and m.get("device") and port is not None and m.get("state"):
            obs.port_up[(m["node"], m["device"], port)] = m["state"] in ACTIVE_PORT_STATES
    obs.nvlink = observe_nvlinks(query)
    described = set()
    for m, _ in _labels(query(QUERIES["rank_info"])):
        rank, gpu = _int(m.get("rank")), _int(m.get("gpu"))
        if rank is None or not m.get("node") or not m.get("comm"):
            continue
        job = m.get("job_id") or comm_job_name(m["comm"])
        obs.ranks.setdefault(job, []).append((rank, m["node"], gpu))
        described.add(m["comm"])
    by_comm: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for m, _ in _labels(query(QUERIES["comm_info"])):
        rank = _int(m.get("rank"))
        if rank is not None and m.get("node") and m.get("comm") and m["comm"] not in described:
            by_comm[m["comm"]].append((rank, m["node"]))
    for comm, ranks in by_comm.items():
        per_host: dict[str, list[int]] = defaultdict(list)
        for rank, node in ranks:
            per_host[node].append(rank)
        local = {(node, r): i for node, rs in per_host.items() for i, r in enumerate(sorted(set(rs)))}
        obs.ranks[comm_job_name(comm)] = [(rank, node, local[(node, rank)]) for rank, node in sorted(set(ranks))]
    return obs


def observe_nvlinks(query: InstantQuery) -> dict[tuple[str, int, str], tuple[int, int]]:
    """(node, gpu, remote bus) -> (links, active links) of each NVLink edge."""
    edges: dict[tuple[str, int, str], list[int]] = {}
    for m, value in _labels(query(QUERIES["nvlink_links"])):
        gpu, state = _int(m.get("gpu")), m.get("state")
        if not m.get("node") or gpu is None or state not in (NVLINK_ACTIVE, NVLINK_INACTIVE) or not value >= 0:
            continue                                 # (not >= 0: NaN too)
        counts = edges.setdefault((m["node"], gpu, m.get("remote_pci_bus_id", "")), [0, 0])
        counts[0] += int(value)
        if state == NVLINK_ACTIVE:
            counts[1] += int(value)
    return {edge: (links, active) for edge, (links, active) in edges.items()}


class DeviceIndex:
    """Topology devices by what the exporters' labels call them: (node, ib_device),
    (node, netdev), (node, GPU index), (node, PCI bus id)."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.by_ib: dict[tuple[str, str], str] = {}
        self.by_netdev: dict[tuple[str, str], str] = {}
        self.gpus: dict[tuple[str, int], str] = {}
        self.buses: dict[tuple[str, str], str] = {}
        for name, data in topology.graph.nodes(data=True):
            host, attrs = data["host"], data["attrs"]
            if host is None:
                continue
            if "ib_device" in attrs:
                self.by_ib[(host, attrs["ib_device"])] = name
            if "netdev" in attrs:
                self.by_netdev[(host, attrs["netdev"])] = name
            if data["kind"] == "gpu" and "index" in attrs:
                self.gpus[(host, int(attrs["index"]))] = name
            if "pci_bus_id" in attrs:
                self.buses[(host, _bus(str(attrs["pci_bus_id"])))] = name

    def device_for_labels(self, labels: Mapping[str, str]) -> str | None:
        """The most specific device a series or alert names: an HCA/NIC (node + device or
        interface), a GPU (node + gpu), the host (node), or a device named outright."""
        node, device = labels.get("node"), labels.get("device")
        if node:
            if device and (node, device) in self.by_ib:
                return self.by_ib[(node, device)]
            for key in ("interface", "netdev", "device"):
                if labels.get(key) and (node, labels[key]) in self.by_netdev:
                    return self.by_netdev[(node, labels[key])]
            gpu = _int(labels.get("gpu"))
            if gpu is not None and (node, gpu) in self.gpus:
                return self.gpus[(node, gpu)]
        if device and device in self.topology:
            return device
        if node and node in self.topology:
            return node
        return None


@dataclass
class ApplyReport:
    ports: int = 0
    nvlinks: int = 0
    nvlinks_added: int = 0
    jobs: int = 0
    unmatched: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"ports": self.ports, "nvlinks": self.nvlinks, "nvlinks_added": self.nvlinks_added,
                "jobs": self.jobs, "unmatched": self.unmatched[:20], "unmatched_count": len(self.unmatched)}


def apply(topology: Topology, obs: Observations) -> ApplyReport:
    """Merge observations into `topology` in a fixed order (so equal observations give an
    equal version). Things the topology cannot place are listed in the report, not guessed."""
    report = ApplyReport()
    graph = topology.graph
    index = DeviceIndex(topology)
    by_ib, gpus, buses = index.by_ib, index.gpus, index.buses
    for (node, device, port), up in sorted(obs.port_up.items()):
        name = by_ib.get((node, device))
        links = [] if name is None else [b for b, d in graph.succ[name].items()
                                         if d["kind"] in ("infiniband", "ethernet") and d["port"] in (port, None)]
        if not links:
            report.unmatched.append(f"port {node}/{device}:{port}")
            continue
        for other in links:
            topology.set_link_state(name, other, "up" if up else "down")
            topology.set_link_state(other, name, "up" if up else "down")
        report.ports += 1
    edges: dict[tuple[str, str], bool] = {}
    for (node, gpu, bus), (links, active) in sorted(obs.nvlink.items()):
        name = gpus.get((node, gpu))
        remote = buses.get((node, _bus(bus))) if bus else None
        if name is None or remote is None:
            report.unmatched.append(f"nvlink {node}/gpu{gpu} -> {bus or '?'} ({links} links)")
            continue
        edges[(name, remote)] = edges.get((name, remote), False) or active > 0
    for (gpu, remote), up in sorted(edges.items()):
        state = "up" if up else "down"
        if not graph.has_edge(gpu, remote):
            topology.add_link(gpu, remote, "nvlink", partition=NVLINK_PARTITION, state=state)
            report.nvlinks_added += 1
        else:
            topology.set_link_state(gpu, remote, state)
            topology.set_link_state(remote, gpu, state)
        report.nvlinks += 1
    for job, ranks in sorted(obs.ranks.items()):
        members = []
        for rank, node, gpu in sorted(ranks, key=lambda r: r[0]):
            if node not in topology:
                report.unmatched.append(f"job {job} rank {rank} on unknown host {node}")
                continue
            members.append(Rank(rank, gpus.get((node, gpu)) if gpu is not None else None, node))
        if not members:
            continue
        topology.add_job(Job(job, members, source="prometheus"), replace=True)
        report.jobs += 1
    return report


def enrich(topology: Topology, query: InstantQuery) -> ApplyReport:
    """observe() then apply(): the live state merged over `topology` (mutated in place)."""
    return _apply_logged(topology, observe(query))


def _apply_logged(topology: Topology, obs: Observations) -> ApplyReport:
    report = apply(topology, obs)
    if report.unmatched:
        log.info("live topology: %d observations matched no device (first: %s)", len(report.unmatched),
                 report.unmatched[0])
    return report


class LiveTopology:
    """The topology simulations run on: `base()` (the inventory) merged with the live
    metrics on every refresh(). Readers get the current engine without locking; a refresh
    builds the next one aside and swaps it in whole."""

    def __init__(self, base: Callable[[], Topology], query: InstantQuery | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._base = base
        self._query = query
        self._clock = clock
        self._lock = threading.Lock()
        self._engine: BlastRadiusEngine | None = None
        self.refreshed_at: float | None = None
        self.live_error: str | None = None
        self.report: ApplyReport | None = None

    def engine(self) -> BlastRadiusEngine:
        engine = self._engine
        return engine if engine is not None else self.refresh()

    def refresh(self, merge_live: bool = True) -> BlastRadiusEngine:
        """Rebuild from the inventory (and the metrics, unless merge_live is False)."""
        with self._lock, ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-observe") as pool:
            # The queries are asked while the inventory is built: they wait on the engine,
            # the inventory on this process (at 1,000 nodes against a Prometheus of the
            # merged metrics, 1.3 s and 1.4 s: docs/scale.md).
            observing = pool.submit(observe, self._query) if self._query is not None and merge_live else None
            topology = self._base()
            if observing is not None:
                try:
                    self.report = _apply_logged(topology, observing.result())
                    self.live_error = None
                except Exception as exc:  # noqa: BLE001 - Prometheus down: keep simulating on what we had
                    # Shown to API clients: a metrics error's public wording, which names no
                    # internal address (the log keeps the full one).
                    self.live_error = f"{type(exc).__name__}: {getattr(exc, 'public_message', None) or exc}"
                    log.warning("live topology refresh failed, keeping version %s: %s: %s",
                                self._engine.version if self._engine else "(inventory)", type(exc).__name__, exc)
                    if self._engine is not None:
                        return self._engine
            if self._engine is None or self._engine.version != topology.version:
                self._engine = BlastRadiusEngine(topology)
            self.refreshed_at = self._clock()
            return self._engine

    def status(self) -> dict:
        engine = self._engine
        return {"version": engine.version if engine else None,
                "summary": engine.topology.summary() if engine else None,
                "refreshed_at": self.refreshed_at, "live": self._query is not None,
                "live_error": self.live_error, "live_report": self.report.to_dict() if self.report else None}
