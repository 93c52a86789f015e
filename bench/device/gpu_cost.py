"""The exporter's GPU-side cost on a real host: NVLink before and after, and the whole
exporter's CPU share and RSS during a busy PyTorch job.

Part 1, NVML (no job yet):
  * per-call cost on GPU 0 of every call the nvlink sampler may make (wall and CPU), and
    which batched fields the driver answers;
  * "before": the old synchronous collector's call pattern (link states, one throughput
    batch, one error-counter call per link and type, GPU after GPU), timed directly;
  * "after": each tier's round per GPU (exporter/nvml/sampler.py), GPU after GPU, its wall
    time and CPU: the gpu tier (link states), the link tier gated (GPU error totals
    unchanged: the per-link counters they cover not read) and reading every per-link
    counter; where each round's CPU goes, call by call; the full link rounds of all GPUs at
    once (driver contention); how each GPU reads its error counters and the cost per value it
    measured; and the sampling CPU share for 4 and 8 GPUs at the default intervals.
Part 2, a 4-rank DDP job (one GPU each; an MLP whose 64 MB of gradients DDP all-reduces in
4 MB buckets, ~20 steps a second; 8 DataLoader workers per rank), with one exporter process per collector set running side
by side ("all", "all but nccl", "nvlink only", and "all" without the malloc arena cap), each scraped every --scrape-interval
seconds. After a warm-up, over --seconds: CPU share (/proc/<pid>/stat), RSS, scrape and
nvlink-collector durations, the age of the NVLink samples served, the CPU of the sampling
threads per tier, NCCL calls counted per second, and the node's process count.

    bench/device/gpu_cost.sh        # as root on the GPU host; $OUT/gpu_cost.{json,txt} when OUT is set
    sudo .venv/bin/python bench/device/gpu_cost.py --simulate --seconds 30   # here: the orchestration only

Needs root, PyTorch with NCCL, nvidia-ml-py, kernel BTF, libbpf, and the BPF objects
(built elsewhere: bench/device/README.md lists what to carry). About 5 minutes.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))          # bench/: exporter_process

from exporter_process import ALL, ExporterProcess, measured_window  # noqa: E402
from measure import percentile, py_spy, stat_cpu_seconds  # noqa: E402
from nvml_old_path import read_as_the_old_collector  # noqa: E402
from nccl_straggler import fetch, free_port, import_exporter, parse, pick, scrape  # noqa: E402

# Ranks in the job, one GPU each: 4 by default; FABRIC_BENCH_WORLD on a host with fewer GPUs.
WORLD = int(os.environ.get("FABRIC_BENCH_WORLD", "4"))
SETS = {"all": ALL, "all but nccl": [c for c in ALL if c != "nccl"], "nvlink only": ["nvlink"],
        "all 512 arenas": ALL}
lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


# ---- part 1: NVML ------------------------------------------------------------------------------

def timed(function, *args) -> tuple[float, float, object]:
    """(wall s, CPU s of this thread, result or the exception) of one call."""
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        result = function(*args)
    except Exception as exc:  # noqa: BLE001 - NOT_SUPPORTED etc.: the cost still counts
        result = exc
    return time.perf_counter() - wall, time.thread_time() - cpu, result


def call_row(samples: list[tuple[float, float, object]], values: int = 1) -> dict:
    """Median wall and CPU of timed() calls, and how many answered."""
    return {"calls": len(samples), "values_per_call": values,
            "answered": sum(not isinstance(r, Exception) for _, _, r in samples),
            "wall_ms_median": statistics.median(w for w, _, _ in samples) * 1e3,
            "cpu_ms_median": statistics.median(c for _, c, _ in samples) * 1e3}


def simulated_nvml():
    """--simulate: the demo's simulated NVML (H200 per-call costs), WORLD GPUs."""
    import random

    from fabricscope.demo.plugin import ClusterSpec, NodeSpec
    from fabricscope.demo.sources.nvml import NvmlSimSource

    node = NodeSpec("sim", 0, WORLD, 1, Path("/nonexistent"))
    return NvmlSimSource(node, ClusterSpec("sim", (node,), 1), random.Random(1))


