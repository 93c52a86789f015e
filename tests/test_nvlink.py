"""The nvlink collector over the demo NVML backend, the real NVML where present, and failures."""
from __future__ import annotations

import ctypes.util
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.context import Context
from fabricscope.demo.plugin import ClusterSpec, Fault, NodeSpec
from fabricscope.demo.sources import nvml as demo_nvml
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules
from fabricscope.exporter.nvml import GpuInfo, LinkReading, NvmlDeviceError


def registry_for(ctx):
    load_collector_modules()
    collectors = build_collectors(ctx, ["nvlink"])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(collectors, node=""))
    return registry, collectors[0]


def demo(gpus=8, nodes=2):
    specs = tuple(NodeSpec(f"gpu-node-{i}", i, gpus, 2, Path("/nonexistent")) for i in range(nodes))
    spec = ClusterSpec("test", specs, 3)
    source = demo_nvml.make_source(specs[0], spec, random.Random(1))
    registry, collector = registry_for(Context(node="gpu-node-0", sources={"nvml": source}))
    return source, registry


def get(registry, name, **labels):
    return registry.get_sample_value(name, labels)


def test_demo_backend_exports_gpus_links_and_topology():
    source, registry = demo()
    source.step(1.0, [])
    assert get(registry, "fabric_nvml_available", reason="ok") == 1
    infos = [s for m in registry.collect() if m.name == "fabric_gpu_info" for s in m.samples]
    assert len(infos) == 8 and all(s.labels["name"] == "NVIDIA H100 80GB HBM3" for s in infos)
    assert len({s.labels["uuid"] for s in infos}) == 8
    states = [s for m in registry.collect() if m.name == "fabric_nvlink_state" for s in m.samples]
    assert len(states) == 8 * 18 and all(s.value == 1 for s in states)
    link_info = [s.labels for m in registry.collect() if m.name == "fabric_nvlink_info" for s in m.samples]
    assert {info["remote_type"] for info in link_info} == {"switch"}
    assert len({info["remote_pci_bus_id"] for info in link_info}) == 4          # four NVSwitches
    assert {info["version"] for info in link_info} == {"4.0"}
    for kind in ("crc_flit", "crc_data", "replay", "recovery"):
        assert get(registry, "fabric_nvlink_errors_total", gpu="0", link="0", type=kind) == 0


def test_demo_traffic_follows_the_nccl_job():
    source, registry = demo()
    source.step(1.0, [])
    first = get(registry, "fabric_nvlink_transmit_bytes_total", gpu="3", link="7")
    source.step(11.0, [])
    second = get(registry, "fabric_nvlink_transmit_bytes_total", gpu="3", link="7")
    # 10 s of ring AllReduce (16 ranks) every 100 ms, spread over 18 links.
    expected = 10 / 0.1 * demo_nvml.ring_allreduce_bytes(16) / 18
    assert second - first == pytest.approx(expected, rel=0.001)
    assert get(registry, "fabric_nvlink_receive_bytes_total", gpu="3", link="7") == second
    hang = Fault("nccl_hang", None, 11.0, None, target={"rank": 9})
    source.step(20.0, [hang])
    assert get(registry, "fabric_nvlink_transmit_bytes_total", gpu="3", link="7") == second


def test_nvlink_down_fault_errors_rise_first_then_link_goes_inactive():
    source, registry = demo()
    fault = Fault("nvlink_down", "gpu-node-0", 10.0, 40.0, target={"gpu": 2, "link": 5},
                  params={"precursor_seconds": 5})
    faults = lambda t: [fault] if fault.start <= t < fault.end else []
    for t in range(0, 10):
        source.step(float(t), faults(float(t)))
    assert get(registry, "fabric_nvlink_errors_total", gpu="2", link="5", type="crc_flit") == 0
    crc = []
    for t in range(10, 15):                    # precursor: still up, errors climbing
        source.step(float(t), faults(float(t)))
        assert get(registry, "fabric_nvlink_state", gpu="2", link="5") == 1
        crc.append(get(registry, "fabric_nvlink_errors_total", gpu="2", link="5", type="crc_flit"))
    assert crc == sorted(crc) and crc[0] > 0 and crc[-1] > crc[0]
    assert get(registry, "fabric_nvlink_errors_total", gpu="2", link="5", type="replay") > 0
    source.step(15.0, faults(15.0))
    assert get(registry, "fabric_nvlink_state", gpu="2", link="5") == 0
    assert get(registry, "fabric_nvlink_state", gpu="2", link="4") == 1
    down_tx = get(registry, "fabric_nvlink_transmit_bytes_total", gpu="2", link="5")
    up_tx = get(registry, "fabric_nvlink_transmit_bytes_total", gpu="2", link="4")
    source.step(20.0, faults(20.0))
    assert get(registry, "fabric_nvlink_transmit_bytes_total", gpu="2", link="5") == down_tx
    assert get(registry, "fabric_nvlink_transmit_bytes_total", gpu="2", link="4") > up_tx
    assert get(registry, "fabric_nvlink_errors_total", gpu="2", link="5", type="recovery") == 1
    source.step(41.0, faults(41.0))            # fault over: the link is back
    assert get(registry, "fabric_nvlink_state", gpu="2", link="5") == 1


def nvml_present() -> bool:
    return ctypes.util.find_library("nvidia-ml") is not None


