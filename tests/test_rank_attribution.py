"""Rank -> process -> GPU -> NIC on one node: fabric_nccl_rank_info and fabric_gpu_nic_affinity_info."""
from __future__ import annotations

import os
import random
from pathlib import Path

from prometheus_client import CollectorRegistry

from fabricscope.demo.sources import nccl as demo_nccl
from fabricscope.demo.sources import nvml as demo_nvml
from fabricscope.exporter.collectors.infiniband import InfiniBandCollector
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules
from fabricscope.exporter.health.gpu_nic_affinity import NicCandidate, nearest_nics, path_type
from fabricscope.exporter.health.nic_roles import Gpu
from fabricscope.exporter.nccl.placement import RankInfo, RankPlacement, RankProcess, job_of
from fabricscope.exporter.nvml import GpuInfo
from test_nccl_demo import cluster

FIXTURE = Path(__file__).parent / "fixtures" / "node"


def registry_of(collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector([collector], node=""))
    return registry


def samples(registry, name):
    return sorted(tuple(sorted(s.labels.items())) for f in registry.collect() for s in f.samples if s.name == name)


# ---- GPU -> NIC ---------------------------------------------------------------------------

def test_fixture_node_pairs_each_gpu_with_the_hca_on_its_switch(tmp_path):
    collector = InfiniBandCollector(Context(sysfs=FIXTURE / "sys", procfs=FIXTURE / "proc", state_dir=tmp_path))
    rows = samples(registry_of(collector), "fabric_gpu_nic_affinity_info")
    # GPU 0's switch holds mlx5_0 and mlx5_5 (two functions): the lower address wins.
    assert [dict(r) for r in rows] == [
        {"gpu": str(i), "device": f"mlx5_{i}", "port": "1", "path": "same_switch"} for i in range(4)]


ROOT = "/sys/devices/pci0000:00/0000:00:01.0"
OTHER_ROOT = "/sys/devices/pci0000:00/0000:00:02.0"


