"""Blast radius on generated rail-optimized fat trees of 1k, 16k and 100k GPUs.

For each size: vertices and edges of the networkx model, generation and compact-form build
times, memory (process RSS growth for the model, array bytes for the compact form), and
the simulation time (p50/p99/max) over a seeded mix of devices and failure types. A subset
of the same simulations runs through a plain networkx BFS (chaos/reference.py) side by
side; both must agree, and the ratio of their medians is printed. Targets: p99 <= 50 ms
at 16k GPUs, <= 500 ms at 100k, >= 10x over networkx.

    .venv/bin/python bench/chaos_blast_radius.py [--sizes 1024,16384,102400] [--samples 300]
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricscope.chaos.blast import BlastRadiusEngine
from fabricscope.chaos.generator import FatTreeSpec, generate_fat_tree
from fabricscope.chaos.model import SWITCH_KINDS
from fabricscope.chaos.reference import NetworkxBlastRadius
from measure import percentile

TARGET_P99_MS = {16384: 50.0, 102400: 500.0}
TARGET_RATIO = 10.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def sample_requests(topology, count: int, seed: int) -> list[tuple[str, str]]:
    """Uniform over devices; the failure type uniform over those that apply to the device."""
    rng = random.Random(seed)
    names = sorted(topology.graph)
    out = []
    for _ in range(count):
        device = rng.choice(names)
        node = topology.graph.nodes[device]
        types = ["device_failure", "rack_failure", "power_failure"]
        if node["kind"] in SWITCH_KINDS:
            types.append("switch_failure")
        out.append((device, rng.choice(types)))
    return out


def run_size(gpus: int, samples: int, reference_samples: int, seed: int) -> dict:
    hosts = gpus // 8
    gc.collect()
    rss0 = rss_bytes()
    began = time.perf_counter()
    topology = generate_fat_tree(FatTreeSpec(hosts=hosts, job_hosts=32))
    generated = time.perf_counter() - began
    rss1 = rss_bytes()
    began = time.perf_counter()
    engine = BlastRadiusEngine(topology)
    built = time.perf_counter() - began
    requests = sample_requests(topology, samples, seed)
    engine.simulate(*requests[0])          # first call pays numpy's lazy imports
    times = []
    for device, failure_type in requests:
        t0 = time.perf_counter()
        engine.simulate(device, failure_type)
        times.append(time.perf_counter() - t0)
    # The worst case: the core rack (every core and the storage/management spines) goes.
    t0 = time.perf_counter()
    whole = engine.simulate("rack-core", "rack_failure")
    whole_s = time.perf_counter() - t0
    began = time.perf_counter()
    reference = NetworkxBlastRadius(topology)
    reference_built = time.perf_counter() - began
    nx_times, compact_times = [], []
    for device, failure_type in requests[:reference_samples]:
        t0 = time.perf_counter()
        affected, jobs = reference.affected(device, failure_type)
        nx_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = engine.simulate(device, failure_type)
        compact_times.append(time.perf_counter() - t0)
        if set(result.affected_devices) != affected or set(result.affected_jobs) != jobs:
            raise SystemExit(f"MISMATCH at {gpus} GPUs: {failure_type} of {device}")
    worst = max(range(len(times)), key=times.__getitem__)
    return {
        "gpus": gpus, "hosts": hosts, "vertices": topology.graph.number_of_nodes(),
        "edges": topology.graph.number_of_edges(), "states": engine.compact.states,
        "traversal_edges": engine.compact.edges, "generate_s": generated, "compact_build_s": built,
        "model_rss_mb": (rss1 - rss0) / 2**20, "compact_mb": engine.compact.memory_bytes() / 2**20,
        "p50_ms": statistics.median(times) * 1e3, "p99_ms": percentile(times, 0.99) * 1e3,
        "max_ms": max(times) * 1e3, "worst": requests[worst], "samples": len(times),
        "whole_ms": whole_s * 1e3, "whole_affected": whole.affected_device_count,
        "nx_build_s": reference_built, "nx_p50_ms": statistics.median(nx_times) * 1e3,
        "same_p50_ms": statistics.median(compact_times) * 1e3, "reference_samples": len(nx_times),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,16384,102400", help="GPU counts, comma-separated")
    parser.add_argument("--samples", type=int, default=300, help="simulations per size")
    parser.add_argument("--reference-samples", type=int, default=None,
                        help="of those, how many also run through the networkx BFS (default: 40, 20, 6 by size)")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    rows = []
    for gpus in (int(x) for x in args.sizes.split(",")):
        ref = args.reference_samples or (40 if gpus <= 2048 else 20 if gpus <= 20000 else 6)
        row = run_size(gpus, args.samples, ref, args.seed)
        rows.append(row)
        ratio = row["nx_p50_ms"] / row["same_p50_ms"]
        print(f"\n{gpus:,} GPUs ({row['hosts']:,} hosts): {row['vertices']:,} vertices, {row['edges']:,} directed edges "
              f"({row['states']:,} device-partition states, {row['traversal_edges']:,} traversal edges)")
        print(f"  build: generate {row['generate_s']:.2f} s, compact form {row['compact_build_s']:.2f} s; "
              f"memory: networkx model +{row['model_rss_mb']:.0f} MiB RSS, compact form {row['compact_mb']:.1f} MiB")
        print(f"  simulate ({row['samples']} mixed failures): p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
              f"max {row['max_ms']:.1f} ms ({row['worst'][1]} of {row['worst'][0]})")
        print(f"  worst case, rack_failure of rack-core (all cores and spines of storage/management): "
              f"{row['whole_ms']:.0f} ms, {row['whole_affected']:,} devices affected")
        target = TARGET_P99_MS.get(gpus)
        if target is not None:
            print(f"  p99 target <= {target:.0f} ms: {'met' if row['p99_ms'] <= target else 'MISSED'}")
        print(f"  networkx BFS on the same graph ({row['reference_samples']} of the same simulations, baseline "
              f"{row['nx_build_s']:.2f} s): p50 {row['nx_p50_ms']:.1f} ms vs compact {row['same_p50_ms']:.2f} ms "
              f"-> {ratio:,.0f}x ({'met' if ratio >= TARGET_RATIO else 'MISSED'} >= {TARGET_RATIO:.0f}x)")
        del row
        gc.collect()
    if len(rows) > 1:
        print("\ngrowth:")
        for small, big in zip(rows, rows[1:]):
            print(f"  {small['gpus']:,} -> {big['gpus']:,} GPUs (x{big['gpus'] / small['gpus']:.1f}): "
                  f"vertices x{big['vertices'] / small['vertices']:.1f}, build x{big['compact_build_s'] / small['compact_build_s']:.1f}, "
                  f"p50 x{big['p50_ms'] / small['p50_ms']:.1f}, p99 x{big['p99_ms'] / small['p99_ms']:.1f}, "
                  f"networkx p50 x{big['nx_p50_ms'] / small['nx_p50_ms']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