class CallTimer:
    """The backend, with the CPU of every call the sampler makes summed by call (field-values
    calls by their first field and size): where a round's CPU goes."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.cpu: dict[str, float] = {}

    def reset(self) -> None:
        self.cpu = {}

    def per_round(self, rounds: int) -> dict[str, float]:
        return {call: seconds / rounds * 1e3 for call, seconds in sorted(self.cpu.items(), key=lambda kv: -kv[1])}

    def __getattr__(self, name: str):
        function = getattr(self.backend, name)
        if name not in ("link_states", "link_static", "field_values", "error_counter", "nvlink_bytes_moved"):
            return function

        def timed_call(*args):
            label = name
            if name == "field_values":
                fields = args[1]
                scope = "total" if fields and fields[0][1] == 0xFFFFFFFF else "per-link"
                label = f"field_values {scope} x{len(fields)}"
            cpu = time.thread_time()
            try:
                return function(*args)
            finally:
                self.cpu[label] = self.cpu.get(label, 0.0) + time.thread_time() - cpu
        return timed_call


def nvml_part(results: dict, simulate: bool, interval: float, link_interval: float) -> None:
    from fabricscope.exporter.nvml import open_backend
    from fabricscope.exporter.nvml.backend import (ERROR_TYPES, FI_NVLINK_ERROR_DL_CRC, FI_NVLINK_ERROR_DL_RECOVERY,
                                                   FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_THROUGHPUT_DATA_RX,
                                                   FI_NVLINK_THROUGHPUT_DATA_TX, error_field)
    from fabricscope.exporter.nvml.sampler import GATE_SAFETY_INTERVALS, GpuSampler

    backend = simulated_nvml() if simulate else open_backend()
    gpus = backend.gpus()
    gpu = gpus[0]
    links = sorted(backend.link_states(gpu))
    say(f"NVML: {len(gpus)} GPUs ({gpu.name}), GPU 0 has {len(links)} NVLinks")
    calls: dict[str, dict] = {}

    def record(name: str, samples: list[tuple[float, float, object]], values: int = 1) -> None:
        calls[name] = call_row(samples, values)

    record("nvmlDeviceGetNvLinkState (all links)", [timed(backend.link_states, gpu) for _ in range(5)], len(links))
    record("version + remote PCI + remote type", [timed(backend.link_static, gpu, link) for link in links])
    for kind in ERROR_TYPES:
        record(f"nvmlDeviceGetNvLinkErrorCounter {kind}",
               [timed(backend.error_counter, gpu, link, kind) for link in links])
    batches = {
        "field values: throughput TX+RX per link": [(f, link) for f in (FI_NVLINK_THROUGHPUT_DATA_TX,
                                                                        FI_NVLINK_THROUGHPUT_DATA_RX) for link in links],
        "field values: throughput TX+RX GPU total": [(FI_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
                                                     (FI_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF)],
        "field values: DL CRC/replay/recovery per link": [(f, link) for f in (FI_NVLINK_ERROR_DL_CRC,
                                                          FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY)
                                                          for link in links],
        # The sampler's gate: per-link counters are read when one of these totals moves.
        "field values: DL CRC/replay/recovery GPU total": [(FI_NVLINK_ERROR_DL_CRC, 0xFFFFFFFF),
                                                          (FI_NVLINK_ERROR_DL_REPLAY, 0xFFFFFFFF),
                                                          (FI_NVLINK_ERROR_DL_RECOVERY, 0xFFFFFFFF)],
        "field values: legacy CRC-data per link (0-11)": [ids for ids in (error_field("crc_data", link)
                                                                          for link in links) if ids],
        "field values: legacy error totals (38,45,52,59)": [(38, 0), (45, 0), (52, 0), (59, 0)],
    }
    for name, fields in batches.items():
        samples = [timed(backend.field_values, gpu, fields) for _ in range(3)]
        answered = [r for _, _, r in samples if isinstance(r, list)]
        record(name, samples, len(fields))
        calls[name]["fields_answered"] = sum(v is not None for v in answered[0]) if answered else 0
    say(f"{'call (GPU 0)':<50} {'values':>6} {'answered':>8} {'wall ms':>8} {'CPU ms':>7}")
    for name, c in calls.items():
        answered = c.get("fields_answered", c["answered"])
        say(f"{name:<50} {c['values_per_call']:>6} {answered:>8} {c['wall_ms_median']:8.3f} {c['cpu_ms_median']:7.3f}")

    def old_path() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        read_as_the_old_collector(backend, gpus)
        return time.perf_counter() - wall, time.process_time() - cpu

    before = [old_path() for _ in range(3)]
    timing = CallTimer(backend)
    samplers = [GpuSampler(timing, g, interval, link_interval) for g in gpus]

    def rounds_of(link_round: bool, repeats: int) -> dict[int, list[tuple[float, float]]]:
        """(wall s, CPU s) of rounds of every GPU, one GPU after another (as the exporter's
        staggered phases run them)."""
        out: dict[int, list[tuple[float, float]]] = {g.index: [] for g in gpus}
        for _ in range(repeats):
            for s in samplers:
                wall, cpu = time.perf_counter(), time.thread_time()
                s.latest = s.sample_once(link_round)
                out[s.gpu.index].append((time.perf_counter() - wall, time.thread_time() - cpu))
        return out

    rounds_of(True, 1)                                 # the first settles each GPU's plan
    settled = [dict(s.gate_rounds) for s in samplers]
    timing.reset()
    link_rounds = rounds_of(True, 3)                   # error totals unchanged: gated (a total that moves opens it)
    gated_calls = timing.per_round(3 * len(gpus))
    gate = {g.index: {k: v - settled[i][k] for k, v in samplers[i].gate_rounds.items()} for i, g in enumerate(gpus)}
    for s in samplers:                                 # every per-link counter read, as after a total moved
        s.gate_safety = 0.0
    timing.reset()
    full_rounds = rounds_of(True, 3)
    full_calls = timing.per_round(3 * len(gpus))
    timing.reset()
    gpu_rounds = rounds_of(False, 5)
    gpu_calls = timing.per_round(5 * len(gpus))

    def parallel_link_round(s: GpuSampler, cpus: list) -> None:
        cpu = time.thread_time()
        s.latest = s.sample_once(True)
        cpus.append(time.thread_time() - cpu)

    parallel_cpu: list[float] = []
    wall = time.perf_counter()
    threads = [threading.Thread(target=parallel_link_round, args=(s, parallel_cpu)) for s in samplers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    parallel = time.perf_counter() - wall
    reads = {g.index: samplers[i].latest.error_reads for i, g in enumerate(gpus)}
    gated = {g.index: samplers[i].latest.gated for i, g in enumerate(gpus)}
    costs = {g.index: {m: c * 1e3 for m, c in samplers[i].latest.read_costs.items()} for i, g in enumerate(gpus)}
    link_cpu = statistics.median(c for r in full_rounds.values() for _, c in r)
    link_wall = statistics.median(w for r in full_rounds.values() for w, _ in r)
    gated_cpu = statistics.median(c for r in link_rounds.values() for _, c in r)
    gated_wall = statistics.median(w for r in link_rounds.values() for w, _ in r)
    gpu_cpu = statistics.median(c for r in gpu_rounds.values() for _, c in r)
    # Steady state: gated rounds, and every GATE_SAFETY_INTERVALS-th round (the safety read) a full one.
    steady_cpu = ((GATE_SAFETY_INTERVALS - 1) * gated_cpu + link_cpu) / GATE_SAFETY_INTERVALS
    say(f"before: old synchronous path, {len(gpus)} GPUs one after another: "
        f"{statistics.median(b[0] for b in before) * 1e3:.0f} ms wall, {statistics.median(b[1] for b in before) * 1e3:.0f} ms "
        f"CPU per scrape")
    say(f"after, one GPU's round, GPUs one after another: gpu tier (link states) {gpu_cpu * 1e3:.2f} ms CPU; "
        f"link tier (with the gpu tier) gated, GPU error totals unchanged ({gated[gpus[0].index]} counters not read) "
        f"{gated_wall * 1e3:.1f} ms wall, {gated_cpu * 1e3:.1f} ms CPU; reading every per-link counter "
        f"{link_wall * 1e3:.0f} ms wall, {link_cpu * 1e3:.1f} ms CPU; all {len(gpus)} GPUs' full link rounds at once: "
        f"{parallel * 1e3:.0f} ms wall, {statistics.median(parallel_cpu) * 1e3:.1f} ms CPU per GPU")
    say(f"gate outcomes of the gated rounds, GPU 0: {gate[gpus[0].index]}")
    for name, per_call in (("gpu tier", gpu_calls), ("gated link round", gated_calls), ("full link round", full_calls)):
        say(f"where a {name}'s CPU goes (ms per GPU round): "
            + ", ".join(f"{call} {ms:.3f}" for call, ms in per_call.items()))
    say(f"error counters read per GPU 0 link round: {reads[gpus[0].index]}; measured ms per value: "
        f"{ {m: round(c, 3) for m, c in costs[gpus[0].index].items()} }")
    for n in (4, 8):                                  # per-GPU figures times a node's GPUs
        say(f"sampling CPU share, {n} GPUs: {n * (gpu_cpu / interval + steady_cpu / link_interval) * 100:.3f}% of a "
            f"core (gpu tier {interval:g} s, link tier {link_interval:g} s, error totals unchanged: "
            f"{GATE_SAFETY_INTERVALS - 1} gated rounds in {GATE_SAFETY_INTERVALS}); "
            f"{n * (gpu_cpu / interval + link_cpu / link_interval) * 100:.3f}% while errors climb (every "
            f"link round full); {n * link_cpu / interval * 100:.2f}% reading everything every {interval:g} s "
            f"(gpu-tier rounds here run back to back: the exporter's, after a wait, cost more)")
    results["nvml"] = {"gpus": len(gpus), "gpu_name": gpu.name, "links": len(links), "calls": calls,
                       "old_path_wall_s": [b[0] for b in before], "old_path_cpu_s": [b[1] for b in before],
                       "link_round_wall_cpu_s": full_rounds, "gated_link_round_wall_cpu_s": link_rounds,
                       "gpu_round_wall_cpu_s": gpu_rounds, "gate_outcomes": gate, "gated_counters": gated,
                       "round_cpu_ms_by_call": {"gpu": gpu_calls, "gated_link": gated_calls, "full_link": full_calls},
                       "parallel_link_round_wall_s": parallel, "parallel_link_round_cpu_s": parallel_cpu,
                       "error_reads": reads, "read_cost_ms": costs}
    backend.close()


# ---- part 2: the job ------------------------------------------------------------------------------

def fake_rank_main(rank: int, port: int, stop, steps, step_seconds: float) -> None:
    """--simulate: a rank over the fake libnccl (tests/nccl_fake), forking 8 idle "DataLoader
    workers" that map the library, calling ncclAllReduce ~200 times a second."""
    import ctypes

    library = os.environ["GPU_COST_FAKE_NCCL"]
    lib = ctypes.CDLL(library)
    workers = []
    for _ in range(8):
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        workers.append(pid)

    class UniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_char * 128)]

    uid, comm = UniqueId(), ctypes.c_void_p()
    lib.ncclGetUniqueId(ctypes.byref(uid))
    lib.ncclCommInitRank(ctypes.byref(comm), WORLD, uid, rank)
    buf = (ctypes.c_float * 1024)()
    while not stop.is_set():
        time.sleep(0.005)
        lib.ncclAllReduce(buf, buf, ctypes.c_size_t(1024), 7, 0, comm, None)
        with steps.get_lock():
            steps.value += 1
    lib.ncclCommDestroy(comm)
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class SyntheticSamples:
    """A map-style data set of random samples. At module level: DataLoader workers are
    spawned processes, which unpickle the data set by its qualified name."""

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int):
        import torch
        return torch.randn(1024), torch.randn(1024)


