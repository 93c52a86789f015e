"""Parse <sysfs>/class/infiniband/<device>/ into typed structs.

Pure parsing: no metrics, no health logic. Absent files become None (an absent series);
files that exist but cannot be used (empty, "N/A (no PMA)", garbage, a directory where a
file belongs, permission denied) become a ReadProblem in the device's `problems` list and
the value is skipped, so one bad file never costs the rest of the device or other devices.

Attributes that cannot change without the device being re-probed (board_id, fw_ver,
hca_type, node_guid, PCI placement, port list, link layer) are read once per device
identity and kept in a StaticCache; a re-probed device gets a new sysfs directory (new
inode) and therefore a fresh read. The files read on every scrape (port state, counters/,
hw_counters/) are held open by the cached entry and re-read in place (parsers/held.py),
which also follows a counter file appearing, vanishing or being replaced.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, NamedTuple

from .files import ReadProblem, parse_counter, parse_int, read_small_text, reason_for
from .held import HeldDirectory


@dataclass(frozen=True, slots=True)
class CodedState:
    """A `<code>: <NAME>` sysfs value such as "4: ACTIVE" or "5: LinkUp"."""
    code: int
    name: str


@dataclass(slots=True)
class PortCounters:
    """IBTA PortCounters/PortCountersExtended as mlx5 exposes them in ports/<n>/counters/.

    Every field is None when its file is absent. Files not listed here land in `other`.
    """
    excessive_buffer_overrun_errors: int | None = None   # counters/excessive_buffer_overrun_errors
    link_downed: int | None = None                       # counters/link_downed
    link_error_recovery: int | None = None               # counters/link_error_recovery
    local_link_integrity_errors: int | None = None       # counters/local_link_integrity_errors
    multicast_rcv_packets: int | None = None             # counters/multicast_rcv_packets
    multicast_xmit_packets: int | None = None            # counters/multicast_xmit_packets
    port_rcv_constraint_errors: int | None = None        # counters/port_rcv_constraint_errors
    port_rcv_data: int | None = None                     # counters/port_rcv_data (4-byte words)
    port_rcv_errors: int | None = None                   # counters/port_rcv_errors
    port_rcv_packets: int | None = None                  # counters/port_rcv_packets
    port_rcv_remote_physical_errors: int | None = None   # counters/port_rcv_remote_physical_errors
    port_rcv_switch_relay_errors: int | None = None      # counters/port_rcv_switch_relay_errors
    port_xmit_constraint_errors: int | None = None       # counters/port_xmit_constraint_errors
    port_xmit_data: int | None = None                    # counters/port_xmit_data (4-byte words)
    port_xmit_discards: int | None = None                # counters/port_xmit_discards
    port_xmit_packets: int | None = None                 # counters/port_xmit_packets
    port_xmit_wait: int | None = None                    # counters/port_xmit_wait (ticks)
    symbol_error: int | None = None                      # counters/symbol_error
    unicast_rcv_packets: int | None = None               # counters/unicast_rcv_packets
    unicast_xmit_packets: int | None = None              # counters/unicast_xmit_packets
    VL15_dropped: int | None = None                      # counters/VL15_dropped
    # Any other counters/<name> file (newer kernels add some): name -> value.
    other: dict[str, int] = field(default_factory=dict)

    def items(self) -> list[tuple[str, int]]:
        """(file name, value) for every counter that was read."""
        present = [(name, value) for name in _COUNTER_FIELDS
                   if (value := getattr(self, name)) is not None]
        present.extend(self.other.items())
        return present

    def get(self, name: str) -> int | None:
        """The value of counters/<name>, None when it was not read."""
        return getattr(self, name) if name in _COUNTER_FIELD_SET else self.other.get(name)


_COUNTER_FIELDS = tuple(f.name for f in fields(PortCounters) if f.name != "other")
_COUNTER_FIELD_SET = frozenset(_COUNTER_FIELDS)


class PortKey(NamedTuple):
    """One port's identity through parsing, health tracking and exposition. It becomes the
    text "device/port" only in the state file (str() and parse())."""
    device: str
    port: int

    def __str__(self) -> str:
        return f"{self.device}/{self.port}"

    @classmethod
    def parse(cls, text: str) -> PortKey:
        device, _, port = text.rpartition("/")
        if not device or not port.isascii() or not port.isdigit():
            raise ValueError(f"not a 'device/port' key: {text[:80]!r}")
        return cls(device, int(port))


@dataclass(slots=True)
class InfiniBandPort:
    device: str
    port: int                                   # ports/<n>
    state: CodedState | None = None             # ports/<n>/state          "4: ACTIVE"
    phys_state: CodedState | None = None        # ports/<n>/phys_state     "5: LinkUp"
    rate_bytes_per_second: float | None = None  # ports/<n>/rate           "400 Gb/sec (4X NDR)"
    link_layer: str | None = None               # ports/<n>/link_layer     InfiniBand | Ethernet
    netdev: str | None = None                   # ports/<n>/gid_attrs/ndevs/0, else device/net/<if>
    counters: PortCounters = field(default_factory=PortCounters)   # ports/<n>/counters/*
    # ports/<n>/hw_counters/*: driver- and firmware-specific names (mlx5 adds and renames
    # them between releases), so a mapping rather than fixed fields.
    hw_counters: dict[str, int] = field(default_factory=dict)
    carrier_changes: int | None = None          # <sysfs>/class/net/<netdev>/carrier_changes (Ethernet link layer)
    # Built once: health tracking and exposition look a port up by it about ten times a scrape.
    key: PortKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.key = PortKey(self.device, self.port)


@dataclass(frozen=True, slots=True)
class PciFunction:
    path: str                      # realpath of <device>/device, under <sysfs>/devices/
    numa_node: int | None          # device/numa_node (-1 and absent -> None)
    is_virtual_function: bool      # device/physfn exists (SR-IOV VF)


@dataclass(slots=True)
class InfiniBandDevice:
    name: str
    board_id: str | None = None    # board_id
    fw_ver: str | None = None      # fw_ver
    hca_type: str | None = None    # hca_type
    node_guid: str | None = None   # node_guid
    pci: PciFunction | None = None  # device -> ../../../<bdf>
    ports: list[InfiniBandPort] = field(default_factory=list)
    problems: list[ReadProblem] = field(default_factory=list)


class ParseError(ValueError):
    pass


def parse_coded_state(text: str) -> CodedState:
    code, sep, name = text.partition(":")
    name = name.strip()
    try:
        value = int(code)
    except ValueError:
        raise ParseError(f"not a '<code>: <name>' state: {text!r}") from None
    if not sep or not name:
        raise ParseError(f"not a '<code>: <name>' state: {text!r}")
    return CodedState(value, name)


def parse_rate(text: str) -> float:
    """'400 Gb/sec (4X NDR)' -> 50e9 bytes/s (the kernel prints gigabits per second)."""
    number, _, unit = text.partition(" ")
    if not unit.startswith("Gb/sec"):
        raise ParseError(f"rate is not '<n> Gb/sec ...': {text!r}")
    try:
        gigabits = float(number)
    except ValueError:
        raise ParseError(f"rate is not '<n> Gb/sec ...': {text!r}") from None
    return gigabits * 1e9 / 8


@dataclass(slots=True)
class _StaticPort:
    port: int
    path: str
    link_layer: str | None
    netdev: str | None
    # Held open between scrapes (parsers/held.py): the three attributes read per scrape,
    # counters/ and hw_counters/ whole, and the Ethernet netdev's carrier_changes.
    attributes: HeldDirectory
    counters: HeldDirectory
    hw_counters: HeldDirectory
    carrier: HeldDirectory | None
    # What the last read of counters/ and hw_counters/ built: served again, the same
    # objects, while their directory reads unchanged (HeldDirectory.unchanged), so what is
    # built from them downstream can be kept too (SampleCache.group).
    last_counters: PortCounters | None = None
    last_hw_counters: dict[str, int] | None = None

    def close(self) -> None:
        for held in (self.attributes, self.counters, self.hw_counters, self.carrier):
            if held is not None:
                held.close()


@dataclass(slots=True)
class _StaticDevice:
    identity: tuple[int, int]
    board_id: str | None
    fw_ver: str | None
    hca_type: str | None
    node_guid: str | None
    pci: PciFunction | None
    ports: list[_StaticPort]
    problems: list[ReadProblem]

    def close(self) -> None:
        for port in self.ports:
            port.close()


class StaticCache(dict):
    """device name -> attributes read once per device identity (see module docstring),
    with the descriptors its ports hold open. close() releases them all.

    `counters` and `hw_counters` say which files of ports/<n>/counters/ and hw_counters/
    are read (every one by default): a collector reads only what it exports or judges."""

    def __init__(self, counters: Callable[[str], bool] | None = None,
                 hw_counters: Callable[[str], bool] | None = None) -> None:
        super().__init__()
        self.counters = counters
        self.hw_counters = hw_counters

    def drop(self, name: str) -> None:
        self.pop(name).close()

    def close(self) -> None:
        for name in list(self):
            self.drop(name)


def read_infiniband(sysfs: Path | str, cache: StaticCache | None = None) -> list[InfiniBandDevice]:
    """Every device under <sysfs>/class/infiniband, sorted by name. No class dir -> []."""
    class_dir = os.path.join(sysfs, "class", "infiniband")
    try:
        entries = sorted(os.scandir(class_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    if cache is None:   # a one-off read: nothing is held past it
        cache = StaticCache()
        try:
            return read_infiniband(sysfs, cache)
        finally:
            cache.close()
    seen = set()
    devices = []
    for entry in entries:
        try:
            target = entry.stat()          # through the class link: the device directory
        except OSError:
            target = None
        if target is None or not stat.S_ISDIR(target.st_mode):
            # The class link is there but its device directory is gone (a device removed
            # mid-way, a broken driver unbind): the device is missing, which the health
            # tracker reports for every device it knew, rather than a device with no ports.
            continue
        seen.add(entry.name)
        devices.append(read_device(sysfs, entry, target.st_ino, cache))
    for gone in set(cache) - seen:
        cache.drop(gone)
    return devices


def read_device(sysfs: Path | str, entry: os.DirEntry, device_inode: int, cache: StaticCache) -> InfiniBandDevice:
    # The kernel re-creates both the class link and the device directory when a device is
    # re-probed (firmware reset, driver reload), so either inode changing means "new device".
    identity = (entry.inode(), device_inode)
    static = cache.get(entry.name)
    if static is None or static.identity != identity:
        if static is not None:
            cache.drop(entry.name)     # re-probed: its held files belong to the old device
        static = _read_static(sysfs, entry.path, identity, cache)
        # A failed read (permission, I/O, a file where a directory belongs) is reported now
        # and retried on the next scrape; cached, it would hide the device's ports until
        # its identity changed.
        if not static.problems:
            cache[entry.name] = static
    device = InfiniBandDevice(entry.name, static.board_id, static.fw_ver, static.hca_type,
                              static.node_guid, static.pci, problems=list(static.problems))
    if static.pci is None or not static.pci.is_virtual_function:
        # (VFs share the PF's physical port; the PF reports its health.)
        for sport in static.ports:
            device.ports.append(_read_port(entry.name, sport, device.problems))
    if cache.get(entry.name) is not static:
        static.close()                 # not kept: nothing stays open for it
    return device


def _read_optional_text(path: str, problems: list[ReadProblem]) -> str | None:
    value = read_small_text(path)
    if isinstance(value, ReadProblem):
        if value.reason != "absent":
            problems.append(value)
        return None
    return value


def _read_optional_int(path: str, problems: list[ReadProblem]) -> int | None:
    text = _read_optional_text(path, problems)
    if text is None:
        return None
    value = parse_int(text, Path(path))
    if isinstance(value, ReadProblem):
        problems.append(value)
        return None
    return value


def _read_static(sysfs: Path | str, device_dir: str, identity: tuple[int, int], cache: StaticCache) -> _StaticDevice:
    problems: list[ReadProblem] = []
    text = lambda name: _read_optional_text(os.path.join(device_dir, name), problems)  # noqa: E731
    static = _StaticDevice(identity, text("board_id"), text("fw_ver"), text("hca_type"),
                           text("node_guid"), _read_pci(device_dir, problems), [], problems)
    # Resolved once: per-scrape reads then skip the class/infiniband symlink.
    ports_dir = os.path.join(os.path.realpath(device_dir), "ports")
    try:
        port_names = [e.name for e in os.scandir(ports_dir) if e.name.isdigit()]
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            problems.append(ReadProblem(Path(ports_dir), reason_for(exc)))
        port_names = []
    for name in sorted(port_names, key=int):
        port_dir = os.path.join(ports_dir, name)
        link_layer = _read_optional_text(os.path.join(port_dir, "link_layer"), problems)
        netdev = _netdev(device_dir, port_dir)
        carrier = (HeldDirectory(os.path.join(sysfs, "class", "net", netdev), ("carrier_changes",))
                   if link_layer == "Ethernet" and netdev else None)
        static.ports.append(_StaticPort(
            int(name), port_dir, link_layer, netdev, HeldDirectory(port_dir, _PORT_ATTRIBUTES),
            HeldDirectory(f"{port_dir}/counters", wanted=cache.counters),
            HeldDirectory(f"{port_dir}/hw_counters", wanted=cache.hw_counters), carrier))
    return static


def _read_pci(device_dir: str, problems: list[ReadProblem]) -> PciFunction | None:
    link = os.path.join(device_dir, "device")
    if not os.path.exists(link):
        return None
    numa_node = _read_optional_int(os.path.join(link, "numa_node"), problems)
    if numa_node is not None and numa_node < 0:
        numa_node = None   # -1: the platform does not say
    return PciFunction(os.path.realpath(link), numa_node, os.path.lexists(os.path.join(link, "physfn")))


def _netdev(device_dir: str, port_dir: str) -> str | None:
    # gid_attrs/ndevs/0 names the netdev of GID 0 on RoCE (and IPoIB) ports; reading it
    # fails with EINVAL on ports without one, which is not a problem worth reporting.
    name = read_small_text(os.path.join(port_dir, "gid_attrs", "ndevs", "0"))
    if not isinstance(name, ReadProblem):
        return name
    try:
        names = sorted(os.listdir(os.path.join(device_dir, "device", "net")))
    except OSError:
        return None
    return names[0] if names else None


def _read_counter_dir(held: HeldDirectory, problems: list[ReadProblem]) -> dict[str, int]:
    values: dict[str, int] = {}
    for name, value in held.read(parse_counter):
        if value.__class__ is not ReadProblem:
            values[name] = value
        elif value.reason != "absent":
            problems.append(value)
    return values


_PORT_ATTRIBUTES = ("state", "phys_state", "rate")


def _parse_attribute(text: str, directory: str, name: str) -> CodedState | float | ReadProblem:
    try:
        return (parse_rate if name == "rate" else parse_coded_state)(text)
    except ParseError:
        return ReadProblem(Path(directory, name), "malformed")


def _read_port(device: str, sport: _StaticPort, problems: list[ReadProblem]) -> InfiniBandPort:
    port = InfiniBandPort(device, sport.port, link_layer=sport.link_layer, netdev=sport.netdev)
    for attr, value in sport.attributes.read(_parse_attribute):
        if value.__class__ is ReadProblem:
            if value.reason != "absent":
                problems.append(value)
            continue
        setattr(port, "rate_bytes_per_second" if attr == "rate" else attr, value)
    counters = _read_counter_dir(sport.counters, problems)
    if sport.counters.unchanged and sport.last_counters is not None:
        port.counters = sport.last_counters
    else:
        known = {k: v for k, v in counters.items() if k in _COUNTER_FIELD_SET}
        other = {k: v for k, v in counters.items() if k not in _COUNTER_FIELD_SET}
        port.counters = sport.last_counters = PortCounters(**known, other=other)
    hw_counters = _read_counter_dir(sport.hw_counters, problems)
    if sport.hw_counters.unchanged and sport.last_hw_counters is not None:
        port.hw_counters = sport.last_hw_counters
    else:
        port.hw_counters = sport.last_hw_counters = hw_counters
    if sport.carrier is not None:
        port.carrier_changes = _read_counter_dir(sport.carrier, problems).get("carrier_changes")
    return port
