"""NvmlBackend over the host's libnvidia-ml through nvidia-ml-py (pynvml).

One method per NVML call the sampler makes (see backend.py). NVML is thread-safe and
ctypes releases the GIL during each call, so the sampler's per-GPU threads read their
GPUs concurrently, and one GPU stuck inside the driver blocks only its own thread.
"""
from __future__ import annotations

import logging
import time

from .backend import (ERROR_TYPES, GPM_NVLINK_L0_RX, GPM_NVLINK_LINKS, GPM_NVLINK_UNIT_BYTES, FieldValuesUnsupported,
                      GpmUnsupported, GpuInfo, LinkStatic, NvmlDeviceError, NvmlUnavailable)

log = logging.getLogger("fabricscope.exporter.nvml")

_REMOTE_TYPES = {0x00: "gpu", 0x01: "ibmnpu", 0x02: "switch", 0xFF: "unknown"}
# nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t, not the version number:
# an H100/H200 (NVLink 4) answers 6.
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _reason(pynvml, exc: Exception) -> str:
    """NVMLError -> a short label value (library_not_found, driver_not_loaded, ...)."""
    names = {
        getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", -1): "library_not_found",
        getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", -1): "driver_not_loaded",
        getattr(pynvml, "NVML_ERROR_NO_PERMISSION", -1): "no_permission",
        getattr(pynvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1): "function_not_found",
        getattr(pynvml, "NVML_ERROR_GPU_IS_LOST", -1): "gpu_lost",
        getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", -1): "not_supported",
        getattr(pynvml, "NVML_ERROR_TIMEOUT", -1): "timeout",
    }
    return names.get(getattr(exc, "value", None), "nvml_error")


