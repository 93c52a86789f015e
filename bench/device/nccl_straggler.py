"""Straggler and hang culprit on a real NCCL job: arrival lag found through the uprobes.

A 4-rank data-parallel loop (all_reduce of 64 MiB, then a synchronisation as
`loss.item()` does) runs under the exporter's nccl collector (uprobes on the job's
libnccl.so.2). Phases:
  baseline    no delay                                   -> no straggler may be flagged
  delay 40ms  one rank sleeps 40 ms before each all-reduce -> that rank, its lag, time to condition
  recovery    no delay, until the condition clears
  delay 5ms   the same rank, 5 ms
  stop        that rank stops 45 s before an all-reduce   -> the hang's culprit
The straggler condition is FabricNcclStragglerRank's expression evaluated here, in Python,
on the scraped series (thresholds and windows read from rules/mixin/config.libsonnet), at
every scrape. Prints the figures and writes them to $OUT/nccl_straggler.json.

    sudo NCCL_NVLS_ENABLE=0 python3 bench/device/nccl_straggler.py            # 4 GPUs, PyTorch
    sudo .venv/bin/python bench/device/nccl_straggler.py --backend fake --quick  # here: fake libnccl

Needs root, kernel BTF, libbpf.so.1 and exporter/bpf/nccl.bpf.o (built elsewhere with
`make bpf`: see bench/device/README.md for what to carry to a GPU host).
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import multiprocessing as mp
import os
import re
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STRAGGLER = 2                      # the rank that is delayed / stops
WORLD = 4


# ---- imports without an installed package ----------------------------------------------------

def import_exporter() -> None:
    """Make `fabricscope.exporter` importable from the source tree (no pip install on the
    GPU host) and fall back to the vendored pure-Python dependencies if the host lacks them."""
    sys.path.insert(0, str(ROOT))
    if (HERE / "vendor").is_dir():
        sys.path.append(str(HERE / "vendor"))        # after the host's own packages
    libbpf = HERE / "lib" / "libbpf.so.1"
    if libbpf.is_file() and "FABRIC_LIBBPF" not in os.environ:
        # libelf.so.1 beside it is found through the loader's search of already-loaded
        # libraries only if loaded first.
        for dependency in ("libz.so.1", "libelf.so.1"):
            if (HERE / "lib" / dependency).is_file():
                ctypes.CDLL(str(HERE / "lib" / dependency), mode=ctypes.RTLD_GLOBAL)
        os.environ["FABRIC_LIBBPF"] = str(libbpf)
    try:
        import fabricscope.exporter  # noqa: F401
        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location("fabricscope.exporter", ROOT / "exporter" / "__init__.py",
                                                  submodule_search_locations=[str(ROOT / "exporter")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["fabricscope.exporter"] = module
    spec.loader.exec_module(module)


# ---- the rule, evaluated here -------------------------------------------------------------------

def duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text))


def rule_config(path: Path = ROOT / "rules" / "mixin" / "config.libsonnet") -> dict[str, float]:
    """The straggler thresholds and windows, from the mixin's one home for them."""
    text = path.read_text()

    def leaf(key: str) -> str:
        match = re.search(rf"^\s*'?{key}'?:\s*([^,\n]+),", text, re.M)
        if match is None:
            raise SystemExit(f"{path}: no {key}")
        return match.group(1).strip().strip("'")

    return {"k": float(leaf("stragglerMadMultiplier")), "min_seconds": float(leaf("stragglerMinDeviationSeconds")),
            "min_share": float(leaf("stragglerMinStepShare")), "min_ranks": int(leaf("stragglerMinRanks")),
            "window": duration_seconds(leaf("ncclLag")), "for": duration_seconds(leaf("straggler"))}


