"""The topology model: devices, directed links with state, partitions, power feeds, jobs.

networkx is the model (readable, easy to build and to test); the hot traversal runs on
the compact form derived from it (compact.py), built once per topology version.

Shape of the graph (an nx.DiGraph):
- a node per device, attributes `kind`, `rack`, `host` (the server housing a component:
  a GPU, HCA, NIC or in-host NVSwitch fails with its server), `partitions` (explicit
  VLAN/partition membership, or None: member of every partition its links carry, as a
  switch trunk is), `anchor` (an explicit root of its partitions' connectivity) and
  free-form `attrs` (e.g. `pci_bus_id`).
- a physical link is two directed edges, each with its own `state` ("up"/"down"): a
  transmit lane can die while the other keeps working. Edge attributes: `kind`
  (nvlink, infiniband, ethernet, pcie), `partition` (the VLAN / IB partition the link
  carries; traffic never changes partition along a path), `port` (local port number).
- a power feed is one edge PDU -> device of kind `power`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import networkx as nx

DEVICE_KINDS = ("gpu_server", "gpu", "hca", "nic", "nvswitch", "leaf_switch", "spine_switch", "core_switch",
                "storage_server", "server", "pdu")
SWITCH_KINDS = frozenset({"nvswitch", "leaf_switch", "spine_switch", "core_switch"})
LINK_KINDS = ("nvlink", "infiniband", "ethernet", "pcie")
LINK_STATES = ("up", "down")
POWER = "power"
DEFAULT_PARTITION = "default"

# Where a device sits in a fat tree. Unless a partition names its anchors explicitly, the
# devices of the highest tier present in it are the roots every other member must stay
# connected to (the core of a fabric, the NVSwitches of an NVLink domain).
TIER = {"core_switch": 3, "spine_switch": 2, "leaf_switch": 1, "nvswitch": 1}


class TopologyError(ValueError):
    """A topology that cannot be built as asked (unknown device, bad kind, duplicate)."""


@dataclass(frozen=True)
class Rank:
    rank: int
    gpu: str | None      # device name of the GPU; None when only the host is known
    host: str


@dataclass
class Job:
    name: str
    ranks: list[Rank] = field(default_factory=list)
    active: bool = True
    source: str = "inventory"

    def devices(self) -> set[str]:
        """The devices whose loss cuts this job: every rank's GPU and host."""
        out = set()
        for rank in self.ranks:
            out.add(rank.host)
            if rank.gpu is not None:
                out.add(rank.gpu)
        return out


@dataclass(frozen=True)
class Neighbor:
    """A device one edge away: what it is, the edge's kind and partition, and whether every
    direction of the edge is up."""
    peer: str
    kind: str
    link_kind: str
    partition: str
    up: bool


