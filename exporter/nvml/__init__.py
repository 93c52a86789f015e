"""NVML access for the nvlink collector: a backend interface, the real pynvml backend, the sampler."""
from .backend import (ERROR_TYPES, FieldValuesUnsupported, GpuInfo, LinkReading, LinkStatic, NvmlBackend,
                      NvmlDeviceError, NvmlUnavailable)

__all__ = ["ERROR_TYPES", "FieldValuesUnsupported", "GpuInfo", "LinkReading", "LinkStatic", "NvmlBackend",
           "NvmlDeviceError", "NvmlUnavailable", "open_backend"]


def open_backend() -> NvmlBackend:
    """The host's NVML, or NvmlUnavailable(reason)."""
    from .real import PynvmlBackend

    return PynvmlBackend()
