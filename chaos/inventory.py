"""Inventory files (YAML or JSON) -> Topology, validated with precise errors.

The schema is documented in docs/chaos.md. Shape errors (a wrong type, an unknown key,
a bad enum value) come from pydantic; reference errors (a link to an undefined device, a
feed from something that is not a PDU, a rank on an unknown GPU) are checked here. Either
way the message names the file, the key path (`links[3].b`) and what was expected.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from fabricscope import yamlsafe
from fabricscope.exporter.parsers.files import read_file_bytes
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .generator import FatTreeSpec, generate_fat_tree
from .model import DEFAULT_PARTITION, DEVICE_KINDS, LINK_KINDS, Job, Rank, Topology, TopologyError

DeviceKind = Literal[DEVICE_KINDS]  # type: ignore[valid-type]
LinkKind = Literal[LINK_KINDS]      # type: ignore[valid-type]
State = Literal["up", "down"]
Name = Field(min_length=1, max_length=256)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceSpec(_Strict):
    name: str = Name
    kind: DeviceKind
    rack: str | None = None
    host: str | None = None                      # the server housing this component
    partitions: list[str] | None = None          # explicit VLAN/partition membership
    anchor: bool = False
    power: list[str] = []                        # PDUs feeding it
    attrs: dict[str, str | int | float | bool] = {}


class LinkSpec(_Strict):
    a: str = Name
    b: str = Name
    kind: LinkKind
    partition: str = DEFAULT_PARTITION
    state: State = "up"                          # a -> b
    reverse_state: State | None = None           # b -> a (default: state)
    a_port: int | None = Field(default=None, ge=0)
    b_port: int | None = Field(default=None, ge=0)


class RankSpec(_Strict):
    rank: int = Field(ge=0)
    gpu: str | None = None
    host: str | None = None


class JobSpec(_Strict):
    name: str = Name
    active: bool = True
    ranks: list[RankSpec] = Field(min_length=1)


class GenerateSpec(_Strict):
    """A generated rail-optimized fat tree as the base (see generator.FatTreeSpec)."""
    hosts: int = Field(ge=1, le=100_000)
    gpus_per_host: int = Field(default=8, ge=1, le=72)
    rails: int = Field(default=8, ge=1, le=64)
    hosts_per_su: int = Field(default=32, ge=1)
    hosts_per_rack: int = Field(default=4, ge=1)
    sus_per_pod: int = Field(default=16, ge=1)
    spines_per_rail: int = Field(default=2, ge=1)
    cores: int = Field(default=4, ge=1)
    nvswitches_per_host: int = Field(default=4, ge=0)
    nvl_domain_hosts: int = Field(default=1, ge=1)
    nvswitch_trays: int = Field(default=9, ge=1)
    storage_spines: int = Field(default=2, ge=1)
    storage_servers: int = Field(default=2, ge=0)
    mgmt_spines: int = Field(default=2, ge=1)
    host_prefix: str = "gpu-node-"
    job_hosts: int | None = Field(default=None, ge=1)


class Inventory(_Strict):
    version: Literal[1] = 1
    name: str = "cluster"
    generate: GenerateSpec | None = None
    devices: list[DeviceSpec] = []
    links: list[LinkSpec] = []
    jobs: list[JobSpec] = []


class InventoryError(ValueError):
    def __init__(self, source: str, location: str, message: str) -> None:
        super().__init__(f"{source}: {location}: {message}" if location else f"{source}: {message}")
        self.source, self.location, self.message = source, location, message


def _location(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_inventory(raw: Any, source: str = "<inventory>") -> Inventory:
    if not isinstance(raw, dict):
        raise InventoryError(source, "", f"expected a mapping at the top level, got {type(raw).__name__}")
    try:
        return Inventory.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise InventoryError(source, _location(first["loc"]), f"{first['msg']}; got {first.get('input')!r}{more}") \
            from None


def read_inventory_file(path: str | Path) -> Inventory:
    path = Path(path)
    try:
        text = read_file_bytes(path).decode("utf-8")
    except OSError as exc:
        raise InventoryError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InventoryError(str(path), "", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else yamlsafe.load(text)
    except json.JSONDecodeError as exc:
        raise InventoryError(str(path), f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise InventoryError(str(path), where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    return parse_inventory(raw, str(path))


def build_topology(inventory: Inventory, source: str = "<inventory>") -> Topology:
    """Inventory -> Topology; every reference problem raises InventoryError with its key path."""
    if inventory.generate is not None:
        spec = FatTreeSpec(name=inventory.name, **inventory.generate.model_dump())
        try:
            topology = generate_fat_tree(spec)
        except ValueError as exc:
            raise InventoryError(source, "generate", str(exc)) from None
    else:
        topology = Topology(inventory.name)
    names: dict[str, int] = {}
    for i, spec in enumerate(inventory.devices):
        names.setdefault(spec.name, i)
    for i, spec in enumerate(inventory.devices):
        if names[spec.name] != i:
            raise InventoryError(source, f"devices[{i}].name", f"{spec.name!r} is already defined at "
                                                              f"devices[{names[spec.name]}]")
        if spec.name in topology:
            raise InventoryError(source, f"devices[{i}].name", f"{spec.name!r} already exists in the generated part")
    # Servers before their components, whatever the file's order.
    pending = list(enumerate(inventory.devices))
    while pending:
        left = []
        for i, spec in pending:
            if spec.host is not None and spec.host not in topology:
                if spec.host not in names:
                    raise InventoryError(source, f"devices[{i}].host", f"unknown device {spec.host!r}")
                left.append((i, spec))
                continue
            try:
                topology.add_device(spec.name, spec.kind, rack=spec.rack, host=spec.host, partitions=spec.partitions,
                                    anchor=spec.anchor, **spec.attrs)
            except TopologyError as exc:
                raise InventoryError(source, f"devices[{i}]", str(exc)) from None
        if len(left) == len(pending):
            i, spec = left[0]
            raise InventoryError(source, f"devices[{i}].host", f"{spec.host!r} is housed, directly or not, in "
                                                              f"{spec.name!r} itself (a cycle)")
        pending = left
    for i, spec in enumerate(inventory.devices):
        for k, pdu in enumerate(spec.power):
            if pdu not in topology:
                raise InventoryError(source, f"devices[{i}].power[{k}]", f"unknown device {pdu!r}")
            try:
                topology.add_power_feed(pdu, spec.name)
            except TopologyError as exc:
                raise InventoryError(source, f"devices[{i}].power[{k}]", str(exc)) from None
    for i, link in enumerate(inventory.links):
        for end in ("a", "b"):
            if getattr(link, end) not in topology:
                raise InventoryError(source, f"links[{i}].{end}", f"unknown device {getattr(link, end)!r}")
        try:
            topology.add_link(link.a, link.b, link.kind, partition=link.partition, state=link.state,
                              reverse_state=link.reverse_state, a_port=link.a_port, b_port=link.b_port)
        except TopologyError as exc:
            raise InventoryError(source, f"links[{i}]", str(exc)) from None
    for i, job in enumerate(inventory.jobs):
        topology_job = Job(job.name, [_rank(topology, source, f"jobs[{i}].ranks[{k}]", r)
                                      for k, r in enumerate(job.ranks)], active=job.active)
        seen = set()
        for k, rank in enumerate(job.ranks):
            if rank.rank in seen:
                raise InventoryError(source, f"jobs[{i}].ranks[{k}].rank", f"rank {rank.rank} appears twice")
            seen.add(rank.rank)
        try:
            topology.add_job(topology_job)
        except TopologyError as exc:
            raise InventoryError(source, f"jobs[{i}]", str(exc)) from None
    return topology


def _rank(topology: Topology, source: str, where: str, spec: RankSpec) -> Rank:
    if spec.gpu is None and spec.host is None:
        raise InventoryError(source, where, "a rank needs a gpu or a host")
    host = spec.host
    if spec.gpu is not None:
        if spec.gpu not in topology:
            raise InventoryError(source, f"{where}.gpu", f"unknown device {spec.gpu!r}")
        if topology.kind(spec.gpu) != "gpu":
            raise InventoryError(source, f"{where}.gpu", f"{spec.gpu!r} is a {topology.kind(spec.gpu)}, not a gpu")
        gpu_host = topology.graph.nodes[spec.gpu]["host"]
        if host is None:
            host = gpu_host
        elif gpu_host is not None and gpu_host != host:
            raise InventoryError(source, f"{where}.host", f"{spec.gpu!r} is housed in {gpu_host!r}, not {host!r}")
        if host is None:
            raise InventoryError(source, f"{where}.host", f"{spec.gpu!r} names no host: give the rank's host")
    if host not in topology:
        raise InventoryError(source, f"{where}.host", f"unknown device {host!r}")
    return Rank(spec.rank, spec.gpu, host)


def load_topology(path: str | Path) -> Topology:
    return build_topology(read_inventory_file(path), str(path))