def straggler_condition(window: dict[int, dict[str, float]], cfg: dict[str, float]) -> dict[int, dict[str, float]]:
    """FabricNcclStragglerRank's expression on one node's ranks (node offset 0): ranks whose
    mean lag over the window exceeds the median by k x MAD, the floor and the step share.
    `window`: rank -> {"lag_sum", "lag_count", "calls", "seconds"} increases over the window."""
    mean = {r: w["lag_sum"] / w["lag_count"] for r, w in window.items() if w["lag_count"] > 0}
    if len(mean) < cfg["min_ranks"]:
        return {}
    median = statistics.median(mean.values())
    deviation = {r: m - median for r, m in mean.items()}
    mad = statistics.median(abs(d) for d in deviation.values())
    found = {}
    for rank, dev in deviation.items():
        rate = window[rank]["calls"] / window[rank]["seconds"]
        share = max(dev, 0.0) * rate
        if dev > cfg["k"] * mad and dev > cfg["min_seconds"] and share > cfg["min_share"]:
            found[rank] = {"lag_behind_median_seconds": dev, "step_share": share}
    return found


# ---- scraping --------------------------------------------------------------------------------------

def fetch(base: str) -> str:
    """One scrape's body: what a scrape's latency is measured over."""
    return urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()


def parse(body: str) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def scrape(base: str) -> dict[tuple[str, frozenset], float]:
    return parse(fetch(base))


def ready_for_uprobes() -> bool:
    """Root (uprobes load BPF programs), and NVLink multicast off for the job's NCCL, as the
    GPU hosts need it; False after saying why."""
    if os.geteuid() != 0:
        print("needs root: uprobes load BPF programs", file=sys.stderr)
        return False
    for key, value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                       ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(key, value)
    return True


def wait_until_traced(readies, sample, start_seconds: float, trace_seconds: float) -> dict:
    """Every rank process started (its event set), then the exporter tracing them all (or
    `trace_seconds` gone); the last samples."""
    for event in readies:
        if not event.wait(start_seconds):
            raise SystemExit(f"a rank did not start within {start_seconds:g} s")
    deadline = time.time() + trace_seconds
    while True:
        samples = sample()
        traced = next(iter(pick(samples, "fabric_nccl_processes_traced").values()), 0)
        if traced >= len(readies) or time.time() >= deadline:
            return samples
        time.sleep(0.5)


def pick(samples, name: str, **labels) -> dict[tuple, float]:
    want = set((k, str(v)) for k, v in labels.items())
    return {key: value for key, value in samples.items() if key[0] == name and want <= key[1]}


def label(key, name: str) -> str:
    return dict(key[1])[name]


class Series:
    """Per-rank counters of the job's comm at each scrape, for window deltas."""

    def __init__(self) -> None:
        self.history: list[tuple[float, dict[int, dict[str, float]]]] = []

    def add(self, t: float, samples, comm: str) -> dict[int, dict[str, float]]:
        ranks: dict[int, dict[str, float]] = {}
        for key, value in pick(samples, "fabric_nccl_arrival_lag_seconds_sum", comm=comm).items():
            ranks.setdefault(int(label(key, "rank")), {})["lag_sum"] = value
        for key, value in pick(samples, "fabric_nccl_arrival_lag_seconds_count", comm=comm).items():
            ranks.setdefault(int(label(key, "rank")), {})["lag_count"] = value
        for key, value in pick(samples, "fabric_nccl_calls_total", comm=comm).items():
            if label(key, "op") not in ("Send", "Recv"):
                entry = ranks.setdefault(int(label(key, "rank")), {})
                entry["calls"] = entry.get("calls", 0.0) + value
        for key, value in pick(samples, "fabric_nccl_operation_duration_seconds_sum", comm=comm).items():
            entry = ranks.setdefault(int(label(key, "rank")), {})
            entry["duration_sum"] = entry.get("duration_sum", 0.0) + value
        for key, value in pick(samples, "fabric_nccl_operation_duration_seconds_count", comm=comm).items():
            entry = ranks.setdefault(int(label(key, "rank")), {})
            entry["duration_count"] = entry.get("duration_count", 0.0) + value
        self.history.append((t, ranks))
        return ranks

    def delta(self, since: float) -> dict[int, dict[str, float]]:
        """Increase of every counter from the last scrape at or before `since` to the newest."""
        t_now, now = self.history[-1]
        older = [(t, r) for t, r in self.history if t <= since] or self.history[:1]
        t_then, then = older[-1]
        out = {}
        for rank, values in now.items():
            before = then.get(rank, {})
            out[rank] = {k: v - before.get(k, 0.0) for k, v in values.items()}
            out[rank]["seconds"] = max(t_now - t_then, 1e-9)
        return out


