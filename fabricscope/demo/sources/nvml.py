"""Simulated NVML: HGX-style GPUs, each with 18 NVLinks into four NVSwitches.

Implements exporter.nvml.NvmlBackend, so the nvlink collector reads it exactly as it reads
the real NVML. Link traffic follows the simulated NCCL job (fabricscope/demo/sources/nccl.py):
each rank's ring-AllReduce bytes are spread over its active links, and stop while an
nccl_hang fault holds the job.

Fault nvlink_down (target gpu, link; params precursor_seconds, default 10): for the first
precursor_seconds the link stays up while its CRC-flit and replay counters climb; then it
goes inactive and carries no traffic until the fault ends.
"""
from __future__ import annotations

import random

from fabricscope.exporter.nvml.backend import ERROR_TYPES, GpuInfo, LinkReading
from ..plugin import ClusterSpec, Fault, NodeSpec
from .nccl import hang_faults, rank_period, ring_allreduce_bytes

LINKS_PER_GPU = 18
NVLINK_VERSION = "4.0"
# Links per NVSwitch on an HGX H100 board: 5 + 4 + 4 + 5 = 18.
SWITCH_LINKS = (5, 4, 4, 5)
DEFAULT_PRECURSOR = 10.0
# The four data-link counters: an H200 on driver 580 answered all of them (measured).
# A GPU that answers NOT_SUPPORTED for one gets no series for it (see exporter/nvml/real.py).
SUPPORTED_ERRORS = ERROR_TYPES


def _switch_of(link: int) -> int:
    bound = 0
    for switch, count in enumerate(SWITCH_LINKS):
        bound += count
        if link < bound:
            return switch
    return len(SWITCH_LINKS) - 1


def _gpu_bus_ids(node: NodeSpec) -> list[str]:
    """The GPUs' PCI addresses in the node's simulated sysfs, written the way NVML writes
    them (8-digit domain, upper-case hex), so sysfs and NVML views of a GPU join."""
    try:
        from ..sim_topology import build_topology

        bdfs = list(build_topology(node.gpus, node.hcas).gpu_bdfs)
    except Exception:                     # the topology model changed: keep the demo running
        bdfs = []
    out = []
    for gpu in range(node.gpus):
        if gpu < len(bdfs):
            domain, bus, rest = bdfs[gpu].split(":")
            out.append(f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}")
        else:
            out.append(f"00000000:{0x18 + 0x10 * gpu:02X}:00.0")
    return out


class _Link:
    __slots__ = ("tx", "rx", "errors")

    def __init__(self) -> None:
        self.tx = 0.0
        self.rx = 0.0
        self.errors = {name: 0 for name in SUPPORTED_ERRORS}


class NvmlSimSource:
    key = "nvml"

    def __init__(self, node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> None:
        self.node = node
        self.nranks = cluster.world_size
        self.rng = rng
        self.now = 0.0
        buses = _gpu_bus_ids(node)
        self._gpus = [GpuInfo(index=g, uuid=self._uuid(cluster, node, g), name="NVIDIA H100 80GB HBM3",
                              pci_bus_id=buses[g]) for g in range(node.gpus)]
        self._links = [[_Link() for _ in range(LINKS_PER_GPU)] for _ in range(node.gpus)]
        self._down: set[tuple[int, int]] = set()

    @staticmethod
    def _uuid(cluster: ClusterSpec, node: NodeSpec, gpu: int) -> str:
        r = random.Random(f"{cluster.seed}-{node.name}-{gpu}").getrandbits(128)
        h = f"{r:032x}"
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def step(self, now: float, faults: list[Fault]) -> None:
        elapsed = max(0.0, now - self.now)
        self.now = max(self.now, now)
        down: set[tuple[int, int]] = set()
        for fault in faults:
            if fault.kind != "nvlink_down":
                continue
            gpu, link = int(fault.target.get("gpu", 0)), int(fault.target.get("link", 0))
            if not (0 <= gpu < len(self._links) and 0 <= link < LINKS_PER_GPU):
                continue
            if now - fault.start < float(fault.params.get("precursor_seconds", DEFAULT_PRECURSOR)):
                counters = self._links[gpu][link].errors
                counters["crc_flit"] += 1 + int(elapsed * 40)
                counters["replay"] += 1 + int(elapsed * 8)
            else:
                if (gpu, link) not in self._down:
                    self._links[gpu][link].errors["recovery"] += 1   # the failed retrain
                down.add((gpu, link))
        self._down = down
        if elapsed == 0 or hang_faults(faults):
            return                        # a hung job moves no data
        for gpu, links in enumerate(self._links):
            rank = self.node.index * self.node.gpus + gpu
            moved = elapsed / rank_period(rank, faults) * ring_allreduce_bytes(self.nranks)
            active = [link for index, link in enumerate(links) if (gpu, index) not in self._down]
            for link in active:
                link.tx += moved / len(active)
                link.rx += moved / len(active)

    # ---- NvmlBackend -----------------------------------------------------------------

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def links(self, gpu: GpuInfo) -> list[LinkReading]:
        out = []
        for index, link in enumerate(self._links[gpu.index]):
            # NVML counts in KiB: keep the same granularity.
            out.append(LinkReading(link=index, active=(gpu.index, index) not in self._down,
                                   version=NVLINK_VERSION,
                                   remote_pci_bus_id=f"00000000:{0xC0 + _switch_of(index):02X}:00.0",
                                   remote_type="switch", tx_bytes=int(link.tx) // 1024 * 1024,
                                   rx_bytes=int(link.rx) // 1024 * 1024, errors=dict(link.errors)))
        return out

    def close(self) -> None:
        """Nothing to release."""


def make_source(node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> NvmlSimSource:
    return NvmlSimSource(node, cluster, rng)