def test_path_types_nearest_first():
    gpu = Gpu(f"{ROOT}/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0)
    assert path_type(gpu, NicCandidate("a", f"{ROOT}/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0, 1)) == "same_switch"
    assert path_type(gpu, NicCandidate("b", f"{ROOT}/0000:05:00.0", 0, 1)) == "same_root_port"
    assert path_type(gpu, NicCandidate("c", f"{OTHER_ROOT}/0000:06:00.0", 0, 1)) == "same_numa"
    assert path_type(gpu, NicCandidate("d", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", 1, 1)) \
        == "cross_socket"
    assert path_type(gpu, NicCandidate("e", None, None, 1)) == "unknown"
    # A GPU alone on its root port never "shares" it with the NIC's: the devices themselves differ.
    lone = Gpu(f"{OTHER_ROOT}/0000:07:00.0", 0)
    assert path_type(lone, NicCandidate("c", f"{OTHER_ROOT}/0000:06:00.0", 0, 1)) == "same_root_port"


def test_two_gpus_sharing_a_switch_with_two_nics_get_one_each():
    switch = f"{ROOT}/0000:01:00.0"
    gpus = [Gpu(f"{switch}/0000:02:03.0/0000:06:00.0", 0), Gpu(f"{switch}/0000:02:02.0/0000:05:00.0", 0)]
    nics = [NicCandidate("mlx5_1", f"{switch}/0000:02:01.0/0000:04:00.0", 0, 1),
            NicCandidate("mlx5_0", f"{switch}/0000:02:00.0/0000:03:00.0", 0, 1),
            NicCandidate("mlx5_9", f"{OTHER_ROOT}/0000:09:00.0", 0, None)]      # no port: never chosen
    got = [(a.gpu, a.device, a.path) for a in nearest_nics(gpus, nics)]
    assert got == [(0, "mlx5_0", "same_switch"), (1, "mlx5_1", "same_switch")]


def test_no_nics_or_no_gpus_no_rows():
    assert nearest_nics([Gpu(f"{ROOT}/0000:04:00.0", 0)], []) == []
    assert nearest_nics([], [NicCandidate("mlx5_0", f"{ROOT}/0000:03:00.0", 0, 1)]) == []


# ---- process -> GPU, job ------------------------------------------------------------------

def fake_process(procfs: Path, pid: int, environ: dict | None = None, cgroup: str = "",
                 devices: tuple[int, ...] = ()) -> None:
    base = procfs / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (environ or {}).items()) + b"\0")
    (base / "cgroup").write_text(cgroup)
    for fd, minor in enumerate(devices, start=3):
        os.symlink(f"/dev/nvidia{minor}", base / "fd" / str(fd))
    os.symlink("/dev/nvidiactl", base / "fd" / "20")       # every CUDA process has these too
    os.symlink("/dev/nvidia-uvm", base / "fd" / "21")


def test_job_from_slurm_then_torchelastic_then_kubernetes_pod(tmp_path):
    fake_process(tmp_path, 10, {"SLURM_JOB_ID": "81234", "TORCHELASTIC_RUN_ID": "x"})
    fake_process(tmp_path, 11, {"TORCHELASTIC_RUN_ID": "run-7"})
    fake_process(tmp_path, 12, cgroup="0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-"
                                      "pod1b2c3d4e_0f1a_4b5c_8d9e_0123456789ab.slice/cri-containerd-ab.scope\n")
    fake_process(tmp_path, 13, {"HOME": "/root"}, cgroup="0::/user.slice\n")
    assert [job_of(tmp_path, pid) for pid in (10, 11, 12, 13)] == [
        "slurm:81234", "torchelastic:run-7", "k8s-pod:1b2c3d4e-0f1a-4b5c-8d9e-0123456789ab", ""]


class HungNvml:
    """A GPU that never answers (NVML blocks for as long as the fault lasts)."""

    def __init__(self):
        self.release = __import__("threading").Event()

    def gpus(self):
        return [GpuInfo(0, "u0", "H100", "0000:18:00.0")]

    def running_processes(self, gpu):
        self.release.wait(30)
        return [(60, 1 << 30)]


def test_a_hung_gpu_never_blocks_the_scrape(tmp_path):
    import time

    fake_process(tmp_path, 60, {"SLURM_JOB_ID": "9"})
    nvml = HungNvml()
    placement = RankPlacement(tmp_path, nvml=lambda: nvml, wait_seconds=0.2)
    started = time.monotonic()
    assert placement.resolve([RankProcess("c", 0, 1, 60)])[0].gpu == ""
    assert placement.resolve([RankProcess("c", 0, 1, 60)])[0].gpu == ""      # still stuck: served at once
    assert time.monotonic() - started < 1.0
    nvml.release.set()
    placement.wait()
    assert placement.resolve([RankProcess("c", 0, 1, 60)]) == [RankInfo("c", 0, 1, "0", "slurm:9")]


def test_hostile_job_values_are_dropped_not_exported(tmp_path):
    fake_process(tmp_path, 20, {"SLURM_JOB_ID": "1 2\"}", "TORCHELASTIC_RUN_ID": "r" * 200})
    assert job_of(tmp_path, 20) == ""
    assert job_of(tmp_path, 999) == ""                      # gone: nothing, no exception


def test_gpu_from_the_one_device_node_a_process_holds(tmp_path):
    driver = tmp_path / "driver" / "nvidia" / "gpus"
    for bus, minor in (("0000:18:00.0", 1), ("0000:2a:00.0", 0)):     # minors not in PCI order
        (driver / bus).mkdir(parents=True)
        (driver / bus / "information").write_text(f"Model: H100\nIRQ: 1\nDevice Minor: {minor}\n")
    fake_process(tmp_path, 30, devices=(0,))
    fake_process(tmp_path, 31, devices=(0, 1))                 # every visible GPU open: cannot tell
    placement = RankPlacement(tmp_path, nvml=lambda: None, background=False)
    got = placement.resolve([RankProcess("c", 0, 2, 30), RankProcess("c", 1, 2, 31)])
    assert [(r.rank, r.gpu) for r in got] == [(0, "1"), (1, "")]


class TwoGpuNvml:
    """NVML's answer for a rank that also holds a small context on GPU 0."""

    def __init__(self):
        self.calls = 0

    def gpus(self):
        return [GpuInfo(0, "u0", "H100", "0000:18:00.0"), GpuInfo(1, "u1", "H100", "0000:2a:00.0")]

    def running_processes(self, gpu):
        self.calls += 1
        return {0: [(40, 500 << 20), (41, 60 << 30)], 1: [(40, 70 << 30)]}[gpu.index]


def test_nvml_picks_the_gpu_holding_most_memory_and_is_asked_once(tmp_path):
    fake_process(tmp_path, 40, {"SLURM_JOB_ID": "5"})
    fake_process(tmp_path, 41)
    nvml = TwoGpuNvml()
    placement = RankPlacement(tmp_path, nvml=lambda: nvml, background=False)
    ranks = [RankProcess("c", 0, 2, 40), RankProcess("c", 1, 2, 41)]
    first = placement.resolve(ranks)
    assert [(r.rank, r.gpu, r.job_id) for r in first] == [(0, "1", "slurm:5"), (1, "0", "")]
    assert placement.resolve(ranks) == first and nvml.calls == 2      # cached per process


# ---- the demo node: rank i on GPU i, through the real nccl collector -----------------------

def test_demo_ranks_map_to_their_gpus_as_on_a_rail_optimised_node(tmp_path):
    spec = cluster(nodes=2, gpus=4)
    node = spec.nodes[1]
    nccl = demo_nccl.NcclSimSource(node, spec, random.Random(5), epoch=1_800_000_000.0)
    nvml = demo_nvml.NvmlSimSource(node, spec, random.Random(5))
    load_collector_modules()
    [collector] = build_collectors(Context(node=node.name, procfs=tmp_path, sources={"nccl": nccl, "nvml": nvml}), ["nccl"])
    try:
        registry = registry_of(collector)
        first = [dict(r) for r in samples(registry, "fabric_nccl_rank_info")]
        collector.placement.wait()                    # looked up off the scrape path
        rows = [dict(r) for r in samples(registry, "fabric_nccl_rank_info")]
    finally:
        collector.close()
    assert {r["gpu"] for r in first} <= {"", *map(str, range(4))}
    comm = demo_nccl.job_comm(spec)
    assert rows == [{"comm": comm, "rank": str(4 + i), "nranks": "8", "gpu": str(i), "job_id": ""} for i in range(4)]


# ---- ingest: a job that reports its own operations names its process ------------------------

def test_ingested_records_with_a_pid_place_their_rank(tmp_path):
    import json

    driver = tmp_path / "driver" / "nvidia" / "gpus" / "0000:18:00.0"
    driver.mkdir(parents=True)
    (driver / "information").write_text("Device Minor: 0\n")
    fake_process(tmp_path, 50, {"TORCHELASTIC_RUN_ID": "ft-3"}, devices=(0,))
    load_collector_modules()
    ctx = Context(node="n", procfs=tmp_path, config={"nccl": {"ingest": True, "uprobes": False}})
    [collector] = build_collectors(ctx, ["nccl"])
    try:
        record = {"op": "AllReduce", "comm": "job-42", "rank": 1, "nranks": 2, "bytes": 4, "start": 1.8e9}
        status, _, body = collector.ingest.post_operations(json.dumps({**record, "pid": 1 << 22}).encode(), {})
        assert status == 400 and json.loads(body)["field"] == "pid", body
        status, _, body = collector.ingest.post_operations(json.dumps({**record, "pid": "50"}).encode(), {})
        assert status == 400 and json.loads(body)["field"] == "pid", body
        assert samples(registry_of(collector), "fabric_nccl_rank_info") == []      # nothing stored
        status, _, _ = collector.ingest.post_operations(json.dumps({**record, "pid": 50}).encode(), {})
        assert status == 202
        samples(registry_of(collector), "fabric_nccl_rank_info")
        collector.placement.wait()
        rows = [dict(r) for r in samples(registry_of(collector), "fabric_nccl_rank_info")]
    finally:
        collector.close()
    assert rows == [{"comm": "job-42", "rank": "1", "nranks": "2", "gpu": "0", "job_id": "torchelastic:ft-3"}]
