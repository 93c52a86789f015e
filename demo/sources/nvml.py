"""Simulated NVML: HGX-style GPUs, each with 18 NVLinks into four NVSwitches.

Implements exporter.nvml.NvmlBackend, so the nvlink collector reads it exactly as it reads
the real NVML. Link traffic follows the simulated NCCL job (demo/sources/nccl.py):
each rank's ring-AllReduce bytes are spread over its active links, and stop while an
nccl_hang fault holds the job.

Each call costs what it cost on an H200 (driver 580, 18 NVLinks, CallCosts below), and
costs it as CPU: the driver computes the answer on the calling thread (wall = CPU there),
so a call burns that much of its thread's CPU without holding the GIL (as a ctypes call
into libnvidia-ml does); the demo's nodes (make_source) sleep it instead. Benchmarks and
tests thus see the real shape: per-link values slow whichever call reads them, link state
nearly free, and the sampling threads' CPU what it would be on the host. Field support
follows the same host: the per-link DL error fields and the throughput fields (per link, or
the GPU total with scope SCOPE_ALL_LINKS) answer in a batch, and so do the DL
CRC/replay/recovery GPU totals (scope SCOPE_ALL_LINKS: the sum of the per-link counters the
simulation keeps, so a fault's errors move both); the legacy per-link CRC-data fields and
the legacy error totals answer NOT_SUPPORTED (crc_data is then read by the per-link call).

Fault nvlink_down (target gpu, link; params precursor_seconds, default 10): for the first
precursor_seconds the link stays up while its CRC-flit and replay counters climb; then it
goes inactive and carries no traffic until the fault ends.

Fault nvml_hang (target gpu): every NVML call on that GPU blocks until the fault ends, as
on a GPU stuck in the driver.
"""
from __future__ import annotations

import hashlib
import random
import threading
from collections import Counter
import time
from dataclasses import dataclass, fields

from fabricscope.exporter.nvml.backend import (ERROR_TYPES, FI_NVLINK_ERROR_DL_CRC, FI_NVLINK_ERROR_DL_RECOVERY,
                                               FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_THROUGHPUT_DATA_RX,
                                               FI_NVLINK_THROUGHPUT_DATA_TX, SCOPE_ALL_LINKS, GpmUnsupported,
                                               GpuInfo, LinkStatic, NvmlDeviceError)
from ..plugin import ClusterSpec, Fault, NodeSpec
from .nccl import hang_faults, rank_pid, rank_period, ring_allreduce_bytes

LINKS_PER_GPU = 18
RANK_MEMORY_BYTES = 60 * 2**30     # what a training rank holds on its GPU
NVLINK_VERSION = "4.0"
# Links per NVSwitch on an HGX H100 board: 5 + 4 + 4 + 5 = 18.
SWITCH_LINKS = (5, 4, 4, 5)
DEFAULT_PRECURSOR = 10.0
# The four data-link counters: an H200 on driver 580 answered all of them (measured).
# A GPU that answers NOT_SUPPORTED for one gets no series for it (see exporter/nvml/real.py).
SUPPORTED_ERRORS = ERROR_TYPES
FAULT_KINDS = ("nvml_hang",)
# Field ids a batch answers, and the error kind each link-scoped one reads. Everything else
# (the legacy per-link CRC-data ids among them) answers NOT_SUPPORTED.
_SCOPED_ERROR_FIELDS = {FI_NVLINK_ERROR_DL_CRC: "crc_flit", FI_NVLINK_ERROR_DL_REPLAY: "replay",
                        FI_NVLINK_ERROR_DL_RECOVERY: "recovery"}
_THROUGHPUT_FIELDS = {FI_NVLINK_THROUGHPUT_DATA_TX: "tx", FI_NVLINK_THROUGHPUT_DATA_RX: "rx"}
# Sleeps shorter than this are skipped: the kernel's timer slack would turn them into ~60 µs.
_MIN_SLEEP = 50e-6


