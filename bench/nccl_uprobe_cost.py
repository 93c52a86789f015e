"""Cost of the NCCL uprobes per collective call, measured on the fake libnccl.

The test driver (tests/nccl_fake/driver.c) calls ncclAllReduce in a tight loop; each call
hits one uprobe and one uretprobe. Rounds alternate unprobed and probed runs so machine
drift hits both sides. Prints ns per call for each mode (median of the rounds), the added
cost per call (the probes and the kernel's accounting), the exporter's own CPU time per
call (reading the accounting maps about once a second: it does not grow with the call
rate), and whether every call was counted at that rate. On a small
machine the exporter's poller competes with the driver for cores, which inflates the
probed figure: read it as an upper bound.

A real training job makes at most a few thousand NCCL calls per second per rank, so the
added cost is that number times the per-call figure here.

    sudo .venv/bin/python bench/nccl_uprobe_cost.py [--calls 200000] [--rounds 3]
Needs root, kernel BTF, gcc and exporter/bpf/nccl.bpf.o (`make -C exporter/bpf`).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fabricscope.exporter.bpf_loader import objects  # noqa: E402
from fabricscope.exporter.nccl.tracker import NcclTracker  # noqa: E402
from fabricscope.exporter.nccl.uprobe import UprobeSource  # noqa: E402
from tests.nccl_fake.build import build_fake_nccl  # noqa: E402



def run_driver(driver: Path, calls: int, source: UprobeSource | None) -> tuple[float, float]:
    """Seconds the driver spent between "go" and "done" (init + `calls` AllReduces), and this
    process's CPU time when it started (after the probes were attached)."""
    proc = subprocess.Popen([str(driver), "2", "0", str(calls), "1", "0", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    if source is not None:
        deadline = time.monotonic() + 30
        while source.status().processes_traced < 1:
            if time.monotonic() > deadline:
                raise SystemExit("the driver was never traced")
            time.sleep(0.05)
    cpu = time.process_time()
    start = time.perf_counter()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "done"
    elapsed = time.perf_counter() - start
    proc.stdin.write("exit\n")
    proc.stdin.flush()
    proc.wait()
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    obj = objects.object_path("nccl")
    if not obj.is_file():
        ok, output = objects.build()
        if not ok:
            raise SystemExit(f"cannot build nccl.bpf.o: {output}")
    with tempfile.TemporaryDirectory() as tmp:
        _, driver = build_fake_nccl(Path(tmp))
        plain, probed, counted, lost, exporter_cpu = [], [], [], [], []
        for _ in range(args.rounds):
            plain.append(run_driver(driver, args.calls, None)[0])
            tracker = NcclTracker(max_series=64)
            source = UprobeSource(Path("/proc"), Path("/sys"), obj)   # exec/dlopen hints, as deployed
            source.attach(tracker)
            if source.reason != "ok":
                raise SystemExit(f"uprobes unavailable: {source.reason}")
            try:
                elapsed, cpu = run_driver(driver, args.calls, source)
                probed.append(elapsed)
                # The kernel counts every call; the reader applies its maps about once a second.
                allreduce = lambda: sum(op.calls for op in tracker.snapshot().ops if op.op == "AllReduce")  # noqa: E731
                deadline = time.monotonic() + 60
                waiting = time.thread_time()          # this thread's polling is the bench's, not the exporter's
                while allreduce() < args.calls + 1 and source.status().events_lost == 0 \
                        and time.monotonic() < deadline:
                    time.sleep(0.05)                  # until the reader has applied the last calls
                exporter_cpu.append(time.process_time() - cpu - (time.thread_time() - waiting))
                counted.append(allreduce())
                lost.append(source.status().events_lost)
            finally:
                source.close()
    per_plain = statistics.median(plain) / args.calls * 1e9
    per_probed = statistics.median(probed) / args.calls * 1e9
    print(f"calls per run: {args.calls}, rounds: {args.rounds}")
    print(f"unprobed: {per_plain:8.1f} ns/call")
    print(f"probed:   {per_probed:8.1f} ns/call  (uprobe + uretprobe, accounted in BPF maps)")
    print(f"added:    {(per_probed - per_plain) / 1000:8.2f} us/call")
    print(f"probed call rate: {args.calls / statistics.median(probed):,.0f} calls/s")
    # The driver ends with one AllReduce on a split communicator: calls + 1 in all.
    print(f"AllReduce calls counted by the tracker per run: {counted} of {args.calls + 1}; "
          f"init/destroy events lost in the kernel per run: {lost}")
    cpu = statistics.median(exporter_cpu)
    print(f"exporter CPU from the first call until every call was counted (attach excluded): {cpu * 1e3:.1f} ms, "
          f"{cpu / args.calls * 1e6:.3f} us a call")
    print(f"at 5,000 NCCL calls/s per rank the probes cost "
          f"{5000 * (per_probed - per_plain) / 1e9 * 100:.2f}% of one core")


if __name__ == "__main__":
    main()
