"""The small interface the nvlink sampler reads: the real NVML or the demo's simulation.

The interface is NVML's own call granularity (link state, static link attributes, one
batched field-values call, one error-counter call), because what a read costs depends on
which call makes it: on an H200 an error-counter call takes ~0.85 ms while a link-state
call takes ~1 µs. The sampler (exporter/nvml/sampler.py) decides which calls to make and
how often; backends only answer them.

Readings are plain data with base units already applied (bytes, not KiB). A value the
device does not support is None / absent, never 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

ERROR_TYPES = ("crc_flit", "crc_data", "replay", "recovery")

# nvmlDeviceGetFieldValues field ids (nvml.h). Written out, not taken from pynvml, so the
# simulation and the sampler need no NVML bindings.
FI_NVLINK_THROUGHPUT_DATA_TX = 138          # KiB, scopeId = link
FI_NVLINK_THROUGHPUT_DATA_RX = 139
# GPM metric ids (nvml.h nvmlGpmMetricId_t): link L's receive ("read") bandwidth is
# GPM_NVLINK_L0_RX + 2L, its transmit ("write") bandwidth the id after it, for links 0-17.
GPM_NVLINK_L0_RX = 62
GPM_NVLINK_LINKS = 18
# Bytes per unit of those rates. nvml.h says MiB/s, but read as MiB every link's rate came
# out 1.024x the driver's own THROUGHPUT_DATA counters (KiB x 1024) on an H100, to the third
# decimal, all 36 link directions (bench/device/nvlink_gpm_check.sh): the unit is 1,000 KiB.
# With it, GPM and field values count the same bytes, whichever a GPU uses.
GPM_NVLINK_UNIT_BYTES = 1000 * 1024
# scopeId for a field's GPU total over all links (the throughput fields answer it on an H200).
SCOPE_ALL_LINKS = 0xFFFFFFFF
FI_NVLINK_ERROR_DL_REPLAY = 161             # scopeId = link
FI_NVLINK_ERROR_DL_RECOVERY = 162
FI_NVLINK_ERROR_DL_CRC = 163                # the flit CRC counter (NVML_NVLINK_ERROR_DL_CRC_FLIT)
# The error kinds whose DL field, scoped SCOPE_ALL_LINKS, answers the sum over the GPU's links
# (H100 and H200, driver 580: 3 values ~1 ms). crc_data has no such total on these GPUs (the
# legacy total, field 52, answers NOT_SUPPORTED), so it is always read per link.
ERROR_TOTAL_FIELDS = {"crc_flit": FI_NVLINK_ERROR_DL_CRC, "replay": FI_NVLINK_ERROR_DL_REPLAY,
                      "recovery": FI_NVLINK_ERROR_DL_RECOVERY}
# The older per-link ids exist for links 0..11 only, link number encoded in the id.
_FI_CRC_DATA_L0_5 = 39                      # NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0..L5 = 39..44
_FI_CRC_DATA_L6_11 = 102                    # ..._L6..L11 = 102..107


def error_field(kind: str, link: int) -> tuple[int, int] | None:
    """(field id, scope id) that reads one link's error counter in a batch, or None where
    NVML defines no field for it (the sampler then calls nvmlDeviceGetNvLinkErrorCounter)."""
    scoped = {"crc_flit": FI_NVLINK_ERROR_DL_CRC, "replay": FI_NVLINK_ERROR_DL_REPLAY,
              "recovery": FI_NVLINK_ERROR_DL_RECOVERY}
    if kind in scoped:
        return scoped[kind], link
    if kind == "crc_data" and 0 <= link < 6:
        return _FI_CRC_DATA_L0_5 + link, 0
    if kind == "crc_data" and 6 <= link < 12:
        return _FI_CRC_DATA_L6_11 + link - 6, 0
    return None


class NvmlUnavailable(Exception):
    """NVML cannot be used on this host; `reason` is the metric label value."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class NvmlDeviceError(Exception):
    """One GPU could not be read; the others still are."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class GpmUnsupported(Exception):
    """GPU Performance Monitoring refused the GPU (before Hopper, MIG mode, old bindings):
    per-link throughput is read by field values instead."""


class FieldValuesUnsupported(Exception):
    """The driver has no nvmlDeviceGetFieldValues (or refuses it for this GPU)."""


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True)
class LinkStatic:
    """What changes only when a link retrains: read once, and again on a state change."""
    version: str | None = None                # NVLink version, e.g. "4.0"
    remote_pci_bus_id: str | None = None
    remote_type: str | None = None            # gpu | switch | ibmnpu | unknown


@dataclass(frozen=True)
class LinkReading:
    link: int
    active: bool
    version: str | None = None
    remote_pci_bus_id: str | None = None
    remote_type: str | None = None
    tx_bytes: int | None = None               # cumulative data bytes (NVML reports KiB)
    rx_bytes: int | None = None
    errors: dict[str, int] = field(default_factory=dict)   # only the supported ERROR_TYPES


class NvmlBackend(Protocol):
    def gpus(self) -> list[GpuInfo]:
        """The GPUs NVML sees, in NVML index order."""

    def link_states(self, gpu: GpuInfo) -> dict[int, bool]:
        """link -> active, for every NVLink the GPU has (link numbers that do not exist are
        left out). Raises NvmlDeviceError when the GPU cannot be read."""

    def link_static(self, gpu: GpuInfo, link: int) -> LinkStatic:
        """Version and remote endpoint; None fields where unsupported."""

    def field_values(self, gpu: GpuInfo, fields: list[tuple[int, int]]) -> list[int | None]:
        """One nvmlDeviceGetFieldValues call: raw integer per (field id, scope id), None where
        that field is not supported. Raises FieldValuesUnsupported when the call itself is
        not, NvmlDeviceError when the GPU cannot be read."""

    def error_counter(self, gpu: GpuInfo, link: int, kind: str) -> int | None:
        """One nvmlDeviceGetNvLinkErrorCounter call; None where NOT_SUPPORTED.
        Raises NvmlDeviceError when the GPU cannot be read."""

    def gpm_supported(self, gpu: GpuInfo) -> bool:
        """Whether GPM (GPU Performance Monitoring, Hopper and later) samples this GPU."""

    def nvlink_bytes_moved(self, gpu: GpuInfo, links: tuple[int, ...]) -> dict[int, tuple[float, float]] | None:
        """Bytes each link transmitted and received since this GPU's previous call, from one
        GPM sample (every link's throughput in one driver round trip, where field values
        take one per link and direction); None on the first call, which only takes the
        baseline. A link GPM has no metric for is left out. Raises GpmUnsupported, or
        NvmlDeviceError when the GPU cannot be read."""

    def running_processes(self, gpu: GpuInfo) -> list[tuple[int, int | None]]:
        """(pid, used GPU memory in bytes or None) of each process with a compute context on
        the GPU (nvmlDeviceGetComputeRunningProcesses): NCCL ranks -> GPUs. Raises
        NvmlDeviceError when the GPU cannot be read."""

    def close(self) -> None:
        """Release NVML."""