@dataclass(frozen=True)
class CallCosts:
    """Seconds per NVML call or value, measured on an H200 with 18 NVLinks, driver 580
    (bench/device/gpu_cost.sh; docs/cost.md). burn_cpu False: the call sleeps instead
    (tests that only need the latency shape, not the CPU)."""
    link_state: float = 3.5e-6            # nvmlDeviceGetNvLinkState, per link (0.062 ms for 18)
    # ... and on top, once, for the first state call after a second or more without one: the
    # exporter's gpu-tier rounds, each after a wait, cost ~1.3 ms on H100/H200 during a job
    # where the same calls back to back cost 0.06-0.12 ms.
    link_states_after_wait: float = 1.2e-3
    link_static: float = 5.3e-6           # version + remote PCI info + remote device type
    error_counter: float = 0.79e-3        # nvmlDeviceGetNvLinkErrorCounter: 0.78-0.80 ms a call
    field_call: float = 0.0               # nvmlDeviceGetFieldValues, the call itself (in the values)
    field_per_link: float = 0.82e-3       # each link-scoped value: 36 throughput 29.6 ms, 54 DL errors 43.9 ms
    field_gpu_total: float = 0.58e-3      # each GPU-total value (scope SCOPE_ALL_LINKS): 2 took 1.16 ms
    field_error_total: float = 0.33e-3    # each GPU-total DL error value: 3 took 0.99 ms (H100), 1.19 ms (H200)
    field_unsupported: float = 1.5e-6     # each NOT_SUPPORTED field: 16 took 0.022 ms
    gpm_sample: float = 0.086e-3          # nvmlGpmSampleGet: every metric of the GPU (H200, during a job)
    gpm_metrics: float = 0.065e-3         # nvmlGpmMetricsGet: 38 rates from two samples, computed in the library
    burn_cpu: bool = True


H200_COSTS = CallCosts()
# The demo's nodes: the same time per call, slept rather than burnt (a demo of 32 GPUs on
# a laptop should not spend a core's percent on simulated driver work).
DEMO_COSTS = CallCosts(burn_cpu=False)
# Every call free (tests of behaviour, not cost): each cost field 0, whatever fields come.
FREE = CallCosts(**{f.name: 0.0 for f in fields(CallCosts) if f.name != "burn_cpu"}, burn_cpu=False)
# hashlib releases the GIL for buffers of 2 KiB and more: the burn runs outside the GIL,
# as the driver's work does inside a ctypes call. Each hash covers as much of the time left
# as the measured hash rate allows: a 16 KiB hash at a time took the GIL back ~60 times a
# millisecond, which a ctypes call into the driver never does, and slowed the scrapes of
# the in-process benchmark with contention the real node does not have.
_BURN_BLOCK = memoryview(bytes(1 << 20))
_hash_rate: list[float] = []                # bytes of SHA-256 per CPU second on this machine


def burn_cpu(seconds: float) -> None:
    """Use `seconds` of this thread's CPU time, taking the GIL as rarely as a driver call."""
    if not _hash_rate:                       # measured on 64 KiB: the first burn overshoots by ~0.06 ms at most
        start = time.thread_time()
        hashlib.sha256(_BURN_BLOCK[:1 << 16])
        _hash_rate.append((1 << 16) / max(time.thread_time() - start, 1e-6))
    end = time.thread_time() + seconds
    while (left := end - time.thread_time()) > 0:
        size = int(min(len(_BURN_BLOCK), max(16384, left * _hash_rate[0])))
        hashlib.sha256(_BURN_BLOCK[:size])


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
    except Exception:  # noqa: BLE001 - the topology model changed: keep the demo running
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

    def __init__(self, supported: tuple[str, ...]) -> None:
        self.tx = 0.0
        self.rx = 0.0
        self.errors = {name: 0 for name in supported}