class PynvmlBackend:
    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("no_pynvml", str(exc)) from None
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(_reason(pynvml, exc), str(exc)) from None
        except OSError as exc:
            raise NvmlUnavailable("library_not_found", str(exc)) from None
        # crc_flit -> NVML_NVLINK_ERROR_DL_CRC_FLIT, ...
        self._error_counters = {name: getattr(pynvml, f"NVML_NVLINK_ERROR_DL_{name.upper()}")
                                for name in ERROR_TYPES}
        self._absent = {pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT}
        self._handles: dict[int, object] = {}
        self._gpm: dict[int, _GpmSamples] = {}   # GPU index -> its two GPM sample buffers

    def gpus(self) -> list[GpuInfo]:
        nvml = self.nvml
        out = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self._handles[index] = handle
            out.append(GpuInfo(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                               name=_text(nvml.nvmlDeviceGetName(handle)),
                               pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId)))
        return out

    def _handle(self, gpu: GpuInfo):
        handle = self._handles.get(gpu.index)
        if handle is None:
            try:
                handle = self._handles[gpu.index] = self.nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            except self.nvml.NVMLError as exc:
                raise NvmlDeviceError(_reason(self.nvml, exc), str(exc)) from None
        return handle

    def running_processes(self, gpu: GpuInfo) -> list[tuple[int, int | None]]:
        """(pid, GPU memory bytes or None) of every process with a compute context on the GPU."""
        try:
            processes = self.nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(gpu))
        except self.nvml.NVMLError as exc:
            raise NvmlDeviceError(_reason(self.nvml, exc), str(exc)) from None
        return [(p.pid, p.usedGpuMemory) for p in processes]

    def link_states(self, gpu: GpuInfo) -> dict[int, bool]:
        nvml, handle = self.nvml, self._handle(gpu)
        present: dict[int, bool] = {}
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                present[link] = bool(nvml.nvmlDeviceGetNvLinkState(handle, link))
            except nvml.NVMLError as exc:
                # NOT_SUPPORTED / INVALID_ARGUMENT: this link number does not exist here.
                if getattr(exc, "value", None) in self._absent:
                    continue
                raise NvmlDeviceError(_reason(nvml, exc), f"link {link} state: {exc}") from None
        return present

    def link_static(self, gpu: GpuInfo, link: int) -> LinkStatic:
        nvml, handle = self.nvml, self._handle(gpu)
        code = self._optional(nvml.nvmlDeviceGetNvLinkVersion, handle, link)
        version = None if code is None else _NVLINK_VERSIONS.get(code, f"unknown_{code}")
        pci = self._optional(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        function = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        remote = self._optional(function, handle, link) if function else None
        return LinkStatic(version=version, remote_pci_bus_id=_text(pci.busId) if pci is not None else None,
                          remote_type=None if remote is None else _REMOTE_TYPES.get(remote, "unknown"))

    def field_values(self, gpu: GpuInfo, fields: list[tuple[int, int]]) -> list[int | None]:
        nvml, handle = self.nvml, self._handle(gpu)
        if not fields:
            return []
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, fields)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in (nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_NOT_SUPPORTED):
                raise FieldValuesUnsupported(str(exc)) from None
            raise NvmlDeviceError(_reason(nvml, exc), f"field values: {exc}") from None
        except AttributeError as exc:         # bindings older than the call
            raise FieldValuesUnsupported(str(exc)) from None
        return [int(_field_number(nvml, value)) if value.nvmlReturn == nvml.NVML_SUCCESS else None
                for value in values]

    def error_counter(self, gpu: GpuInfo, link: int, kind: str) -> int | None:
        nvml, handle = self.nvml, self._handle(gpu)
        try:
            return int(nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, self._error_counters[kind]))
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) in self._absent:
                return None
            raise NvmlDeviceError(_reason(nvml, exc), f"link {link} {kind} counter: {exc}") from None

    def gpm_supported(self, gpu: GpuInfo) -> bool:
        query = getattr(self.nvml, "nvmlGpmQueryDeviceSupport", None)
        if query is None:                     # bindings older than GPM
            return False
        try:
            return bool(query(self._handle(gpu)).isSupportedDevice)
        except (self.nvml.NVMLError, NvmlDeviceError):
            return False

    def nvlink_bytes_moved(self, gpu: GpuInfo, links: tuple[int, ...]) -> dict[int, tuple[float, float]] | None:
        nvml, handle = self.nvml, self._handle(gpu)
        samples = self._gpm.get(gpu.index)
        try:
            if samples is None:
                samples = self._gpm[gpu.index] = _GpmSamples(nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc())
            current = samples.buffers[samples.next]
            nvml.nvmlGpmSampleGet(handle, current)
            taken = time.monotonic()
            previous, since = samples.buffers[1 - samples.next], samples.taken
            samples.next, samples.taken = 1 - samples.next, taken
            if since is None:
                return None
            wanted = [link for link in links if 0 <= link < GPM_NVLINK_LINKS]
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version, request.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, 2 * len(wanted)
            request.sample1, request.sample2 = previous, current
            for i, link in enumerate(wanted):
                request.metrics[2 * i].metricId = GPM_NVLINK_L0_RX + 2 * link
                request.metrics[2 * i + 1].metricId = GPM_NVLINK_L0_RX + 2 * link + 1
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            # A GPU gone or stuck fails the round, as any call would; any other refusal (not
            # supported, MIG mode, in use, resources) sends throughput back to field values,
            # which always answer: a GPM error must not cost the GPU its link rounds.
            if _reason(nvml, exc) in ("gpu_lost", "timeout", "driver_not_loaded"):
                raise NvmlDeviceError(_reason(nvml, exc), f"GPM: {exc}") from None
            raise GpmUnsupported(str(exc)) from None
        except AttributeError as exc:         # bindings without GPM
            raise GpmUnsupported(str(exc)) from None
        seconds, out = taken - since, {}
        for i, link in enumerate(wanted):
            rx, tx = request.metrics[2 * i], request.metrics[2 * i + 1]
            if rx.nvmlReturn == nvml.NVML_SUCCESS and tx.nvmlReturn == nvml.NVML_SUCCESS:
                out[link] = (tx.value * GPM_NVLINK_UNIT_BYTES * seconds, rx.value * GPM_NVLINK_UNIT_BYTES * seconds)
        return out

    def close(self) -> None:
        for samples in self._gpm.values():
            for buffer in samples.buffers:
                try:
                    self.nvml.nvmlGpmSampleFree(buffer)
                except self.nvml.NVMLError:
                    pass
        self._gpm.clear()
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    def _optional(self, function, *args):
        try:
            return function(*args)
        except self.nvml.NVMLError:
            return None


class _GpmSamples:
    """A GPU's two GPM sample buffers, filled in turn: the rates between the last two."""

    def __init__(self, first, second) -> None:
        self.buffers = (first, second)
        self.next = 0                       # the buffer the next sample goes into
        self.taken: float | None = None     # time.monotonic() of the last sample


def _field_number(nvml, value) -> float:
    kinds = {nvml.NVML_VALUE_TYPE_DOUBLE: "dVal", nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
             nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
             nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}
    return getattr(value.value, kinds.get(value.valueType, "ullVal"))