def rank_main(rank: int, port: int, stop, steps, step_seconds: float) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    torch.cuda.set_device(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=WORLD)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(16)]).cuda()
    # Small buckets: several all-reduces per step, as a larger model's backward makes.
    ddp = DistributedDataParallel(model, device_ids=[rank], bucket_cap_mb=4)
    optimiser = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    loader = DataLoader(SyntheticSamples(), batch_size=256, num_workers=8, persistent_workers=True, prefetch_factor=4)
    for x, y in loader:
        if stop.is_set():
            break
        # The rest of a real step's compute: a training job runs a few steps a second, not
        # as many as an MLP allows (that would be a collective-rate stress, not a busy node).
        time.sleep(step_seconds)
        loss = torch.nn.functional.mse_loss(ddp(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        loss.item()                                   # the per-step synchronisation
        with steps.get_lock():
            steps.value += 1
    dist.destroy_process_group()


def present_gpus(count: int) -> None:
    """Show this process `count` GPUs on a host with fewer (--present-gpus): GPU i is
    physical GPU i % n, so every NVML call of an 8-GPU node's sampling reaches real hardware,
    half of them twice. Bench only: the labels of the extra GPUs repeat the physical ones'
    UUIDs."""
    import pynvml

    real_count, real_handle = pynvml.nvmlDeviceGetCount, pynvml.nvmlDeviceGetHandleByIndex
    pynvml.nvmlDeviceGetCount = lambda: count
    pynvml.nvmlDeviceGetHandleByIndex = lambda index: real_handle(index % real_count())


def exporter_child(argv: list[str]) -> int:
    """`gpu_cost.py --exporter-child ...`: the exporter CLI from the source tree."""
    import argparse as ap

    import_exporter()
    if os.environ.get("GPU_COST_PRESENT_GPUS"):
        present_gpus(int(os.environ["GPU_COST_PRESENT_GPUS"]))
    from fabricscope.exporter.main import add_arguments, run

    parser = ap.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(argv))


class Exporter(ExporterProcess):
    def __init__(self, name: str, collectors: list[str], work: Path, config: Path) -> None:
        super().__init__(name, [sys.executable, str(Path(__file__).resolve()), "--exporter-child"], collectors,
                         free_port(), work, [f"--config.file={config}", "--node-name=gpu-cost"])
        self.scrapes: list[dict] = []
        self.scrape_seconds: list[float] = []
        self.latency_seconds: list[float] = []

    def wait_ready(self, timeout: float = 90) -> None:
        super().wait_ready(lambda: scrape(self.base), timeout)

    def scrape(self) -> dict:
        # The HTTP request alone: parsing the text here, in Python, can take longer than
        # the exporter takes to answer, and is not the exporter's latency.
        start = time.perf_counter()
        body = fetch(self.base)
        self.scrape_seconds.append(time.perf_counter() - start)
        samples = parse(body)
        self.scrapes.append(samples)
        return samples


def values(samples: dict, name: str, **labels) -> list[float]:
    return list(pick(samples, name, **labels).values())


def job_part(args, results: dict, work: Path) -> None:
    config = work / "exporter.yml"
    config.write_text(f"nvlink:\n  sample_interval_seconds: {args.nvlink_interval}\n"
                      f"  link_sample_interval_seconds: {args.nvlink_link_interval}\n"
                      "  series: full\n")   # the per-GPU sampler figures read below
    ctx = mp.get_context("spawn")
    stop, steps = ctx.Event(), ctx.Value("q", 0)        # steps summed over every rank
    if args.simulate:
        sys.path.insert(0, str(ROOT))
        from tests.nccl_fake.build import build_fake_nccl

        os.environ["GPU_COST_FAKE_NCCL"] = str(build_fake_nccl(work)[0])
    target = fake_rank_main if args.simulate else rank_main
    # --jobs K: K data-parallel jobs side by side on the same GPUs (K x WORLD ranks).
    ports = [free_port() for _ in range(args.jobs)]
    ranks = [ctx.Process(target=target, args=(rank, job_port, stop, steps, args.step_seconds))
             for job_port in ports for rank in range(WORLD)]
    if args.present_gpus:
        os.environ["GPU_COST_PRESENT_GPUS"] = str(args.present_gpus)
    exporters = [Exporter(name, SETS[name], work, config) for name in args.sets]
    profiler = None
    try:
        for exporter in exporters:
            exporter.wait_ready()
        for rank in ranks:
            rank.start()
        deadline = time.monotonic() + 240
        while steps.value < 50 * len(ranks):
            if time.monotonic() > deadline or not all(r.is_alive() for r in ranks):
                raise SystemExit("the PyTorch job did not start training (see the ranks' output above)")
            time.sleep(0.5)
        time.sleep(args.warmup)                       # probes attached, samples taken, workers up
        for exporter in exporters:
            exporter.scrape()
        processes = sum(1 for entry in os.scandir("/proc") if entry.name.isdigit())
        maps_kb = 0.0
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    maps_kb += len(Path(f"/proc/{entry.name}/maps").read_bytes()) / 1024
                except OSError:
                    pass
        steps0 = steps.value
        if args.profile:
            profiler = start_profile(exporters[0], args.seconds + 10, args.profile)
        threads_before = thread_cpu(exporters[0].proc.pid)
        wall, cpu, memory = measured_window(exporters, args.seconds, args.scrape_interval)
        threads = cpu_by_thread(exporters[0].proc.pid, threads_before)
        job_steps = steps.value - steps0
        results["in_job_calls"] = in_job_call_costs(args.simulate)
        # Scrape latency needs more than the window's few scrapes for a p99: a burst of
        # timed requests while the job still runs, 4 a second, the sets in turn.
        for _ in range(args.latency_scrapes):
            for exporter in exporters:
                start = time.perf_counter()
                fetch(exporter.base)
                exporter.latency_seconds.append(time.perf_counter() - start)
                time.sleep(0.25 / len(exporters))
    finally:
        if profiler is not None:
            profiler.wait(timeout=60)
        stop.set()
        for rank in ranks:
            rank.join(timeout=10)
            if rank.is_alive():
                rank.kill()
        for exporter in exporters:
            exporter.stop()
    say(f"\nnode during the job: {processes} processes, {maps_kb / 1024:.1f} MB of /proc/*/maps text; "
        f"{args.jobs} job(s) of {WORLD} ranks x 8 DataLoader workers"
        + (f", the exporters shown {args.present_gpus} GPUs (each physical GPU's NVML calls made "
           f"{args.present_gpus // max(1, results.get('nvml', {}).get('gpus', args.present_gpus))}x)"
           if args.present_gpus else "") + ","
        f" {job_steps / wall / len(ranks):.1f} training steps/s per rank; scrape every "
        f"{args.scrape_interval:g} s; CPU over {wall:.0f} s; NVLink gpu tier every {args.nvlink_interval:g} s, link tier every "
        f"{args.nvlink_link_interval:g} s")
    say(f"{'collectors':<13} {'CPU s':>6} {'% core':>7} {'RSS MB':>7} {'anon':>6} {'file':>6} {'scrape p50/p99 ms':>18} "
        f"{'nvlink p50/max ms':>18} {'gpu age p50/max s':>14} {'NCCL calls/s':>13}")
    results["job"] = {"processes": processes, "maps_mb": maps_kb / 1024,
                      "steps_per_second_per_rank": job_steps / wall / len(ranks),
                      "seconds": wall, "scrape_interval": args.scrape_interval,
                      "nvlink_interval": args.nvlink_interval, "nvlink_link_interval": args.nvlink_link_interval,
                      "sets": {}}
    for exporter in exporters:
        first, last = exporter.scrapes[0], exporter.scrapes[-1]
        nvlink = [v for s in exporter.scrapes[1:]
                  for v in values(s, "fabric_scrape_collector_duration_seconds", collector="nvlink")]
        by_collector = {c: [v * 1e3 for s in exporter.scrapes[1:]
                            for v in values(s, "fabric_scrape_collector_duration_seconds", collector=c)]
                        for c in SETS[exporter.name]}
        ages = [v for s in exporter.scrapes[1:] for v in values(s, "fabric_nvlink_sample_age_seconds", tier="gpu")]
        link_ages = [v for s in exporter.scrapes[1:]
                     for v in values(s, "fabric_nvlink_sample_age_seconds", tier="link")]
        tier_cpu = {tier: sum(values(last, "fabric_nvlink_sample_cpu_seconds_total", tier=tier))
                    - sum(values(first, "fabric_nvlink_sample_cpu_seconds_total", tier=tier)) for tier in ("gpu", "link")}
        sampling_cpu = sum(tier_cpu.values())
        calls = sum(values(last, "fabric_nccl_calls_total")) - sum(values(first, "fabric_nccl_calls_total"))
        scrape_ms = [t * 1e3 for t in exporter.latency_seconds or exporter.scrape_seconds[1:]]
        mem = memory[exporter.name]
        row = {"cpu_s": cpu[exporter.name], "core_share": cpu[exporter.name] / wall, "memory_mb": mem,
               "scrape_ms": scrape_ms, "nvlink_collector_ms": [v * 1e3 for v in nvlink], "sample_age_s": ages,
               "sampling_cpu_share": sampling_cpu / wall, "nccl_calls_per_second": calls / wall,
               "link_sample_age_s": link_ages, "collector_ms": by_collector, "sampling_cpu_share_by_tier": {t: c / wall for t, c in tier_cpu.items()},
               "error_reads": {dict(k[1])["method"]: v for k, v in
                               pick(last, "fabric_nvlink_error_counter_reads", gpu="0").items()}}
        if exporter is exporters[0]:
            row["cpu_share_by_thread"] = {name: seconds / wall for name, seconds in threads.items()}
        results["job"]["sets"][exporter.name] = row
        say(f"{exporter.name:<13} {row['cpu_s']:6.2f} {row['core_share'] * 100:6.2f}% {mem['VmRSS']:7.1f} "
            f"{mem['RssAnon']:6.1f} {mem['RssFile']:6.1f} {percentile(scrape_ms, .5):8.1f}/{percentile(scrape_ms, .99):<8.1f} "
            f"{percentile(row['nvlink_collector_ms'], .5):8.2f}/{max(row['nvlink_collector_ms'] or [0]):<8.2f} "
            f"{percentile(ages, .5):6.1f}/{max(ages or [0]):<6.1f} {row['nccl_calls_per_second']:13.0f}")
        if "cpu_share_by_thread" in row:
            say(f"{'':<13} CPU by thread (% of a core): " + ", ".join(
                f"{name} {share * 100:.3f}" for name, share in row["cpu_share_by_thread"].items() if share > 0))
        say(f"{'':<13} collector p50/max ms: " + ", ".join(
            f"{c} {percentile(v, .5):.1f}/{max(v or [0]):.1f}" for c, v in by_collector.items()))
        if "nvlink" in SETS[exporter.name]:
            by_tier = row["sampling_cpu_share_by_tier"]
            say(f"{'':<13} NVLink sampling threads: {row['sampling_cpu_share'] * 100:.3f}% of a core (gpu tier "
                f"{by_tier['gpu'] * 100:.3f}%, link tier {by_tier['link'] * 100:.3f}%: one link round per GPU every "
                f"{args.nvlink_link_interval:g} s, so a window shorter than that under- or over-counts it); "
                f"link-tier age p50/max {percentile(link_ages, .5):.1f}/{max(link_ages or [0]):.1f} s")
    say("(each exporter runs under this script's launcher, a little more RSS than `fabricscope exporter` "
        "alone (docs/cost.md \"Memory\"); scrape p50/p99 over "
        f"{args.latency_scrapes} timed requests per set after the CPU window, the HTTP request only)")
    say("targets: scrape p99 <= 25 ms; exporter <= 0.5% of one core at a 15 s scrape interval, RSS <= 70 MB; "
        "NVLink samples no older than their tier's interval (+ one round)")
    say("before (issue 14/17, same kind of host): nvlink collector 0.20-0.80 s per scrape; all collectors "
        "10.0% of a core and 96 MB, all but nccl 3.7% and 83 MB")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of the process."""
    out = {}
    for entry in os.scandir(f"/proc/{pid}/task"):
        try:
            out[int(entry.name)] = stat_cpu_seconds(Path(entry.path, "stat"))
        except OSError:
            continue                                    # the thread ended meanwhile
    return out


def cpu_by_thread(pid: int, before: dict[int, float]) -> dict[str, float]:
    """CPU seconds each kind of thread used since `before`, by Python thread name (digits
    folded: nvml-gpu#), the names read with `py-spy dump` (threads it cannot name: by tid)."""
    import re
    import subprocess

    after = thread_cpu(pid)
    names: dict[int, str] = {}
    spy = py_spy()
    if spy:
        dump = subprocess.run([spy, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=60).stdout
        for match in re.finditer(r'^Thread (0x[0-9A-Fa-f]+|\d+) \([^)]*\): "([^"]*)"', dump, re.M):
            tid = match.group(1)
            names[int(tid, 16) if tid.startswith("0x") else int(tid)] = match.group(2)
    out: dict[str, float] = {}
    for tid, seconds in after.items():
        name = re.sub(r"\d+", "#", names.get(tid, "unnamed"))
        out[name] = out.get(name, 0.0) + seconds - before.get(tid, 0.0)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def start_profile(exporter: Exporter, seconds: float, out_dir: Path):
    """py-spy samples the exporter without stopping it (--nonblocking: the exporter's CPU
    is not charged for the sampling)."""
    import subprocess

    spy = py_spy()
    if spy is None:
        say("(no py-spy: no profile)")
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([spy, "record", "--nonblocking", "--threads", "-r", "200", "-f", "raw", "-d",
                             str(int(seconds)), "-o", str(out_dir / f"{exporter.name.replace(' ', '_')}.txt"),
                             "-p", str(exporter.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def in_job_call_costs(simulate: bool) -> dict:
    """The slow and the frequent NVML calls again, now that the job runs (the gpu tier's
    link states cost several times their idle cost under load), and GPM: one sample per GPU
    holding every link's throughput, where the field-values call costs one driver round
    trip per link and direction."""
    from fabricscope.exporter.nvml import open_backend
    from fabricscope.exporter.nvml.backend import FI_NVLINK_THROUGHPUT_DATA_RX, FI_NVLINK_THROUGHPUT_DATA_TX

    backend = simulated_nvml() if simulate else open_backend()
    gpu = backend.gpus()[0]
    links = sorted(backend.link_states(gpu))
    rows: dict[str, dict] = {}

    def record(name: str, samples: list[tuple[float, float, object]]) -> None:
        rows[name] = call_row(samples)

    record("link states (all links)", [timed(backend.link_states, gpu) for _ in range(20)])
    record("crc_data counter, per link", [timed(backend.error_counter, gpu, link, "crc_data") for link in links])
    record("throughput TX+RX per link (field values)", [timed(backend.field_values, gpu, [
        (f, link) for f in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX) for link in links])
        for _ in range(3)])
    if not simulate:
        nvml = backend.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        try:
            supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except Exception as exc:  # noqa: BLE001 - bindings or driver without GPM
            supported = f"{type(exc).__name__}: {exc}"
        rows["gpm_supported"] = supported
        if supported is True:
            first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
            record("GPM sample (one call, every metric)", [timed(nvml.nvmlGpmSampleGet, handle, s)
                                                           for s in (first, second, first, second, first)])
            time.sleep(1.0)
            nvml.nvmlGpmSampleGet(handle, second)
            ids = [nvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, nvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] + \
                [nvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC + i for i in range(2 * len(links))]
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version, request.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(ids)
            request.sample1, request.sample2 = first, second
            for i, metric in enumerate(ids):
                request.metrics[i].metricId = metric
            wall, cpu, answer = timed(nvml.nvmlGpmMetricsGet, request)
            rows["gpm_metrics_get"] = {"cpu_ms": cpu * 1e3, "wall_ms": wall * 1e3,
                                       "error": None if not isinstance(answer, Exception) else str(answer)}
            if not isinstance(answer, Exception):
                got = [(m.metricId, int(m.nvmlReturn), m.value) for m in request.metrics[:len(ids)]]
                rows["gpm_nvlink_mib_s"] = got
    backend.close()
    say("\nNVML calls on GPU 0 during the job:")
    for name, row in rows.items():
        if isinstance(row, dict) and "cpu_ms_median" in row:
            say(f"  {name:<45} {row['answered']}/{row['calls']} answered, {row['wall_ms_median']:.3f} ms wall, "
                f"{row['cpu_ms_median']:.3f} ms CPU per call")
        else:
            say(f"  {name}: {row}")
    return rows


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--exporter-child":
        return exporter_child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=25.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--nvlink-interval", type=float, default=15.0, help="gpu tier (sample_interval_seconds)")
    parser.add_argument("--nvlink-link-interval", type=float, default=120.0,
                        help="link tier (link_sample_interval_seconds)")
    parser.add_argument("--step-seconds", type=float, default=0.05,
                        help="extra compute per training step (default 0.05: ~20 steps/s, ~17 all-reduces each)")
    parser.add_argument("--latency-scrapes", type=int, default=80,
                        help="after the CPU window, scrapes per exporter (4 a second, sets in turn) for the latency "
                             "percentiles")
    parser.add_argument("--skip-job", action="store_true", help="part 1 only")
    parser.add_argument("--jobs", type=int, default=1, help="data-parallel jobs side by side, each of 4 ranks")
    parser.add_argument("--present-gpus", type=int, default=0,
                        help="show the exporters this many GPUs, physical GPU i %% n behind GPU i (8 on a 4-GPU host: "
                             "an 8-GPU node's NVML calls)")
    parser.add_argument("--sets", type=lambda text: text.split(","), default=list(SETS),
                        help=f"comma-separated collector sets (default: {','.join(SETS)})")
    parser.add_argument("--profile", type=Path, default=None,
                        help="py-spy the first set's exporter over the window into this directory")
    parser.add_argument("--simulate", action="store_true", help="no GPUs: simulated NVML and fake-libnccl "
                        "ranks (to try the orchestration here; the figures mean nothing)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (uprobes, eBPF)")
    import_exporter()
    results: dict = {"host": socket.gethostname()}
    started = time.monotonic()
    nvml_part(results, args.simulate, args.nvlink_interval, args.nvlink_link_interval)
    if not args.skip_job:
        with tempfile.TemporaryDirectory(prefix="fabricscope-gpu-cost-") as tmp:
            job_part(args, results, Path(tmp))
    say(f"\ntotal {time.monotonic() - started:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_cost.json").write_text(json.dumps(results, indent=1, default=str))
        Path(out, "gpu_cost.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