class Topology:
    """A cluster's devices, links, power feeds, racks and jobs.

    `version` is a digest of every mutation in order, so two topologies built the same
    way share a version and any change (a link going down) gives a new one; the compact
    form and every simulation result carry it.
    """

    def __init__(self, name: str = "cluster") -> None:
        self.name = name
        self.graph = nx.DiGraph()
        self.jobs: dict[str, Job] = {}
        self.racks: dict[str, set[str]] = {}
        self._digest = hashlib.blake2b(name.encode(), digest_size=8)
        self._version: str | None = None
        self._sorted_names: tuple[str, list[str]] | None = None

    # ---- building -----------------------------------------------------------------------
    def _changed(self, *parts: object) -> None:
        self._digest.update(repr(parts).encode())
        self._version = None

    @property
    def version(self) -> str:
        if self._version is None:
            self._version = self._digest.copy().hexdigest()
        return self._version

    def add_device(self, name: str, kind: str, *, rack: str | None = None, host: str | None = None,
                   partitions: Iterable[str] | None = None, anchor: bool = False, **attrs) -> None:
        if kind not in DEVICE_KINDS:
            raise TopologyError(f"device {name!r}: unknown kind {kind!r} (valid: {', '.join(DEVICE_KINDS)})")
        if name in self.graph:
            raise TopologyError(f"device {name!r} is defined twice")
        if name in self.racks:
            raise TopologyError(f"device {name!r} has the name of a rack")
        if host is not None and host not in self.graph:
            raise TopologyError(f"device {name!r}: its host {host!r} is not defined (define the host first)")
        parts = None if partitions is None else frozenset(partitions)
        self.graph.add_node(name, kind=kind, rack=rack, host=host, partitions=parts, anchor=bool(anchor),
                            attrs=attrs)
        if rack is not None:
            if rack in self.graph:
                raise TopologyError(f"rack {rack!r} has the name of a device")
            self.racks.setdefault(rack, set()).add(name)
        self._changed("d", name, kind, rack, host, None if parts is None else sorted(parts), anchor,
                      sorted(attrs.items()))

    def _require(self, name: str, what: str) -> None:
        if name not in self.graph:
            raise TopologyError(f"{what}: unknown device {name!r}")

    def add_link(self, a: str, b: str, kind: str, *, partition: str = DEFAULT_PARTITION, state: str = "up",
                 reverse_state: str | None = None, a_port: int | None = None, b_port: int | None = None) -> None:
        """A physical link a<->b: edge a->b in `state`, b->a in `reverse_state` (default: same)."""
        self._require(a, f"link {a}-{b}")
        self._require(b, f"link {a}-{b}")
        if a == b:
            raise TopologyError(f"link {a}-{b}: a device cannot link to itself")
        if kind not in LINK_KINDS:
            raise TopologyError(f"link {a}-{b}: unknown kind {kind!r} (valid: {', '.join(LINK_KINDS)})")
        reverse_state = state if reverse_state is None else reverse_state
        for s in (state, reverse_state):
            if s not in LINK_STATES:
                raise TopologyError(f"link {a}-{b}: unknown state {s!r} (valid: up, down)")
        if self.graph.has_edge(a, b):
            raise TopologyError(f"link {a}-{b} is defined twice")
        self.graph.add_edge(a, b, kind=kind, partition=partition, state=state, port=a_port)
        self.graph.add_edge(b, a, kind=kind, partition=partition, state=reverse_state, port=b_port)
        self._changed("l", a, b, kind, partition, state, reverse_state, a_port, b_port)

    def add_power_feed(self, pdu: str, device: str) -> None:
        self._require(pdu, f"power feed {pdu}->{device}")
        self._require(device, f"power feed {pdu}->{device}")
        if self.graph.nodes[pdu]["kind"] != "pdu":
            raise TopologyError(f"power feed {pdu}->{device}: {pdu!r} is a {self.graph.nodes[pdu]['kind']}, not a pdu")
        if self.graph.has_edge(pdu, device) or self.graph.has_edge(device, pdu):
            raise TopologyError(f"power feed {pdu}->{device} is defined twice")
        self.graph.add_edge(pdu, device, kind=POWER, partition=None, state="up", port=None)
        self._changed("p", pdu, device)

    def set_link_state(self, a: str, b: str, state: str) -> bool:
        """Set the state of the directed edge a->b; False when there is no such link."""
        if state not in LINK_STATES:
            raise TopologyError(f"link {a}->{b}: unknown state {state!r} (valid: up, down)")
        data = self.graph.get_edge_data(a, b)
        if data is None or data["kind"] == POWER:
            return False
        if data["state"] != state:
            data["state"] = state
            self._changed("s", a, b, state)
        return True

    def add_job(self, job: Job, replace: bool = False) -> None:
        if job.name in self.jobs and not replace:
            raise TopologyError(f"job {job.name!r} is defined twice")
        for rank in job.ranks:
            self._require(rank.host, f"job {job.name!r} rank {rank.rank}")
            if rank.gpu is not None:
                self._require(rank.gpu, f"job {job.name!r} rank {rank.rank}")
        self.jobs[job.name] = job
        self._changed("j", job.name, job.active, [(r.rank, r.gpu, r.host) for r in job.ranks])

    # ---- reading ------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self.graph

    def __len__(self) -> int:
        return self.graph.number_of_nodes()

    def sorted_names(self) -> list[str]:
        """Device and rack names in order (cached per version), for near-miss suggestions."""
        if self._sorted_names is None or self._sorted_names[0] != self.version:
            self._sorted_names = (self.version, sorted([*self.graph.nodes, *self.racks]))
        return self._sorted_names[1]

    def kind(self, name: str) -> str:
        return self.graph.nodes[name]["kind"]

    def devices(self) -> Iterator[str]:
        return iter(self.graph.nodes)

    def power_feeds(self, device: str) -> list[str]:
        return [pdu for pdu, _, kind in self.graph.in_edges(device, data="kind") if kind == POWER]

    def neighbors(self, device: str) -> list[Neighbor]:
        """The devices one edge away (either direction, power feeds included), by name."""
        graph = self.graph
        found = []
        for peer in sorted(set(graph.successors(device)) | set(graph.predecessors(device))):
            edge = graph.edges[device, peer] if graph.has_edge(device, peer) else graph.edges[peer, device]
            up = all(graph.edges[a, b].get("state", "up") == "up" for a, b in ((device, peer), (peer, device))
                     if graph.has_edge(a, b))
            found.append(Neighbor(peer, graph.nodes[peer]["kind"], edge.get("kind", ""), edge.get("partition", ""), up))
        return found

    def links(self) -> Iterator[tuple[str, str, dict]]:
        """Every directed network edge (power feeds excluded)."""
        return ((a, b, d) for a, b, d in self.graph.edges(data=True) if d["kind"] != POWER)

    def active_jobs(self) -> list[Job]:
        return [job for job in self.jobs.values() if job.active]

    def memberships(self) -> dict[str, frozenset[str]]:
        """Partitions each device belongs to: its explicit list, else those of its links."""
        implied: dict[str, set[str]] = {name: set() for name in self.graph}
        for a, b, data in self.links():
            implied[a].add(data["partition"])
            implied[b].add(data["partition"])
        out = {}
        for name, node in self.graph.nodes(data=True):
            out[name] = node["partitions"] if node["partitions"] is not None else frozenset(implied[name])
        return out

    def anchors(self, memberships: dict[str, frozenset[str]] | None = None) -> dict[str, set[str]]:
        """partition -> its anchor devices: the explicit anchors among its members, else the
        members of the highest tier present (every member when the partition has no switch)."""
        memberships = self.memberships() if memberships is None else memberships
        members: dict[str, list[str]] = {}
        for name, parts in memberships.items():
            for part in parts:
                members.setdefault(part, []).append(name)
        out = {}
        nodes = self.graph.nodes
        for part, names in members.items():
            explicit = {n for n in names if nodes[n]["anchor"]}
            if explicit:
                out[part] = explicit
                continue
            top = max(TIER.get(nodes[n]["kind"], 0) for n in names)
            out[part] = {n for n in names if TIER.get(nodes[n]["kind"], 0) == top}
        return out

    def contained(self) -> dict[str, list[str]]:
        """host -> the components it houses."""
        out: dict[str, list[str]] = {}
        for name, host in self.graph.nodes(data="host"):
            if host is not None:
                out.setdefault(host, []).append(name)
        return out

    def summary(self) -> dict:
        kinds: dict[str, int] = {}
        for _, kind in self.graph.nodes(data="kind"):
            kinds[kind] = kinds.get(kind, 0) + 1
        return {"name": self.name, "version": self.version, "devices": len(self.graph),
                "links": sum(1 for _ in self.links()) // 2, "racks": len(self.racks),
                "jobs": len(self.jobs), "active_jobs": len(self.active_jobs()), "kinds": dict(sorted(kinds.items()))}
