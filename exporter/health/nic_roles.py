"""NIC role classification (compute / storage / management / unknown) without configuration.

Decision, first match wins:
  1. an override from config (`infiniband.roles: {mlx5_4: storage}`);
  2. management: the NIC's netdev carries the default route (<procfs>/net/route,
     destination and mask 00000000);
  3. compute: the NIC shares a PCIe switch with a GPU (vendor 0x10de, class 0x0302xx or
     0x0300xx). The switch is the NIC's parent bridge's parent (the upstream switch port);
     a NIC that hangs directly off a root port is compared at that root port;
  4. when no NIC on the host shares a switch with a GPU (flat or virtualised PCI, where the
     tree says nothing), NUMA locality decides: same NUMA node as a GPU -> compute;
  5. storage: not near a GPU, and the NIC has an ACTIVE port;
  6. unknown: anything else (no PCI link, no NUMA information, no GPUs found).

The topology part (GPU scan, PCI placement) is cached by the caller per device identity;
the default route is read on each call because it can move without a device change.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..parsers.files import ReadProblem, read_text
from ..parsers.netdev import parse_default_route_interfaces

ROLES = ("compute", "storage", "management", "unknown")
_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


@dataclass(frozen=True)
class Gpu:
    path: str                # realpath of the PCI function
    numa_node: int | None


@dataclass(frozen=True)
class NicPlacement:
    device: str
    pci_path: str | None     # realpath of the PCI function, None if unknown
    numa_node: int | None
    netdevs: tuple[str, ...]


def _read(path: str) -> str | None:
    # read_text, not read_small_text: <procfs>/net/route outgrows one page on hosts with many routes.
    text = read_text(Path(path))
    return None if isinstance(text, ReadProblem) else text


def _is_gpu(function_dir: str) -> bool:
    vendor, klass = _read(os.path.join(function_dir, "vendor")), _read(os.path.join(function_dir, "class"))
    return vendor == "0x10de" and klass is not None and klass.startswith(("0x0302", "0x0300"))


def _numa(function_dir: str) -> int | None:
    text = _read(os.path.join(function_dir, "numa_node"))
    try:
        value = int(text) if text is not None else -1
    except ValueError:
        return None
    return value if value >= 0 else None


def find_gpus(sysfs: Path | str) -> list[Gpu]:
    """GPUs from <sysfs>/bus/pci/devices; where that index is absent, walk devices/pci*."""
    candidates: list[str] = []
    index = os.path.join(sysfs, "bus", "pci", "devices")
    if os.path.isdir(index):
        candidates = [os.path.realpath(e.path) for e in os.scandir(index)]
    else:
        devices = os.path.join(sysfs, "devices")
        try:
            roots = [e.path for e in os.scandir(devices) if e.name.startswith("pci")]
        except OSError:
            roots = []
        for root in roots:
            for dirpath, dirnames, _ in os.walk(root):
                # Only PCI functions: skips infiniband/, net/ and other class directories.
                dirnames[:] = [d for d in dirnames if _BDF.match(d)]
                candidates.extend(os.path.realpath(os.path.join(dirpath, d)) for d in dirnames)
    return [Gpu(path, _numa(path)) for path in sorted(candidates) if _is_gpu(path)]


def switch_anchor(pci_path: str) -> str | None:
    """The upstream switch port above a PCI function, or its root port when there is no switch."""
    parent = os.path.dirname(pci_path)
    if not _BDF.match(os.path.basename(parent)):
        return None   # directly on the host bridge: no switch or root port to share
    grandparent = os.path.dirname(parent)
    return grandparent if _BDF.match(os.path.basename(grandparent)) else parent


def default_route_interfaces(procfs: Path | str) -> set[str]:
    return parse_default_route_interfaces(_read(os.path.join(procfs, "net", "route")) or "")


def gpu_proximity(nics: list[NicPlacement], gpus: list[Gpu]) -> dict[str, bool | None]:
    """device -> True (near a GPU), False (not near), None (cannot tell)."""
    gpu_anchors = {a for g in gpus if (a := switch_anchor(g.path))}
    by_switch = {n.device: bool(n.pci_path and switch_anchor(n.pci_path) in gpu_anchors) for n in nics}
    if any(by_switch.values()):
        # The PCIe tree pairs NICs with GPUs on this host, so it is the authority.
        return {n.device: by_switch[n.device] if n.pci_path else None for n in nics}
    gpu_numa = {g.numa_node for g in gpus if g.numa_node is not None}
    if not gpu_numa:
        return {n.device: None for n in nics}
    return {n.device: (n.numa_node in gpu_numa) if n.numa_node is not None else None for n in nics}


def classify(nic: NicPlacement, near_gpu: bool | None, default_ifaces: set[str], has_active_port: bool,
             override: str | None = None) -> str:
    if override in ROLES:
        return override
    if default_ifaces.intersection(nic.netdevs):
        return "management"
    if near_gpu:
        return "compute"
    if near_gpu is False and has_active_port:
        return "storage"
    return "unknown"


def load_role_overrides(section: dict | None) -> dict[str, str]:
    """infiniband.roles (validated by the config schema: every value one of ROLES)."""
    return dict((section or {}).get("roles") or {})
