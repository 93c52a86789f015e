"""Port link-state verdicts and the cross-card anomaly checks (uncabled port, homogeneity).

Pure functions over parsed ports and roles; the HealthTracker keeps the history.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from ..parsers.infiniband import InfiniBandDevice, InfiniBandPort

# sysfs state codes 4 (ACTIVE) and 5 (ACTIVE_DEFER) both carry traffic.
_ACTIVE_STATES = {"ACTIVE", "ACTIVE_DEFER"}


def is_active(port: InfiniBandPort) -> bool:
    return port.state is not None and port.state.name in _ACTIVE_STATES


def is_state_fatal(port: InfiniBandPort) -> bool:
    """DOWN or phys_state Disabled: the workload on this port has failed."""
    return ((port.state is not None and port.state.name == "DOWN")
            or (port.phys_state is not None and port.phys_state.name == "Disabled"))


def is_link_healthy(port: InfiniBandPort) -> bool:
    return is_active(port) and port.phys_state is not None and port.phys_state.name == "LinkUp"


def uncabled_ports(devices: Iterable[InfiniBandDevice], roles: Mapping[str, str]) -> set[tuple[str, int]]:
    """Compute-NIC ports that are DOWN with phys_state Polling/Disabled while other compute
    ports are ACTIVE: a cable that was never plugged (or was pulled), not a quiet fabric."""
    compute = [p for d in devices if roles.get(d.name) == "compute" for p in d.ports]
    found = set()
    for port in compute:
        if (port.state is not None and port.state.name == "DOWN" and port.phys_state is not None
                and port.phys_state.name in ("Polling", "Disabled")
                and any(is_active(other) for other in compute if other is not port)):
            found.add((port.device, port.port))
    return found


def inhomogeneous_devices(devices: Iterable[InfiniBandDevice], roles: Mapping[str, str]) -> set[str]:
    """Cards with fewer ACTIVE ports than the usual (mode) count among cards of the same role.

    Ties for the mode go to the larger count, so with two cards the lesser one stands out.
    Unknown-role cards are not compared: their group is not a real peer group.
    """
    groups: dict[str, dict[str, int]] = {}
    for device in devices:
        role = roles.get(device.name, "unknown")
        if role != "unknown":
            groups.setdefault(role, {})[device.name] = sum(1 for p in device.ports if is_active(p))
    odd = set()
    for active_by_card in groups.values():
        if len(active_by_card) < 2:
            continue
        counts = Counter(active_by_card.values())
        usual = max(counts, key=lambda n: (counts[n], n))
        odd.update(card for card, n in active_by_card.items() if n < usual)
    return odd
