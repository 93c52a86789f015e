"""The exporter's own cost on a busy node: CPU share and RSS per collector set, side by side.

The busy node, built on this machine:
  * --procs processes (default 300) that each map one large file --maps times (default 60
    mappings: alternating protections keep them apart), like the worker processes of a
    training job: 30-40 KB of /proc/<pid>/maps text each;
  * --ranks "ranks" (default 4) of a data-parallel loop over the fake libnccl
    (tests/nccl_fake/steps.c) at --calls-per-second ncclAllReduce calls each (default 200),
    every one traced by the uprobes; each rank has --workers children (default 8) that
    map the library too, as DataLoader workers forked from a rank do.

One exporter process per collector set runs at once on that node (so all see the same
machine), each scraped every --scrape-interval seconds (default 15). After a warm-up
(first scrape answered, ranks traced), CPU (utime + stime from /proc/<pid>/stat) is
measured over --seconds (default 60), and RSS read at the end. The set "all 512 arenas" is
"all" with glibc's malloc arena limit of a 64-core host (MALLOC_ARENA_MAX=512) instead of
the exporter's cap of 2, to show what the cap saves. With --profile DIR the
"all" exporter is sampled by py-spy over the same window and its profile summarised.

    sudo .venv/bin/python bench/exporter_cost.py [--seconds 60] [--procs 300] [--profile /tmp/prof]
Needs root (uprobes, eBPF), gcc, and the BPF objects (`make -C exporter/bpf`).
"""
from __future__ import annotations

import argparse
import http.client
import mmap
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from exporter_process import ALL, ExporterProcess, measured_window  # noqa: E402
from fabricscope.demo.stack import free_port  # noqa: E402
from tests.nccl_fake.build import build_fake_nccl, build_step_driver  # noqa: E402

COLLECTOR_SETS = {
    "all": ALL,
    "all but nccl": [c for c in ALL if c != "nccl"],
    "host only": ["infiniband", "kmsg", "netdev", "tcp"],
    "all 512 arenas": ALL,
}


# ---- the busy node -------------------------------------------------------------------------

def map_holders(count: int, target: Path, mappings: int, library: Path | None = None) -> list[int]:
    """Fork `count` children that each hold `mappings` private mappings of `target` (and the
    library, when given) and sleep until killed. Returns their pids."""
    pids = []
    size = target.stat().st_size
    for _ in range(count):
        pid = os.fork()
        if pid == 0:                           # child: map, then wait to be killed
            try:
                held = []
                if library is not None:
                    import ctypes
                    held.append(ctypes.CDLL(str(library)))
                with open(target, "rb") as f:
                    for i in range(mappings):
                        offset = (i * mmap.PAGESIZE) % max(mmap.PAGESIZE, size - mmap.PAGESIZE)
                        prot = mmap.PROT_READ if i % 2 else mmap.PROT_READ | mmap.PROT_WRITE
                        held.append(mmap.mmap(f.fileno(), mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=prot,
                                              offset=offset - offset % mmap.ALLOCATIONGRANULARITY))
                signal.pause()
            finally:
                os._exit(0)
        pids.append(pid)
    return pids


