"""fabric_nccl_rank_info on a real job: does each NCCL rank map to the GPU it computes on?

A 4-rank torch.distributed job runs under the exporter's nccl, nvlink and infiniband
collectors. Rank r is put on GPU (r + 1) mod 4, so an exporter that guessed "rank r is GPU r"
would fail. Each rank reports torch.cuda.current_device() and that device's PCI bus id; the
bus id is turned into an NVML index (what the exporter's `gpu` label is) and compared with
fabric_nccl_rank_info's gpu label for every rank. SLURM_JOB_ID is set in the job, so the
job_id label is checked too. Also printed: how many /dev/nvidiaN nodes each rank holds open
(the fallback used without NVML works only where that is one), and the GPU -> NIC affinity
the exporter reports next to `nvidia-smi topo -m` (compared where the host has NICs).

    bench/device/rank_gpu_map.sh                                   # 4 GPUs, PyTorch, root
    sudo .venv/bin/python bench/device/rank_gpu_map.py --backend fake   # here: fake libnccl, no GPUs

Prints its figures and writes $OUT/rank_gpu_map.json when OUT is set. About a minute.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nccl_straggler import (free_port, import_exporter, label, pick, ready_for_uprobes, scrape,
                            wait_until_traced)

# Ranks in the job, one GPU each: 4 by default; FABRIC_BENCH_WORLD on a host with fewer GPUs.
WORLD = int(os.environ.get("FABRIC_BENCH_WORLD", "4"))
JOB_ID = "771"
# nvidia-smi topo -m distances -> the exporter's path types.
TOPO_PATHS = {"PIX": "same_switch", "PXB": "same_switch", "PHB": "same_root_port", "NODE": "same_numa",
              "SYS": "cross_socket"}


def device_of(rank: int) -> int:
    return (rank + 1) % WORLD


def worker(rank: int, backend: str, library: str, port: int, ready, go, done, reports) -> None:
    if backend == "torch":
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(device_of(rank))
        torch.cuda.nccl.version()                 # libnccl loaded (and probed) before the comm exists
        ready.set()
        go.wait()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=rank, world_size=WORLD)
        current = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(current)
        bus = "%04x:%02x:%02x.0" % (getattr(props, "pci_domain_id", 0), getattr(props, "pci_bus_id", -1),
                                    getattr(props, "pci_device_id", -1))
        uuid = getattr(props, "uuid", None)
        reports[rank] = {"pid": os.getpid(), "current_device": current, "pci_bus_id": bus,
                         "uuid": f"GPU-{uuid}" if uuid is not None else None,
                         "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        grad = torch.ones(4 * 1024 * 1024, device=f"cuda:{current}")
        stop = torch.zeros(1, device=f"cuda:{current}")
        while True:
            dist.all_reduce(grad)
            # Every rank leaves after the same step: one that left early would leave its
            # peers waiting in an all_reduce forever.
            stop.fill_(1.0 if done.is_set() else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
            time.sleep(0.01)
        dist.destroy_process_group()
    else:
        lib = ctypes.CDLL(library)

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]

        ready.set()
        go.wait()
        uid, comm = UniqueId(), ctypes.c_void_p()
        lib.ncclGetUniqueId(ctypes.byref(uid))
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        lib.ncclCommInitRank(ctypes.byref(comm), WORLD, uid, rank)
        reports[rank] = {"pid": os.getpid(), "current_device": None, "pci_bus_id": None}
        done.wait()
        lib.ncclCommDestroy(comm)


def nvml_indices() -> dict[str, int]:
    """PCI bus id (lower case, 0000:xx:yy.0) and UUID (GPU-...) -> NVML index."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no GPU here (fake backend)
        print(f"NVML: {exc}")
        return {}
    out = {}
    for index in range(pynvml.nvmlDeviceGetCount()):
        bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        out[bus.lower()[-12:]] = index            # NVML gives an 8-digit domain: 00000000:18:00.0
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index))
        out[uuid.decode() if isinstance(uuid, bytes) else uuid] = index
    return out


