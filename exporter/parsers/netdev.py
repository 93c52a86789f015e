"""Network interfaces from <sysfs>/class/net/<if>/ and the default route from <procfs>/net/route.

Every optional field is None when its file is absent or carries no value (an absent
series, never a fake 0). Files that exist but cannot be read or parsed are collected as
ReadProblems so the collector can report them per interface without losing the rest.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .files import ReadProblem, parse_counter, parse_int, read_small_texts, reason_for

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


def list_interfaces(sysfs: Path) -> list[str] | ReadProblem:
    directory = Path(sysfs) / "class" / "net"
    try:
        return sorted(os.listdir(directory))
    except OSError as exc:
        return ReadProblem(directory, reason_for(exc))


def _parse(text: str | ReadProblem, path: Path) -> int | ReadProblem:
    return text if isinstance(text, ReadProblem) else parse_int(text, path)


def _value(value: int | ReadProblem, device: NetDevice) -> int | None:
    """The value, or None after noting a problem that is more than "no such value"."""
    if isinstance(value, ReadProblem):
        if value.reason not in _NO_VALUE:
            device.problems.append(value)
        return None
    return value


def _driver(base: Path) -> str | None:
    link = base / "device" / "driver"
    try:
        return os.path.basename(os.readlink(link))
    except OSError:  # virtual interfaces have no device/driver
        return None


def read_net_device(sysfs: Path, name: str) -> NetDevice | None:
    """The interface's attributes, or None when it vanished since the directory was listed
    (a pod's veth deleted mid-scrape is not an interface with every file unreadable)."""
    base = Path(sysfs) / "class" / "net" / name
    if not base.is_dir():
        return None
    device = NetDevice(name=name)
    # One directory open for the attribute files too, as for statistics/ below.
    attributes = dict(read_small_texts(str(base), _ATTRIBUTES))

    operstate = attributes["operstate"]
    if isinstance(operstate, ReadProblem):
        if operstate.reason != "absent":
            device.problems.append(operstate)
    else:
        device.operstate = operstate.lower()

    carrier_changes = attributes["carrier_changes"]
    device.carrier_changes = _value(carrier_changes if isinstance(carrier_changes, ReadProblem)
                                    else parse_counter(carrier_changes, base / "carrier_changes"), device)
    device.mtu = _value(_parse(attributes["mtu"], base / "mtu"), device)
    device.arp_type = _value(_parse(attributes["type"], base / "type"), device)
    speed = _value(_parse(attributes["speed"], base / "speed"), device)
    # -1 (SPEED_UNKNOWN) is what virtual interfaces and unlinked ports report.
    device.speed_mbps = speed if speed is not None and speed > 0 else None
    device.driver = _driver(base)
    device.statistics = _read_statistics(base / "statistics", device)
    return device


def _read_statistics(directory: Path, device: NetDevice) -> dict[str, int]:
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        device.problems.append(ReadProblem(directory, reason_for(exc)))
        return {}
    stats: dict[str, int] = {}
    wanted = []
    for stat in names:
        if _STAT_NAME.match(stat):
            wanted.append(stat)
        else:
            device.problems.append(ReadProblem(directory / stat, "bad_name"))
    # One directory open, files opened relative to it: ~25 files per interface per scrape.
    for stat, text in read_small_texts(str(directory), wanted):
        value = _value(text if isinstance(text, ReadProblem) else parse_counter(text, directory, stat), device)
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
