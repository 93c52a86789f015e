"""NvmlBackend over the host's libnvidia-ml through nvidia-ml-py (pynvml)."""
from __future__ import annotations

import logging
import time

from .backend import ERROR_TYPES, GpuInfo, LinkReading, NvmlDeviceError, NvmlUnavailable

log = logging.getLogger("fabricscope.exporter.nvml")

_REMOTE_TYPES = {0x00: "gpu", 0x01: "ibmnpu", 0x02: "switch", 0xFF: "unknown"}
# nvmlDeviceGetNvLinkVersion answers an nvmlNvlinkVersion_t, not the version number:
# an H100/H200 (NVLink 4) answers 6.
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
# Version and remote endpoint only change when a link retrains: re-read them on a state
# change or after this long, not on every scrape (each NVML call costs ~1 ms in a VM).
STATIC_REFRESH_SECONDS = 300.0


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
        # (gpu uuid, link) -> (state, read at, version, remote pci bus id, remote type)
        self._static: dict[tuple[str, int], tuple] = {}

    def gpus(self) -> list[GpuInfo]:
        nvml = self.nvml
        out = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            out.append(GpuInfo(index=index, uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                               name=_text(nvml.nvmlDeviceGetName(handle)),
                               pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId)))
        return out

    def links(self, gpu: GpuInfo) -> list[LinkReading]:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except nvml.NVMLError as exc:
            raise NvmlDeviceError(_reason(nvml, exc), str(exc)) from None
        present: dict[int, bool] = {}
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                present[link] = bool(nvml.nvmlDeviceGetNvLinkState(handle, link))
            except nvml.NVMLError as exc:
                # NOT_SUPPORTED / INVALID_ARGUMENT: this link number does not exist here.
                if getattr(exc, "value", None) in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                    continue
                raise NvmlDeviceError(_reason(nvml, exc), f"link {link} state: {exc}") from None
        throughput = self._throughput(handle, list(present))
        readings = []
        for link, active in present.items():
            version, remote_pci, remote_type = self._static_info(gpu, handle, link, active)
            readings.append(LinkReading(link=link, active=active, version=version, remote_pci_bus_id=remote_pci,
                                        remote_type=remote_type, tx_bytes=throughput.get((link, "tx")),
                                        rx_bytes=throughput.get((link, "rx")), errors=self._errors(handle, link)))
        return readings

    def _static_info(self, gpu: GpuInfo, handle, link: int, active: bool) -> tuple:
        now = time.monotonic()
        cached = self._static.get((gpu.uuid, link))
        if cached is None or cached[0] != active or now - cached[1] > STATIC_REFRESH_SECONDS:
            cached = (active, now, self._version(handle, link), self._remote_pci(handle, link),
                      self._remote_type(handle, link))
            self._static[(gpu.uuid, link)] = cached
        return cached[2:]

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass

    # --- helpers: each answers None where the device says NOT_SUPPORTED -------------------

    def _optional(self, function, *args):
        try:
            return function(*args)
        except self.nvml.NVMLError:
            return None

    def _version(self, handle, link: int) -> str | None:
        code = self._optional(self.nvml.nvmlDeviceGetNvLinkVersion, handle, link)
        return None if code is None else _NVLINK_VERSIONS.get(code, f"unknown_{code}")

    def _remote_pci(self, handle, link: int) -> str | None:
        info = self._optional(self.nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        return _text(info.busId) if info is not None else None

    def _remote_type(self, handle, link: int) -> str | None:
        function = getattr(self.nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        code = self._optional(function, handle, link) if function else None
        return None if code is None else _REMOTE_TYPES.get(code, "unknown")

    def _errors(self, handle, link: int) -> dict[str, int]:
        out = {}
        for name, counter in self._error_counters.items():
            value = self._optional(self.nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            if value is not None:
                out[name] = int(value)
        return out

    def _throughput(self, handle, links: list[int]) -> dict[tuple[int, str], int]:
        """Cumulative data bytes per link from the NVLINK_THROUGHPUT_DATA fields (KiB)."""
        nvml = self.nvml
        fields = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link) for link in links] + \
                 [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link) for link in links]
        if not fields:
            return {}
        try:
            values = nvml.nvmlDeviceGetFieldValues(handle, fields)
        except nvml.NVMLError as exc:
            log.debug("NVLink throughput fields unavailable: %s", exc)
            return {}
        out = {}
        for value in values:
            if value.nvmlReturn != nvml.NVML_SUCCESS:
                continue
            direction = "tx" if value.fieldId == nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else "rx"
            out[(value.scopeId, direction)] = int(_field_number(nvml, value)) * 1024
        return out


def _field_number(nvml, value) -> float:
    kinds = {nvml.NVML_VALUE_TYPE_DOUBLE: "dVal", nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
             nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
             nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal"}
    return getattr(value.value, kinds.get(value.valueType, "ullVal"))
