"""Network interfaces from <sysfs>/class/net/<if>/ and the default route from <procfs>/net/route.

Every optional field is None when its file is absent or carries no value (an absent
series, never a fake 0). Files that exist but cannot be read or parsed are collected as
ReadProblems so the collector can report them per interface without losing the rest.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import ReadProblem, parse_counter, parse_int, reason_for
from .held import HeldDirectory

# ARPHRD_* codes from include/uapi/linux/if_arp.h that appear on GPU nodes; anything
# else is exported as "other" so the label stays bounded.
ADDRESS_FAMILIES = {
    1: "ether",
    32: "infiniband",
    512: "ppp",
    768: "tunnel",
    769: "tunnel6",
    772: "loopback",
    776: "sit",
    778: "gre",
    823: "ip6gre",
    65534: "none",
}

# statistics/ file names become part of a metric name: accept only what the kernel uses.
_STAT_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

# Reasons that mean "this interface has no such value" rather than "something is wrong":
# virtual interfaces and links that are down answer EINVAL for speed.
_NO_VALUE = {"absent", "unsupported"}

# The interface's own attribute files that NetDevice holds.
_ATTRIBUTES = ("operstate", "carrier_changes", "mtu", "type", "speed")



@dataclass
class NetDevice:
    name: str
    operstate: str | None = None          # operstate: up, down, lowerlayerdown, dormant, unknown, ...
    carrier_changes: int | None = None    # carrier_changes
    mtu: int | None = None                # mtu (bytes)
    speed_mbps: int | None = None         # speed (Mb/s); None when -1, absent or EINVAL
    arp_type: int | None = None           # type (ARPHRD_*)
    driver: str | None = None             # basename of device/driver symlink; None when virtual
    statistics: dict[str, int] = field(default_factory=dict)   # statistics/<name>
    problems: list[ReadProblem] = field(default_factory=list)

    @property
    def address_family(self) -> str:
        if self.arp_type is None:
            return "unknown"
        return ADDRESS_FAMILIES.get(self.arp_type, "other")


def list_interfaces(sysfs: Path | str) -> list[str] | ReadProblem:
    directory = os.path.join(sysfs, "class", "net")
    try:
        return sorted(os.listdir(directory))
    except OSError as exc:
        return ReadProblem(Path(directory), reason_for(exc))


def _value(value: int | ReadProblem, device: NetDevice) -> int | None:
    """The value, or None after noting a problem that is more than "no such value"."""
    if value.__class__ is ReadProblem:
        if value.reason not in _NO_VALUE:
            device.problems.append(value)
        return None
    return value


def _driver(base: str) -> str | None:
    try:
        return os.path.basename(os.readlink(os.path.join(base, "device", "driver")))
    except OSError:  # virtual interfaces have no device/driver
        return None


class NetDeviceFiles:
    """One interface's attribute files and statistics/, held open between scrapes
    (parsers/held.py). An interface deleted and created again under the same name has a
    new directory, so its files are opened afresh."""

    def __init__(self, sysfs: Path | str, name: str) -> None:
        self.base = os.path.join(sysfs, "class", "net", name)
        self.attributes = HeldDirectory(self.base, _ATTRIBUTES)
        self.statistics = HeldDirectory(os.path.join(self.base, "statistics"))

    def close(self) -> None:
        self.attributes.close()
        self.statistics.close()


def _parse_attribute(text: str, directory: str, name: str) -> str | int | ReadProblem:
    if name == "operstate":
        return text.lower()
    if name == "carrier_changes":
        return parse_counter(text, directory, name)
    return parse_int(text, Path(directory, name))


def read_net_device(sysfs: Path, name: str, files: NetDeviceFiles | None = None) -> NetDevice | None:
    """The interface's attributes, or None when it vanished since the directory was listed
    (a pod's veth deleted mid-scrape is not an interface with every file unreadable).
    Without `files`, a one-off read: nothing stays open."""
    if files is None:
        files = NetDeviceFiles(sysfs, name)
        try:
            return read_net_device(sysfs, name, files)
        finally:
            files.close()
    attributes = dict(files.attributes.read(_parse_attribute))
    if files.attributes.absent:
        return None
    device = NetDevice(name=name)
    if "" in attributes:                  # the directory itself could not be listed
        device.problems.append(attributes[""])
    operstate = attributes.get("operstate")
    if operstate.__class__ is str:
        device.operstate = operstate
    elif operstate is not None and operstate.reason != "absent":
        device.problems.append(operstate)
    device.carrier_changes = _value(attributes.get("carrier_changes", _ABSENT), device)
    device.mtu = _value(attributes.get("mtu", _ABSENT), device)
    device.arp_type = _value(attributes.get("type", _ABSENT), device)
    speed = _value(attributes.get("speed", _ABSENT), device)
    # -1 (SPEED_UNKNOWN) is what virtual interfaces and unlinked ports report.
    device.speed_mbps = speed if speed is not None and speed > 0 else None
    device.driver = _driver(files.base)
    device.statistics = _read_statistics(files.statistics, device)
    return device


# What a directory that could not be listed leaves for each attribute (its own problem is
# the "" entry, reported with the rest).
_ABSENT = ReadProblem(Path("."), "absent")


@functools.lru_cache(maxsize=4096)       # bounded: a hostile tree cannot grow it
def _valid_stat_name(stat: str) -> bool:
    """Whether a statistics/ file name is one the kernel would use (checked once per name)."""
    return bool(_STAT_NAME.match(stat))


def _read_statistics(held: HeldDirectory, device: NetDevice) -> dict[str, int]:
    stats: dict[str, int] = {}
    for stat, value in held.read(parse_counter):
        if stat and not _valid_stat_name(stat):
            device.problems.append(ReadProblem(Path(held.path, stat), "bad_name"))
            continue
        value = _value(value, device)
        if value is not None:
            stats[stat] = value
    return stats


def parse_default_route_interfaces(text: str) -> set[str]:
    """Interfaces that carry an IPv4 default route (destination and mask 0) in /proc/net/route.

    The header line names the columns; rows that do not match it are ignored rather than
    trusted, since this only labels which interface is the node's uplink.
    """
    lines = text.splitlines()
    if not lines:
        return set()
    header = lines[0].split()
    try:
        iface_col, dest_col, mask_col = header.index("Iface"), header.index("Destination"), header.index("Mask")
    except ValueError:
        return set()
    found = set()
    for line in lines[1:]:
        columns = line.split()
        if len(columns) != len(header):
            continue
        if columns[dest_col] == "00000000" and columns[mask_col] == "00000000":
            found.add(columns[iface_col])
    return found



def read_ethtool_statistics(interface: str) -> list[tuple[str, int]] | ReadProblem | None:
    """The driver's `ethtool -S` counters for an interface of this network namespace.

    None when the driver has none (virtual interfaces); a ReadProblem when the ioctl
    failed. Only meaningful on the host's real /sys: the ioctl addresses the interface by
    name in the exporter's own namespace, not in an injected sysfs root.
    """
    from . import ethtool

    try:
        return ethtool.statistics(interface)
    except ethtool.EthtoolUnsupported:
        return None
    except (OSError, ValueError):
        return ReadProblem(Path(interface), "ethtool_failed")
