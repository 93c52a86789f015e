"""The nearest NIC of each GPU, from the PCIe tree: what a rank's traffic leaves the node through.

A rail-optimised node puts GPU i and NIC i under one PCIe switch so that GPUDirect RDMA
never crosses the CPU; NCCL picks that NIC for the GPU's rank. The path types, nearest
first, match the distances `nvidia-smi topo -m` prints:
  same_switch     the two meet below the root port, inside a PCIe switch (PIX / PXB);
  same_root_port  they meet at the root port (PHB);
  same_numa       different root ports of one NUMA node (NODE);
  cross_socket    different NUMA nodes (SYS);
  unknown         no common port and no NUMA information to tell.
Each GPU gets one NIC port: among the NICs at its best distance, one not yet given to a
lower-numbered GPU where there is one (GPU i <-> NIC i when two pairs share a switch),
then its first ACTIVE port (else its lowest port). One row per GPU keeps the PromQL join
`on (node, gpu)` one-to-one.

GPU numbers are NVML's indices: NVML enumerates GPUs in PCI bus-id order, so the i-th
GPU by PCI address is NVML (and nvidia-smi) GPU i.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from .nic_roles import _BDF, Gpu

PATHS = ("same_switch", "same_root_port", "same_numa", "cross_socket", "unknown")


@dataclass(frozen=True)
class NicCandidate:
    device: str
    pci_path: str | None       # realpath of the PCI function
    numa_node: int | None
    port: int | None           # the port a GPU's traffic would leave through


@dataclass(frozen=True)
class Affinity:
    gpu: int
    device: str
    port: int
    path: str


def pci_chain(pci_path: str) -> list[str]:
    """The PCI functions from the root port down to the device itself."""
    chain = []
    for part in pci_path.split(os.sep):
        if _BDF.match(part):
            chain.append(part)
        elif chain:
            break
    return chain


def path_type(gpu: Gpu, nic: NicCandidate) -> str:
    if nic.pci_path:
        gpu_chain, nic_chain = pci_chain(gpu.path), pci_chain(nic.pci_path)
        common = 0
        for a, b in zip(gpu_chain[:-1], nic_chain[:-1]):   # the devices themselves never meet
            if a != b:
                break
            common += 1
        if common >= 2:
            return "same_switch"
        if common == 1:
            return "same_root_port"
    if gpu.numa_node is None or nic.numa_node is None:
        return "unknown"
    return "same_numa" if gpu.numa_node == nic.numa_node else "cross_socket"


def gpus_in_nvml_order(gpus: list[Gpu]) -> list[Gpu]:
    return sorted(gpus, key=lambda g: os.path.basename(g.path))


def nearest_nics(gpus: list[Gpu], nics: list[NicCandidate]) -> list[Affinity]:
    usable = sorted((n for n in nics if n.port is not None),
                    key=lambda n: (os.path.basename(n.pci_path or ""), n.device))
    taken: set[str] = set()
    out = []
    for index, gpu in enumerate(gpus_in_nvml_order(gpus)):
        if not usable:
            break
        paths = {n.device: path_type(gpu, n) for n in usable}
        best = min(PATHS.index(p) for p in paths.values())
        closest = [n for n in usable if PATHS.index(paths[n.device]) == best]
        chosen = next((n for n in closest if n.device not in taken), closest[0])
        taken.add(chosen.device)
        out.append(Affinity(index, chosen.device, chosen.port, paths[chosen.device]))
    return out