class Ranks:
    """--ranks step-loop processes over the fake libnccl, released together."""

    def __init__(self, steps: Path, ranks: int, calls_per_second: float, seconds: float, work: Path) -> None:
        barrier = work / "barrier"
        barrier.write_bytes(b"\0" * 8)
        period_us = 1e6 / calls_per_second
        delay_us = max(0, int(period_us - 1100))   # steps.c sleeps 1 ms of "compute" + barrier polling
        nsteps = int(calls_per_second * seconds)
        self.procs = [subprocess.Popen([str(steps), str(ranks), str(rank), str(nsteps), str(delay_us), "0",
                                        str(barrier)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for rank in range(ranks)]
        for proc in self.procs:
            assert proc.stdout.readline().strip() == "ready"

    def go(self) -> None:
        for proc in self.procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


# ---- measuring an exporter ---------------------------------------------------------------------

def scrape(port: int) -> tuple[float, str]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    return time.perf_counter() - start, body


def sample_value(body: str, prefix: str) -> float | None:
    """Sum of the samples whose line starts with prefix; None when there are none."""
    values = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(prefix)]
    return sum(values) if values else None


class Exporter(ExporterProcess):
    def __init__(self, name: str, collectors: list[str], work: Path) -> None:
        super().__init__(name, [sys.executable, "-m", "fabricscope.cli", "exporter"], collectors, free_port(), work,
                         ["--node-name=bench"], cwd=REPO)
        self.scrape_times: list[float] = []
        self.body = ""

    def wait_ready(self, timeout: float = 60) -> None:
        super().wait_ready(lambda: scrape(self.port), timeout)

    def scrape(self) -> None:
        elapsed, self.body = scrape(self.port)
        self.scrape_times.append(elapsed)


# ---- profile summary -----------------------------------------------------------------------------

CATEGORIES = [   # (label, substring of a frame) - first match from the leaf up wins
    ("NCCL process discovery (/proc reads)", ("discovery.py", "rescan", "_look_at_hinted", "_forget_exited")),
    ("NCCL events (ring buffer, decode, tracker)", ("uprobe.py", "tracker.py", "RingBuffer")),
    ("ebpf tracked-process scan (/proc/*/fd)", ("processes.py",)),
    ("eBPF map reads", ("libbpf.py", "kernel_source.py", "counters.py", "histogram.py")),
    ("NVML sampling", ("sampler.py", "nvml/real.py")),
    ("scrape (collect + exposition + HTTP)", ("exposition.py", "framework.py", "web.py", "collectors/")),
]


def summarise_profile(raw: Path) -> list[tuple[str, float]]:
    """py-spy raw (collapsed) stacks -> share of samples per category."""
    totals: dict[str, int] = {}
    all_samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        all_samples += n
        frames = stack.split(";")
        label = "other (thread start-up, logging, waits py-spy counts as running)"
        for frame in reversed(frames):
            hit = next((name for name, needles in CATEGORIES if any(k in frame for k in needles)), None)
            if hit:
                label = hit
                break
        totals[label] = totals.get(label, 0) + n
    return sorted(((k, v / max(all_samples, 1)) for k, v in totals.items()), key=lambda kv: -kv[1])


# ---- main ----------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--procs", type=int, default=300)
    parser.add_argument("--maps", type=int, default=60, help="mappings per busy process")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8, help="children per rank that map libnccl")
    parser.add_argument("--calls-per-second", type=float, default=200.0, help="ncclAllReduce per rank")
    parser.add_argument("--sets", default=",".join(COLLECTOR_SETS), help="collector sets to run")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the 'all' exporter into this dir")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the nccl and ebpf collectors attach uprobes and tracepoints")
    sets = {name: COLLECTOR_SETS[name] for name in args.sets.split(",")}
    holders: list[int] = []
    exporters: list[Exporter] = []
    ranks = None
    with tempfile.TemporaryDirectory(prefix="fabricscope-cost-") as tmp:
        work = Path(tmp)
        library, _ = build_fake_nccl(work)
        steps = build_step_driver(work)
        big = Path(sys.executable).resolve()        # any large file serves as the mapped object
        try:
            holders += map_holders(args.procs, big, args.maps)
            holders += map_holders(args.ranks * args.workers, big, args.maps, library=library)
            warmup = 20.0
            ranks = Ranks(steps, args.ranks, args.calls_per_second, args.seconds + warmup + 60, work)
            processes = sum(1 for entry in os.scandir("/proc") if entry.name.isdigit())
            maps_bytes = sum(len(Path(f"/proc/{pid}/maps").read_bytes()) for pid in holders[:20]) / 20
            exporters = [Exporter(name, collectors, work) for name, collectors in sets.items()]
            for exporter in exporters:
                exporter.wait_ready()
            ranks.go()
            time.sleep(warmup)                       # probes attached, first rescans done
            for exporter in exporters:
                exporter.scrape()
                if "nccl" in sets[exporter.name]:
                    traced = sample_value(exporter.body, "fabric_nccl_processes_traced")
                    if not traced:
                        raise SystemExit(f"exporter {exporter.name}: no process traced after warm-up "
                                         f"(see {exporter.log.name})")
            profiler = None
            if args.profile and "all" in sets:
                args.profile.mkdir(parents=True, exist_ok=True)
                py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                target = next(e for e in exporters if e.name == "all")
                profiler = subprocess.Popen([py_spy, "record", "-p", str(target.proc.pid), "-d", str(int(args.seconds)),
                                             "-r", "100", "--nonblocking", "-f", "raw", "--threads", "-o",
                                             str(args.profile / "all.txt")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            events0 = {e.name: sample_value(e.body, "fabric_nccl_calls_total") for e in exporters}
            wall, cpu, memory = measured_window(exporters, args.seconds, args.scrape_interval)
            logs = {e.name: Path(e.log.name).read_text()[-2000:] for e in exporters}
            for exporter in exporters:
                exporter.scrape()
            if profiler is not None:
                profiler.wait(timeout=args.seconds + 60)
        finally:
            for exporter in exporters:
                exporter.stop()
            if ranks is not None:
                ranks.stop()
            for pid in holders:
                os.kill(pid, signal.SIGKILL)
            for pid in holders:
                os.waitpid(pid, 0)
        print(f"busy node: {processes} processes, ~{maps_bytes / 1024:.0f} KB of maps text per busy process; "
              f"{args.ranks} ranks x {args.calls_per_second:g} ncclAllReduce/s, {args.workers} library-mapping "
              f"workers per rank; scrape every {args.scrape_interval:g} s; CPU over {wall:.0f} s")
        print(f"{'collectors':<14} {'CPU s':>7} {'% of a core':>12} {'RSS MB':>7} {'anon':>6} {'file':>6} "
              f"{'scrape p50':>11} {'NCCL calls counted':>19}")
        for exporter in exporters:
            mem = memory[exporter.name]
            calls = sample_value(exporter.body, "fabric_nccl_calls_total")
            counted = "-" if calls is None else f"{calls - (events0[exporter.name] or 0):,.0f}"
            if calls is not None and calls == events0[exporter.name]:
                print(f"  ({exporter.name}: no NCCL call counted in the window; its log ends:\n{logs[exporter.name]})")
            print(f"{exporter.name:<14} {cpu[exporter.name]:7.2f} {cpu[exporter.name] / wall * 100:11.2f}% "
                  f"{mem['VmRSS']:7.1f} {mem['RssAnon']:6.1f} {mem['RssFile']:6.1f} "
                  f"{statistics.median(exporter.scrape_times) * 1e3:9.1f}ms {counted:>19}")
        print("targets (issue 17): <= 0.5% of one core at a 15 s scrape interval with every collector, RSS <= 70 MB")
        if args.profile and (args.profile / "all.txt").exists():
            print(f"\nwhere the 'all' exporter's CPU went (py-spy, {args.profile / 'all.txt'}):")
            for label, share in summarise_profile(args.profile / "all.txt"):
                print(f"  {share * 100:5.1f}%  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