class NvmlSimSource:
    key = "nvml"

    def __init__(self, node: NodeSpec, cluster: ClusterSpec, rng: random.Random,
                 costs: CallCosts = H200_COSTS, error_fields: bool = True,
                 supported_errors: tuple[str, ...] = SUPPORTED_ERRORS, error_totals: bool = True,
                 gpm: bool = True) -> None:
        """error_fields False: the driver answers no error field in a batch (older drivers);
        error_totals False: the DL error fields answer per link but not as GPU totals;
        supported_errors: the counters this GPU model answers at all; gpm False: no GPU
        Performance Monitoring (an A100, MIG mode)."""
        self.node = node
        self.gpm = gpm
        self._gpm_last: dict[int, list[tuple[float, float]]] = {}   # GPU -> each link's (tx, rx) at its last sample
        self._last_state_call: dict[int, float] = {}                 # GPU -> time.monotonic() of its last state call
        self.costs = costs
        self.error_fields = error_fields
        self.error_totals = error_fields and error_totals
        self.supported_errors = supported_errors
        self.calls: Counter[str] = Counter()     # NVML calls made, by function
        self._lock = threading.Condition()       # step() writes, sampler threads read
        self._hung: set[int] = set()
        self._closed = False
        self.nranks = cluster.world_size
        self.rng = rng
        self.now = 0.0
        buses = _gpu_bus_ids(node)
        self._gpus = [GpuInfo(index=g, uuid=self._uuid(cluster, node, g), name="NVIDIA H100 80GB HBM3",
                              pci_bus_id=buses[g]) for g in range(node.gpus)]
        self._links = [[_Link(supported_errors) for _ in range(LINKS_PER_GPU)] for _ in range(node.gpus)]
        self._down: set[tuple[int, int]] = set()

    @staticmethod
    def _uuid(cluster: ClusterSpec, node: NodeSpec, gpu: int) -> str:
        r = random.Random(f"{cluster.seed}-{node.name}-{gpu}").getrandbits(128)
        h = f"{r:032x}"
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def step(self, now: float, faults: list[Fault]) -> None:
        with self._lock:
            self._step(now, faults)
            self._hung = {int(f.target.get("gpu", 0)) for f in faults if f.kind == "nvml_hang"}
            self._lock.notify_all()

    def _step(self, now: float, faults: list[Fault]) -> None:
        elapsed = max(0.0, now - self.now)
        self.now = max(self.now, now)
        down: set[tuple[int, int]] = set()
        for fault in faults:
            if fault.kind != "nvlink_down":
                continue
            gpu, link = int(fault.target.get("gpu", 0)), int(fault.target.get("link", 0))
            if not (0 <= gpu < len(self._links) and 0 <= link < LINKS_PER_GPU):
                continue
            counters = self._links[gpu][link].errors
            if now - fault.start < float(fault.params.get("precursor_seconds", DEFAULT_PRECURSOR)):
                for kind, per_second in (("crc_flit", 40), ("replay", 8)):
                    if kind in counters:
                        counters[kind] += 1 + int(elapsed * per_second)
            else:
                if (gpu, link) not in self._down and "recovery" in counters:
                    counters["recovery"] += 1                       # the failed retrain
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

    def _call(self, gpu: GpuInfo, function: str, seconds: float) -> None:
        """What a call costs: block while the GPU hangs, then take the call's time."""
        with self._lock:
            self.calls[function] += 1
            while gpu.index in self._hung and not self._closed:
                self._lock.wait()
            if self._closed:
                raise NvmlDeviceError("uninitialized", "NVML was shut down")
            if not 0 <= gpu.index < len(self._links):
                raise NvmlDeviceError("invalid_argument", f"no GPU {gpu.index}")
        if self.costs.burn_cpu:
            if seconds > 0:
                burn_cpu(seconds)
        elif seconds >= _MIN_SLEEP:
            time.sleep(seconds)

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def running_processes(self, gpu: GpuInfo) -> list[tuple[int, int | None]]:
        """The demo job's rank process of this GPU (demo/sources/nccl.py)."""
        self._call(gpu, "nvmlDeviceGetComputeRunningProcesses", 0.0)
        return [(rank_pid(gpu.index), RANK_MEMORY_BYTES)]

    def link_states(self, gpu: GpuInfo) -> dict[int, bool]:
        now = time.monotonic()
        waited = now - self._last_state_call.get(gpu.index, float("-inf")) >= 1.0
        self._last_state_call[gpu.index] = now
        self._call(gpu, "nvmlDeviceGetNvLinkState", LINKS_PER_GPU * self.costs.link_state
                   + (self.costs.link_states_after_wait if waited else 0.0))
        with self._lock:
            return {index: (gpu.index, index) not in self._down for index in range(LINKS_PER_GPU)}

    def link_static(self, gpu: GpuInfo, link: int) -> LinkStatic:
        self._call(gpu, "nvmlDeviceGetNvLinkVersion+RemotePciInfo+RemoteDeviceType", self.costs.link_static)
        return LinkStatic(version=NVLINK_VERSION, remote_pci_bus_id=f"00000000:{0xC0 + _switch_of(link):02X}:00.0",
                          remote_type="switch")

    def field_values(self, gpu: GpuInfo, fields: list[tuple[int, int]]) -> list[int | None]:
        costs, seconds, out = self.costs, self.costs.field_call, []
        with self._lock:
            links = self._links[gpu.index] if 0 <= gpu.index < len(self._links) else []
            for field_id, scope in fields:
                value = None
                if scope == SCOPE_ALL_LINKS and field_id in _THROUGHPUT_FIELDS:
                    # NVML counts in KiB.
                    direction = _THROUGHPUT_FIELDS[field_id]
                    value = int(sum(link.tx if direction == "tx" else link.rx for link in links)) // 1024
                    seconds += costs.field_gpu_total
                elif scope == SCOPE_ALL_LINKS and field_id in _SCOPED_ERROR_FIELDS and self.error_totals:
                    # The sum of the per-link counters: what a per-link read answers adds up to it.
                    kind = _SCOPED_ERROR_FIELDS[field_id]
                    if kind in self.supported_errors:
                        value = sum(link.errors[kind] for link in links)
                    seconds += costs.field_unsupported if value is None else costs.field_error_total
                elif 0 <= scope < len(links) and field_id in _THROUGHPUT_FIELDS:
                    link = links[scope]
                    value = int(link.tx if _THROUGHPUT_FIELDS[field_id] == "tx" else link.rx) // 1024
                    seconds += costs.field_per_link
                elif self.error_fields and 0 <= scope < len(links) and field_id in _SCOPED_ERROR_FIELDS:
                    value = links[scope].errors.get(_SCOPED_ERROR_FIELDS[field_id])
                    seconds += costs.field_unsupported if value is None else costs.field_per_link
                else:
                    seconds += costs.field_unsupported
                out.append(value)
        self._call(gpu, "nvmlDeviceGetFieldValues", seconds)
        return out

    def gpm_supported(self, gpu: GpuInfo) -> bool:
        self._call(gpu, "nvmlGpmQueryDeviceSupport", 0.0)
        return self.gpm

    def nvlink_bytes_moved(self, gpu: GpuInfo, links: tuple[int, ...]) -> dict[int, tuple[float, float]] | None:
        """What GPM's rates between two samples times the time between them give: the
        bytes each link moved since the GPU's previous sample."""
        if not self.gpm:
            raise GpmUnsupported("GPM is not supported on this GPU")
        self._call(gpu, "nvmlGpmSampleGet", self.costs.gpm_sample)
        with self._lock:
            now = [(link.tx, link.rx) for link in self._links[gpu.index]]
            before = self._gpm_last.get(gpu.index)
            self._gpm_last[gpu.index] = now
        if before is None:
            return None
        self._call(gpu, "nvmlGpmMetricsGet", self.costs.gpm_metrics)
        return {link: (now[link][0] - before[link][0], now[link][1] - before[link][1])
                for link in links if 0 <= link < len(now)}

    def error_counter(self, gpu: GpuInfo, link: int, kind: str) -> int | None:
        self._call(gpu, "nvmlDeviceGetNvLinkErrorCounter", self.costs.error_counter)
        with self._lock:
            if not 0 <= link < LINKS_PER_GPU:
                raise NvmlDeviceError("invalid_argument", f"no link {link}")
            return self._links[gpu.index][link].errors.get(kind)

    def close(self) -> None:
        """Release calls blocked on a hung GPU (they fail, as after nvmlShutdown)."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()


def make_source(node: NodeSpec, cluster: ClusterSpec, rng: random.Random) -> NvmlSimSource:
    return NvmlSimSource(node, cluster, rng, costs=DEMO_COSTS)