# ---- the job -----------------------------------------------------------------------------------------

def worker(rank: int, backend: str, library: str, control, progress, ready, go, port: int) -> None:
    """One rank: a training loop whose step is one all-reduce and a synchronisation.
    control = [delay seconds, stop until (UNIX s), last step]; shared, read every step by
    every rank alike (so reading it costs the same everywhere)."""
    if backend == "torch":
        import torch
        import torch.distributed as dist

        torch.cuda.set_device(rank)
        torch.cuda.nccl.version()                  # libnccl is loaded (and probed) before init
        ready.set()
        go.wait()
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=rank, world_size=WORLD)
        grad = torch.ones(16 * 1024 * 1024, dtype=torch.float32, device=f"cuda:{rank}")   # 64 MiB

        def all_reduce() -> None:
            # The step's forward/backward, the same on every rank: ~5 ms, so the step period is
            # a training job's (about 6 ms in all, as measured in the issue), not the bare
            # all-reduce's 0.4 ms that would swamp the per-op mean lag with thousands of
            # undelayed operations a minute.
            time.sleep(COMPUTE_SECONDS)
            grad.fill_(1.0)                        # this step's gradients
            dist.all_reduce(grad)
            grad[0].item()                         # the per-step synchronisation (as loss.item())

        def finish() -> None:
            dist.destroy_process_group()
    else:
        lib = ctypes.CDLL(library)

        class UniqueId(ctypes.Structure):
            _fields_ = [("internal", ctypes.c_char * 128)]

        barrier = control_barrier
        ready.set()
        go.wait()
        uid, comm = UniqueId(), ctypes.c_void_p()
        lib.ncclGetUniqueId(ctypes.byref(uid))
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        lib.ncclCommInitRank(ctypes.byref(comm), WORLD, uid, rank)
        buf = (ctypes.c_float * 1024)()
        lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_void_p, ctypes.c_void_p]

        def all_reduce() -> None:
            time.sleep(0.002)                      # "compute", as long as a GPU step's all-reduce
            lib.ncclAllReduce(buf, buf, 1024, 7, 0, comm, None)
            barrier.wait()                         # the synchronisation, outside the library

        def finish() -> None:
            lib.ncclCommDestroy(comm)
    step = 0
    while step < control[2]:
        step += 1
        delay, stop_until = control[0], control[1]
        if rank == STRAGGLER:
            if stop_until > time.time():
                time.sleep(stop_until - time.time())
            elif delay > 0:
                time.sleep(delay)
        all_reduce()
        progress[rank] = step
    finish()


control_barrier = None
COMPUTE_SECONDS = 0.005


def _init_worker_globals(barrier) -> None:
    global control_barrier
    control_barrier = barrier