@pytest.mark.skipif(nvml_present(), reason="this host has libnvidia-ml: the no-NVML path cannot be shown here")
def test_no_nvml_on_host_is_a_reason_not_an_error():
    registry, _ = registry_for(Context(node="n"))
    assert get(registry, "fabric_nvml_available", reason="library_not_found") == 0
    assert get(registry, "fabric_scrape_collector_success", collector="nvlink") == 1
    names = {m.name for m in registry.collect()}
    assert "fabric_gpu_info" not in names and "fabric_nvlink_state" not in names


@pytest.mark.skipif(not nvml_present(), reason="libnvidia-ml is not installed on this host (no NVIDIA driver)")
def test_real_nvml_reports_every_gpu():
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    registry, collector = registry_for(Context(node="n"))
    try:
        assert get(registry, "fabric_nvml_available", reason="ok") == 1
        infos = [s for m in registry.collect() if m.name == "fabric_gpu_info" for s in m.samples]
        assert len(infos) == count
    finally:
        collector.close()


class OneBrokenGpu:
    """A backend whose GPU 1 fails, to show the others are still reported."""

    def gpus(self):
        return [GpuInfo(i, f"GPU-{i}", "test", f"0000:0{i}:00.0") for i in range(3)]

    def links(self, gpu):
        if gpu.index == 1:
            raise NvmlDeviceError("gpu_lost", "fell off the bus")
        return [LinkReading(link=0, active=True, tx_bytes=1024, rx_bytes=2048)]

    def close(self):
        pass


def test_one_unreadable_gpu_never_hides_the_others():
    registry, _ = registry_for(Context(node="n", sources={"nvml": OneBrokenGpu()}))
    assert get(registry, "fabric_nvlink_state", gpu="0", link="0") == 1
    assert get(registry, "fabric_nvlink_state", gpu="2", link="0") == 1
    assert get(registry, "fabric_nvlink_state", gpu="1", link="0") is None
    assert get(registry, "fabric_nvml_device_read_errors", gpu="1", reason="gpu_lost") == 1
    assert get(registry, "fabric_nvlink_receive_bytes_total", gpu="2", link="0") == 2048
    # Counters the GPU does not support (absent from the reading) are absent, never 0.
    assert get(registry, "fabric_nvlink_errors_total", gpu="0", link="0", type="replay") is None


class FakePynvml:
    """Stands in for nvidia-ml-py where no NVIDIA driver exists (CI), to check how the real
    backend maps NVML answers: enums, KiB, NOT_SUPPORTED, missing links. Two GPUs with
    two links each; link numbers >= 2 do not exist; GPU 1 answers NOT_SUPPORTED for
    CRC-data."""

    NVML_SUCCESS, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED = 0, 2, 3
    NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED = 12, 9
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT, NVML_NVLINK_ERROR_DL_CRC_DATA = 2, 3
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
    NVML_VALUE_TYPE_DOUBLE, NVML_VALUE_TYPE_UNSIGNED_INT, NVML_VALUE_TYPE_UNSIGNED_LONG = 0, 1, 2
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, NVML_VALUE_TYPE_SIGNED_LONG_LONG = 3, 4

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self):
        self.calls: dict[str, int] = {}

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, handle):
        return type("Pci", (), {"busId": f"00000000:{0x18 + handle:02X}:00.0".encode()})()

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= 2:
            raise self.NVMLError(self.NVML_ERROR_INVALID_ARGUMENT if link > 10 else self.NVML_ERROR_NOT_SUPPORTED)
        return 1

    def nvmlDeviceGetNvLinkVersion(self, handle, link):
        self._count("version")
        return 6                                   # NVML_NVLINK_VERSION_4_0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        self._count("remote_pci")
        return type("Pci", (), {"busId": b"00000000:C0:00.0"})()

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        return 2                                   # switch

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        if handle == 1 and counter == self.NVML_NVLINK_ERROR_DL_CRC_DATA:
            raise self.NVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return 10 * handle + counter

    def nvmlDeviceGetFieldValues(self, handle, fields):
        out = []
        for field_id, scope in fields:
            value = type("Value", (), {"ullVal": 1000 * (handle + 1) + scope + (field_id - 138) * 100})()
            out.append(type("Field", (), {"fieldId": field_id, "scopeId": scope, "nvmlReturn": 0,
                                          "valueType": self.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, "value": value})())
        return out


def test_real_backend_mapping_with_a_stand_in_nvml(monkeypatch):
    import sys

    fake = FakePynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    registry, collector = registry_for(Context(node="n"))
    assert get(registry, "fabric_nvml_available", reason="ok") == 1
    states = [s.labels for m in registry.collect() if m.name == "fabric_nvlink_state" for s in m.samples]
    assert sorted((s["gpu"], s["link"]) for s in states) == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]
    assert get(registry, "fabric_nvlink_info", gpu="1", link="1", version="4.0",
               remote_pci_bus_id="00000000:C0:00.0", remote_type="switch") == 1
    assert get(registry, "fabric_nvlink_transmit_bytes_total", gpu="1", link="1") == 2001 * 1024   # KiB
    assert get(registry, "fabric_nvlink_receive_bytes_total", gpu="1", link="1") == 2101 * 1024
    assert get(registry, "fabric_nvlink_errors_total", gpu="0", link="0", type="crc_data") == 3
    assert get(registry, "fabric_nvlink_errors_total", gpu="1", link="0", type="crc_data") is None
    assert get(registry, "fabric_nvlink_errors_total", gpu="1", link="0", type="replay") == 10
    assert registry.get_sample_value("fabric_gpu_info", {"gpu": "0", "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3",
                                                         "pci_bus_id": "00000000:18:00.0"}) == 1
    # Version and remote endpoint are read once per link, not on every scrape.
    assert fake.calls == {"version": 4, "remote_pci": 4}
    collector.close()