def topo_matrix() -> tuple[str, dict[tuple[int, str], str]]:
    """`nvidia-smi topo -m` text and (gpu index, NIC device name) -> distance."""
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi topo -m: {exc}", {}
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    names = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, re.M))
    lines = [line.split() for line in text.splitlines() if line.strip()]
    header = next((line for line in lines if line and line[0].startswith("GPU0")), [])
    out = {}
    for line in lines:
        if line and re.fullmatch(r"GPU\d+", line[0]) and len(line) > len(header):
            for column, value in zip(header, line[1:]):
                if column in names:
                    out[(int(line[0][3:]), names[column])] = value
    return text, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["torch", "fake"], default="torch")
    args = parser.parse_args()
    if not ready_for_uprobes():
        return 2
    t0 = time.time()
    import_exporter()
    from fabricscope.exporter.context import Context
    from fabricscope.exporter.bpf_loader import objects
    from fabricscope.exporter.main import start_exporter
    from fabricscope.exporter.nccl.placement import device_minors

    library = ""
    if args.backend == "fake":
        from tests.nccl_fake.build import build_fake_nccl

        library = str(build_fake_nccl(Path(tempfile.mkdtemp(prefix="fake-nccl-")))[0])
    bpf_object = objects.object_path("nccl")
    if not bpf_object.is_file():
        print(f"{bpf_object} is missing: build it with `make bpf` and carry it here", file=sys.stderr)
        return 2
    port = free_port()
    ctx = Context(state_dir=Path(tempfile.mkdtemp(prefix="fabricscope-state-")), node=socket.gethostname(),
                  config={"nccl": {"rescan_seconds": 0.5, "bpf_object": str(bpf_object)}})
    exporter = start_exporter(ctx, ["nccl", "nvlink", "infiniband"], f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    results: dict = {"backend": args.backend, "host": socket.gethostname()}
    # In the ranks' environment from exec on: /proc/<pid>/environ never shows a later putenv.
    os.environ["SLURM_JOB_ID"] = JOB_ID
    spawn = mp.get_context("spawn")
    manager = spawn.Manager()
    reports = manager.dict()
    go, done = spawn.Event(), spawn.Event()
    readies = [spawn.Event() for _ in range(WORLD)]
    master = free_port()
    procs = [spawn.Process(target=worker, args=(r, args.backend, library, master, readies[r], go, done, reports),
                           daemon=True) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    status = 0
    try:
        wait_until_traced(readies, lambda: scrape(base), start_seconds=90, trace_seconds=30)
        go.set()
        deadline = time.time() + 60
        rows: dict[int, dict] = {}
        while time.time() < deadline:
            samples = scrape(base)
            rows = {int(label(k, "rank")): dict(k[1]) for k in pick(samples, "fabric_nccl_rank_info", nranks=WORLD)}
            # Placed once the exporter's worker looked the processes up (job, and GPU with CUDA).
            if len(reports) == WORLD and len(rows) >= WORLD and all(
                    r["job_id"] and (args.backend == "fake" or r["gpu"]) for r in rows.values()):
                break
            time.sleep(1)
        else:
            comms = [dict(k[1]) for k in pick(samples, "fabric_nccl_comm_info")]
            attached = [dict(k[1]) for k in pick(samples, "fabric_nccl_probe_attached")]
            raise SystemExit(f"fabric_nccl_rank_info did not list {WORLD} placed ranks within 60 s: {rows}; "
                             f"reports {dict(reports)}; comm_info {comms}; probes {attached}")
        buses = nvml_indices()
        checks = []
        for rank in range(WORLD):
            job = dict(reports[rank])
            expected = buses.get((job["pci_bus_id"] or "").lower(), buses.get(job.get("uuid") or ""))
            row = rows.get(rank, {})
            minors = sorted(device_minors(Path("/proc"), job["pid"]))
            checks.append({"rank": rank, "torch_current_device": job["current_device"],
                           "pci_bus_id": job["pci_bus_id"], "nvml_index_of_that_device": expected,
                           "exporter_gpu": row.get("gpu"), "exporter_job_id": row.get("job_id"),
                           "match": expected is not None and row.get("gpu") == str(expected),
                           "job_match": row.get("job_id") == f"slurm:{JOB_ID}",
                           "dev_nvidia_nodes_open": minors})
            print(f"rank {rank}: torch.cuda.current_device()={job['current_device']} bus {job['pci_bus_id']} "
                  f"-> NVML GPU {expected}; fabric_nccl_rank_info gpu={row.get('gpu')!r} job_id={row.get('job_id')!r}; "
                  f"/dev/nvidiaN open: {minors}; {'MATCH' if checks[-1]['match'] else 'MISMATCH'}")
        results["ranks"] = checks
        results["ranks_matched"] = sum(c["match"] for c in checks)
        results["jobs_matched"] = sum(c["job_match"] for c in checks)
        print(f"ranks mapped to the GPU torch reports: {results['ranks_matched']}/{WORLD}; "
              f"job_id label slurm:{JOB_ID}: {results['jobs_matched']}/{WORLD}")
        if args.backend == "torch" and results["ranks_matched"] != WORLD:
            status = 1
        # GPU -> NIC
        affinity = [dict(k[1]) for k in pick(scrape(base), "fabric_gpu_nic_affinity_info")]
        topo_text, topo = topo_matrix()
        ib = Path("/sys/class/infiniband")
        nics = sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []
        results["infiniband_devices"] = nics
        results["affinity"] = affinity
        print("nvidia-smi topo -m:\n" + topo_text)
        if not nics:
            print(f"this host has no InfiniBand/RoCE NICs ({ib} absent or empty): fabric_gpu_nic_affinity_info "
                  f"has {len(affinity)} series (expected 0); nothing to compare with nvidia-smi topo -m")
            results["affinity_check"] = "no_nics" if not affinity else "unexpected_series"
        else:
            compared = []
            for row in affinity:
                smi = topo.get((int(row["gpu"]), row["device"]))
                compared.append({**row, "nvidia_smi": smi, "agrees": TOPO_PATHS.get(smi) == row["path"]})
                print(f"GPU {row['gpu']} -> {row['device']} port {row['port']}: {row['path']}; "
                      f"nvidia-smi {smi}")
            results["affinity_check"] = compared
    except SystemExit as exc:
        print(f"ABORTED: {exc}")
        results["error"] = str(exc)
        status = 1
    finally:
        done.set()
        deadline = time.time() + 20
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.time()))
            if proc.is_alive():
                proc.kill()
        exporter.stop()
        manager.shutdown()
    results["seconds"] = round(time.time() - t0, 1)
    print(f"total {results['seconds']} s")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "rank_gpu_map.json").write_text(json.dumps(results, indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