def _worker_entry(barrier, *args) -> None:
    _init_worker_globals(barrier)
    worker(*args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Bench:
    def __init__(self, args, cfg) -> None:
        self.args = args
        self.cfg = cfg
        self.series = Series()
        self.comm = None
        self.base = None
        self.t_start = time.time()
        self.log_lines: list[str] = []

    def log(self, message: str) -> None:
        line = f"[{time.time() - self.t_start:6.1f}s] {message}"
        print(line, flush=True)
        self.log_lines.append(line)

    def sample(self):
        samples = scrape(self.base)
        if self.comm is None:
            counts = {label(k, "comm"): v for k, v in pick(samples, "fabric_nccl_arrival_lag_seconds_count").items()}
            if counts:
                self.comm = max(counts, key=counts.get)
        now = time.time()
        if self.comm is not None:
            self.series.add(now, samples, self.comm)
        return now, samples

    def condition(self) -> dict[int, dict[str, float]]:
        if len(self.series.history) < 2:
            return {}
        window = self.series.delta(self.series.history[-1][0] - self.cfg["window"])
        return straggler_condition(window, self.cfg)

    def phase(self, name: str, seconds: float, control, delay: float, until=None) -> dict:
        """Run a phase; scrape every second; evaluate the straggler condition each time."""
        control[0] = delay
        start = time.time()
        self.log(f"phase {name}: delay {delay * 1000:g} ms for up to {seconds:g} s")
        first_true = None
        flagged: dict[int, int] = {}
        held_since = None
        fired_at = None
        found_at_end: dict = {}
        hanging_scrapes = 0               # scrapes in which some rank of the job was judged hanging
        while time.time() - start < seconds:
            time.sleep(max(0.0, self.args.scrape - (time.time() - start) % self.args.scrape))
            now, samples = self.sample()
            if self.comm is not None and any(
                    v == 1 for v in pick(samples, "fabric_nccl_hanging", comm=self.comm).values()):
                hanging_scrapes += 1
            found = self.condition()
            for rank in found:
                flagged[rank] = flagged.get(rank, 0) + 1
            if delay > 0 and STRAGGLER in found and first_true is None:
                first_true = now - start
                self.log(f"  straggler condition true for rank {STRAGGLER} after {first_true:.1f} s: "
                         f"{found[STRAGGLER]['lag_behind_median_seconds'] * 1000:.2f} ms behind the median, "
                         f"{found[STRAGGLER]['step_share']:.1%} of the job's time")
            if delay > 0 and STRAGGLER in found:
                held_since = held_since or now
                if fired_at is None and now - held_since >= self.cfg["for"]:
                    fired_at = now - start
            else:
                held_since = None
            found_at_end = found
            if until is not None and until(found, now - start):
                break
        # Steady state: the last rule window of the phase (the phase's first scrape interval
        # still holds operations from before the change).
        window = self.series.delta(max(start, time.time() - self.cfg["window"]))
        lag = {r: (w["lag_sum"] / w["lag_count"] if w.get("lag_count") else None) for r, w in window.items()}
        period = {r: (w["duration_sum"] / w["duration_count"] if w.get("duration_count") else None)
                  for r, w in window.items()}
        ops = {r: w.get("lag_count", 0) for r, w in self.series.delta(start).items()}
        result = {"phase": name, "delay_seconds": delay, "seconds": round(time.time() - start, 1),
                  "mean_lag_seconds": lag, "mean_period_seconds": period, "operations": ops,
                  "condition_true_after_seconds": first_true, "alert_would_fire_after_seconds": fired_at,
                  "ranks_ever_flagged": flagged, "flagged_at_end": sorted(found_at_end),
                  "hanging_scrapes": hanging_scrapes}
        self.log(f"  last {self.cfg['window']:g} s: mean lag per rank (ms): " + ", ".join(
            f"{r}: {v * 1000:.3f}" for r, v in sorted(lag.items()) if v is not None)
            + "; step period (ms): " + ", ".join(f"{r}: {v * 1000:.2f}" for r, v in sorted(period.items()) if v)
            + f"; flagged: {flagged or 'none'}; scrapes with a rank judged hanging: {hanging_scrapes}")
        return result

    def stop_phase(self, control, seconds: float) -> dict:
        start = time.time()
        control[0] = 0.0
        control[1] = start + seconds
        self.log(f"phase stop: rank {STRAGGLER} stops for {seconds:g} s before its next all-reduce")
        named_after, culprits, hanging, culprit_series = None, [], {}, []
        while time.time() < start + seconds - 1:
            time.sleep(0.5)
            active = json.loads(urllib.request.urlopen(self.base + "/nccl/operations/active", timeout=10).read())
            if active.get("culprits") and named_after is None:
                named_after = time.time() - start
                culprits = active["culprits"]
                _, samples = self.sample()
                culprit_series = [dict(k[1]) for k, v in pick(samples, "fabric_nccl_hang_culprit").items() if v == 1]
                hanging = {label(k, "rank"): v for k, v in pick(samples, "fabric_nccl_hanging", comm=self.comm).items()}
                self.log(f"  culprit named after {named_after:.1f} s: "
                         + "; ".join(c["message"] + f" [{c['reason']}]" for c in culprits))
        if named_after is None:
            self.log("  no culprit named during the stop")
        # Let the rank come back before the job moves on.
        while time.time() < start + seconds + 2:
            time.sleep(0.2)
        return {"phase": "stop", "stop_seconds": seconds, "culprit_named_after_seconds": named_after,
                "culprits": culprits, "fabric_nccl_hang_culprit": culprit_series, "fabric_nccl_hanging": hanging}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["torch", "fake"], default="torch")
    parser.add_argument("--quick", action="store_true", help="short phases and a 10 s rule window (fake backend)")
    parser.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--port", type=int, default=0, help="exporter port (default: a free one)")
    args = parser.parse_args()
    if not ready_for_uprobes():
        return 2
    import_exporter()
    from fabricscope.exporter.context import Context
    from fabricscope.exporter.bpf_loader import objects
    from fabricscope.exporter.main import start_exporter

    cfg = rule_config()
    phases = {"baseline": 60, "delay40": 45, "recovery": 90, "delay5": 60, "stop": 45}
    if args.quick:
        cfg.update(window=10.0, **{"for": 5.0})
        phases = {"baseline": 12, "delay40": 12, "recovery": 20, "delay5": 15, "stop": 8}
    library = ""
    if args.backend == "fake":
        from tests.nccl_fake.build import build_fake_nccl

        library = str(build_fake_nccl(Path(tempfile.mkdtemp(prefix="fake-nccl-")))[0])
    bpf_object = objects.object_path("nccl")
    if not bpf_object.is_file():
        print(f"{bpf_object} is missing: build it with `make bpf` on a machine with clang and carry it here",
              file=sys.stderr)
        return 2
    port = args.port or free_port()
    ctx = Context(state_dir=Path(tempfile.mkdtemp(prefix="fabricscope-state-")), node=socket.gethostname(),
                  config={"nccl": {"rescan_seconds": 0.5, "bpf_object": str(bpf_object)}})
    exporter = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    [collector] = exporter.collectors
    bench = Bench(args, cfg)
    bench.base = f"http://127.0.0.1:{port}"
    results: dict = {"backend": args.backend, "rule": cfg, "host": socket.gethostname(), "phases": []}
    if collector.uprobes is None or collector.uprobes.reason != "ok":
        reason = getattr(collector.uprobes, "reason", "none")
        print(f"NCCL uprobes did not load: {reason}", file=sys.stderr)
        exporter.stop()
        return 2
    bench.log(f"exporter on {bench.base}, uprobes loaded; rule: {cfg}")
    context = mp.get_context("spawn")
    control = context.Array("d", [0.0, 0.0, 1e12], lock=False)
    progress = context.Array("l", WORLD, lock=False)
    go = context.Event()
    barrier = context.Barrier(WORLD)
    readies = [context.Event() for _ in range(WORLD)]
    master_port = free_port()
    procs = [context.Process(target=_worker_entry, args=(barrier, rank, args.backend, library, control, progress,
                                                          readies[rank], go, master_port), daemon=True)
             for rank in range(WORLD)]
    for proc in procs:
        proc.start()
    status = 0
    try:
        samples = wait_until_traced(readies, lambda: bench.sample()[1], start_seconds=120, trace_seconds=60)
        traced = next(iter(pick(samples, "fabric_nccl_processes_traced").values()), 0)
        bench.log(f"{int(traced)} processes traced; libraries: "
                  + ", ".join(label(k, "library") for k in pick(samples, "fabric_nccl_probe_attached")))
        go.set()
        deadline = time.time() + 120
        while bench.comm is None or len(bench.series.history[-1][1]) < WORLD:
            if time.time() > deadline:
                raise SystemExit("no arrival lag for 4 ranks within 120 s: " + json.dumps(
                    {f"{k[0]}{dict(k[1])}": v for k, v in bench.sample()[1].items() if "nccl_comm_info" in k[0]}))
            time.sleep(1)
            bench.sample()
        bench.log(f"job running on comm {bench.comm}")
        time.sleep(3)                                  # NCCL warm-up steps out of the baseline
        results["comm"] = bench.comm
        results["phases"].append(bench.phase("baseline", phases["baseline"], control, 0.0))
        results["phases"].append(bench.phase("delay 40 ms", phases["delay40"], control, 0.040))
        results["phases"].append(bench.phase("recovery", phases["recovery"], control, 0.0,
                                             until=lambda found, t: not found and t > 5))
        results["phases"].append(bench.phase("delay 5 ms", phases["delay5"], control, 0.005))
        control[0] = 0.0
        results["phases"].append(bench.stop_phase(control, phases["stop"]))
    except SystemExit as exc:
        bench.log(f"ABORTED: {exc}")
        results["error"] = str(exc)
        status = 1
    finally:
        control[0], control[1] = 0.0, 0.0
        control[2] = max(progress) + 20
        deadline = time.time() + 45                    # the whole run stays within 8 minutes
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.time()))
            if proc.is_alive():
                proc.kill()
        exporter.stop()
    results["summary"] = summarise(results)
    bench.log("SUMMARY " + json.dumps(results["summary"], indent=1))
    bench.log(f"total {time.time() - bench.t_start:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "nccl_straggler.json").write_text(json.dumps(results, indent=1, default=str))
        (Path(out) / "nccl_straggler.log").write_text("\n".join(bench.log_lines) + "\n")
    return status


def summarise(results: dict) -> dict:
    by = {p["phase"]: p for p in results["phases"]}
    summary: dict = {}
    if "baseline" in by:
        summary["baseline_false_stragglers"] = by["baseline"]["ranks_ever_flagged"]
        # No phase but the stop has a hang: a scrape judging one there is a false hang.
        summary["false_hang_scrapes"] = {name: phase.get("hanging_scrapes") for name, phase in by.items()
                                         if "hanging_scrapes" in phase}
    for name in ("delay 40 ms", "delay 5 ms"):
        if name in by:
            p = by[name]
            summary[name] = {"ranks_flagged": p["ranks_ever_flagged"],
                             "straggler_mean_lag_ms": round((p["mean_lag_seconds"].get(STRAGGLER) or 0) * 1000, 3),
                             "other_ranks_mean_lag_ms": {r: round(v * 1000, 3) for r, v in p["mean_lag_seconds"].items()
                                                         if r != STRAGGLER and v is not None},
                             "step_period_ms": {r: round(v * 1000, 2) for r, v in p["mean_period_seconds"].items() if v},
                             "condition_true_after_s": p["condition_true_after_seconds"],
                             "alert_fires_after_s (for:)": p["alert_would_fire_after_seconds"]}
    if "recovery" in by:
        summary["recovery_clears_after_s"] = by["recovery"]["seconds"]
    if "stop" in by:
        summary["stop"] = {"culprit_named_after_s": by["stop"]["culprit_named_after_seconds"],
                           "culprits": [c["message"] + f" [{c['reason']}]" for c in by["stop"]["culprits"]]}
    return summary


if __name__ == "__main__":
    sys.exit(main())
