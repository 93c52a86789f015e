"""What NVML adds to the exporter's memory, step by step, on a GPU host.

Prints VmRSS, RssAnon and RssFile (/proc/self/status) and the Private/Shared totals of
/proc/self/smaps_rollup after each step, and what the step added:

  1. the bare interpreter, then this script's imports (the exporter's source tree);
  2. `import pynvml`;
  3. nvmlInit();
  4. a device handle for every GPU;
  5. one round of the exporter's own NVLink sampling (exporter/nvml/sampler.py,
     GpuSampler.sample_once over PynvmlBackend: both tiers) for every GPU, in this thread;
  6. the exporter's sampler threads started for every GPU (one thread each, as the nvlink
     collector starts them; here all at once, where the collector starts them 0.25 s
     apart: that changes when they allocate, not what) and each one's first round done;
  7. the free heap handed back to the kernel (malloc_trim), as the exporter does once
     started;

then the largest mappings by RSS (/proc/self/smaps) and the threads. The malloc arena cap
is applied first, as `fabricscope exporter` does before any thread starts.

    bench/device/nvml_memory.sh        # as root on the GPU host; $OUT/nvml_memory.{json,txt} when OUT is set
Without an NVIDIA driver it stops at nvmlInit with "no NVIDIA driver".
"""
from __future__ import annotations

import os
import sys


def status() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile (status) and Private, Shared (smaps_rollup), in MB."""
    values: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) / 1024
    values["Private"] = values["Shared"] = 0.0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Private_Clean", "Private_Dirty"):
                values["Private"] += int(rest.split()[0]) / 1024
            elif key in ("Shared_Clean", "Shared_Dirty"):
                values["Shared"] += int(rest.split()[0]) / 1024
    return values


STEPS: list[tuple[str, dict[str, float]]] = [("interpreter", status())]
KEYS = ("VmRSS", "RssAnon", "RssFile", "Private", "Shared")

import argparse  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))          # bench/: smaps

from nccl_straggler import import_exporter  # noqa: E402
from smaps import largest_mappings  # noqa: E402

import_exporter()
from fabricscope.exporter.collectors.nvlink import DEFAULT_LINK_SAMPLE_INTERVAL, DEFAULT_SAMPLE_INTERVAL  # noqa: E402
from fabricscope.exporter.malloc import DEFAULT_ARENAS, cap_malloc_arenas, return_free_heap  # noqa: E402
from fabricscope.exporter.nvml.sampler import GpuSampler  # noqa: E402

STEPS.append(("this script's imports (exporter source tree)", status()))
lines: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)
    lines.append(text)


def show(index: int) -> None:
    name, now = STEPS[index]
    added = "" if index == 0 else "   " + " ".join(f"{now[k] - STEPS[index - 1][1][k]:+6.1f}" for k in KEYS[:3])
    say(f"{name:<62} " + " ".join(f"{now[k]:7.1f}" for k in KEYS) + added)


def step(name: str) -> None:
    STEPS.append((name, status()))
    show(len(STEPS) - 1)


def finish(results: dict) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "nvml_memory.json").write_text(json.dumps(results, indent=1))
        Path(out, "nvml_memory.txt").write_text("\n".join(lines) + "\n")


def open_nvml(results: dict):
    """Steps 2-4 over the host's NVML, then the exporter's backend; None (said why) without."""
    try:
        import pynvml
    except ImportError as exc:
        say(f"no NVIDIA driver bindings: pynvml (nvidia-ml-py) is not installed ({exc})")
        results["error"] = f"no pynvml: {exc}"
        return None
    step("import pynvml")
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError) as exc:
        say(f"no NVIDIA driver: nvmlInit failed ({exc})")
        results["error"] = f"no NVIDIA driver: {exc}"
        return None
    step("nvmlInit")
    count = pynvml.nvmlDeviceGetCount()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    names = [pynvml.nvmlDeviceGetName(h) for h in handles]
    results["gpu_names"] = sorted({n.decode() if isinstance(n, bytes) else str(n) for n in names})
    step(f"device handles, {count} GPUs ({', '.join(results['gpu_names'])})")
    from fabricscope.exporter.nvml.real import PynvmlBackend
    return PynvmlBackend()   # nvmlInit again (NVML counts them), as the nvlink collector opens it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--simulate", action="store_true",
                        help="no GPUs: the sampling steps over the demo's simulated NVML (orchestration only)")
    args = parser.parse_args()
    started = time.monotonic()
    capped = cap_malloc_arenas()
    say(f"python {sys.version.split()[0]}, pid {os.getpid()}, malloc arena cap {DEFAULT_ARENAS if capped else 'not applied'}")
    say(f"{'step':<62} {'RSS MB':>7} {'anon':>7} {'file':>7} {'private':>7} {'shared':>7}   "
        f"{'+RSS':>6} {'+anon':>6} {'+file':>6}")
    show(0)
    show(1)
    results: dict = {"python": sys.version.split()[0], "simulated": args.simulate}
    if args.simulate:
        from gpu_cost import simulated_nvml
        backend = simulated_nvml()
        step("simulated NVML (gpu_cost.py --simulate's)")
    else:
        backend = open_nvml(results)
    if backend is None:
        results["steps"] = dict(STEPS)
        finish(results)
        return 2

    gpus = backend.gpus()
    for gpu in gpus:
        sample = GpuSampler(backend, gpu, DEFAULT_SAMPLE_INTERVAL, DEFAULT_LINK_SAMPLE_INTERVAL).sample_once()
        if sample.failure:
            say(f"  GPU {gpu.index}: the round failed ({sample.failure})")
    step(f"one sampling round of each of {len(gpus)} GPUs (both tiers), this thread")

    samplers = [GpuSampler(backend, gpu, DEFAULT_SAMPLE_INTERVAL, DEFAULT_LINK_SAMPLE_INTERVAL) for gpu in gpus]
    for sampler in samplers:
        sampler.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(s.latest is None for s in samplers):
        time.sleep(0.05)
    step("sampler threads started, first round done")
    unfinished = [s.gpu.index for s in samplers if s.latest is None]
    if unfinished:
        say(f"  GPUs whose first round did not finish within 30 s: {unfinished}")
    return_free_heap()
    step("free heap returned (malloc_trim)")

    say()
    say(f"threads: {threading.active_count()} Python, {len(os.listdir('/proc/self/task'))} in all")
    say("largest mappings by RSS:")
    mappings = largest_mappings()
    for rss, anon, n, name in mappings:
        say(f"  {rss:7.2f} MB (anon {anon:6.2f}) x{n:<3d} {name}")
    for sampler in samplers:
        sampler.stop()
    backend.close()
    say(f"total {time.monotonic() - started:.1f} s")
    results.update(steps=dict(STEPS), gpus=len(gpus), unfinished=unfinished,
                   mappings=[{"rss_mb": r, "anon_mb": a, "count": n, "name": name} for r, a, n, name in mappings])
    finish(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
