"""The small interface the nvlink collector reads: the real NVML or the demo's simulation.

Readings are plain data with base units already applied (bytes, not KiB). A value the
device does not support is None / absent, never 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

ERROR_TYPES = ("crc_flit", "crc_data", "replay", "recovery")


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


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True)
class LinkReading:
    link: int
    active: bool
    version: str | None = None                # NVLink version, e.g. "4.0"
    remote_pci_bus_id: str | None = None
    remote_type: str | None = None            # gpu | switch | ibmnpu | unknown
    tx_bytes: int | None = None               # cumulative data bytes (NVML reports KiB)
    rx_bytes: int | None = None
    errors: dict[str, int] = field(default_factory=dict)   # only the supported ERROR_TYPES


class NvmlBackend(Protocol):
    def gpus(self) -> list[GpuInfo]:
        """The GPUs NVML sees, in NVML index order."""

    def links(self, gpu: GpuInfo) -> list[LinkReading]:
        """Every NVLink the GPU has (links that do not exist are left out).
        Raises NvmlDeviceError when the GPU cannot be read."""

    def close(self) -> None:
        """Release NVML."""
