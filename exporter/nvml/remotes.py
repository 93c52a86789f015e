"""A GPU's NVLinks counted per remote end and state, from one sample's link readings.

Why a count and not only the per-link series: what a fleet-wide reader needs of NVLink is,
for each edge from a GPU to the NVSwitch (or peer GPU) its links reach, how many links
there are and how many are active. Read from the per-link series that is 144 state and 144
info series a node (144,000 at 1,000 nodes), and a store spends 1.5-3 s on any query that
reads one of them whole (docs/scale.md); the same answer is 4 series a GPU here.

Pure: readings in, counts out; the collector maps them to fabric_nvlink_remote_links.
"""
from __future__ import annotations

from typing import Iterable

from .backend import LinkReading

ACTIVE, INACTIVE = "active", "inactive"


def remote_link_counts(readings: Iterable[LinkReading]) -> dict[tuple[str, str, str], int]:
    """(remote_pci_bus_id, remote_type, state) -> number of links, in first-seen order.

    A remote end the driver did not name is "" (as fabric_nvlink_info writes it). Every
    remote end has its ACTIVE count, 0 when none of its links is active (so the edge is
    known while it is down); INACTIVE only while at least one of its links is not active
    (a healthy node exports none, as a counter that has not counted an error is left out).
    """
    counts: dict[tuple[str, str, str], int] = {}
    for reading in readings:
        remote = (reading.remote_pci_bus_id or "", reading.remote_type or "")
        counts.setdefault((*remote, ACTIVE), 0)
        if reading.active:
            counts[(*remote, ACTIVE)] += 1
        else:
            counts[(*remote, INACTIVE)] = counts.get((*remote, INACTIVE), 0) + 1
    return counts
