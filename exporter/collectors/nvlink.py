"""NVLink state, topology, traffic and errors per GPU, from NVML (or the demo's simulation).

No NVML on the host is a normal state, not an error: fabric_nvml_available{reason} 0 and
nothing else. One GPU that cannot be read is reported and never hides the others.
"""
from __future__ import annotations

import logging
import threading
from typing import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..framework import Collector, register
from ..nvml import NvmlBackend, NvmlDeviceError, NvmlUnavailable, open_backend

log = logging.getLogger("fabricscope.exporter.nvlink")


@register
class NvlinkCollector(Collector):
    name = "nvlink"
    description = "NVLink state, remote endpoints, traffic and error counters from NVML."

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self._lock = threading.Lock()
        self._backend: NvmlBackend | None = ctx.sources.get("nvml")
        self._unavailable: str | None = None
        self._logged_reason: str | None = None

    def _open(self) -> NvmlBackend | None:
        # Retried on every scrape while unavailable: the driver may load after the exporter.
        if self._backend is None:
            try:
                self._backend = open_backend()
                self._unavailable = None
            except NvmlUnavailable as exc:
                self._unavailable = exc.reason
                if self._logged_reason != exc.reason:
                    log.info("NVML unavailable (%s); nvlink collector exports fabric_nvml_available 0", exc)
                    self._logged_reason = exc.reason
        return self._backend

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            backend = self._open()
            available = GaugeMetricFamily("fabric_nvml_available",
                                          "1 if NVML answered; reason says why not otherwise.", labels=["reason"])
            available.add_metric([self._unavailable or "ok"], 0.0 if backend is None else 1.0)
            yield available
            if backend is not None:
                yield from self._families(backend)

    def _families(self, backend: NvmlBackend) -> Iterable[Metric]:
        gpu_info = GaugeMetricFamily("fabric_gpu_info", "GPU identity; always 1.",
                                     labels=["gpu", "uuid", "name", "pci_bus_id"])
        state = GaugeMetricFamily("fabric_nvlink_state", "1 if the NVLink is active.", labels=["gpu", "link"])
        info = GaugeMetricFamily("fabric_nvlink_info", "NVLink version and remote endpoint; always 1.",
                                 labels=["gpu", "link", "version", "remote_pci_bus_id", "remote_type"])
        tx = CounterMetricFamily("fabric_nvlink_transmit_bytes", "Data bytes sent on the link "
                                 "(NVML NVLINK_THROUGHPUT_DATA_TX, KiB x 1024).", labels=["gpu", "link"])
        rx = CounterMetricFamily("fabric_nvlink_receive_bytes", "Data bytes received on the link "
                                 "(NVML NVLINK_THROUGHPUT_DATA_RX, KiB x 1024).", labels=["gpu", "link"])
        errors = CounterMetricFamily("fabric_nvlink_errors", "NVLink data-link error counters; absent where "
                                     "the GPU answers NOT_SUPPORTED.", labels=["gpu", "link", "type"])
        read_errors = GaugeMetricFamily("fabric_nvml_device_read_errors", "1 when the GPU could not be read "
                                        "on this scrape.", labels=["gpu", "reason"])
        for gpu in backend.gpus():
            g = str(gpu.index)
            gpu_info.add_metric([g, gpu.uuid, gpu.name, gpu.pci_bus_id], 1.0)
            try:
                links = backend.links(gpu)
            except NvmlDeviceError as exc:
                log.warning("GPU %s (%s): %s", g, gpu.pci_bus_id, exc)
                read_errors.add_metric([g, exc.reason], 1.0)
                continue
            for reading in links:
                link = str(reading.link)
                state.add_metric([g, link], 1.0 if reading.active else 0.0)
                info.add_metric([g, link, "" if reading.version is None else str(reading.version),
                                 reading.remote_pci_bus_id or "", reading.remote_type or ""], 1.0)
                if reading.tx_bytes is not None:
                    tx.add_metric([g, link], float(reading.tx_bytes))
                if reading.rx_bytes is not None:
                    rx.add_metric([g, link], float(reading.rx_bytes))
                for kind, value in sorted(reading.errors.items()):
                    errors.add_metric([g, link, kind], float(value))
        yield from (gpu_info, state, info, tx, rx, errors, read_errors)

    def close(self) -> None:
        with self._lock:
            if self._backend is not None and "nvml" not in self.ctx.sources:
                self._backend.close()
            self._backend = None
