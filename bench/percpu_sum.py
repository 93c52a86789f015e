"""Summing a per-CPU BPF map value in user space, by CPU count: what an eBPF scrape pays
per lookup on a many-core host (exporter/bpf_loader/libbpf.py BpfMap._sum).

Per-CPU maps answer one value per possible CPU; the exporter sums them as u64 arrays. The
figures: µs per lookup for a counter (1 slot) and a histogram (40 slots) at 2, 64, 128 and
256 CPUs, beside a plain per-CPU Python loop over the same buffer (the earlier code).

    .venv/bin/python bench/percpu_sum.py
"""
from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabricscope.exporter.bpf_loader.libbpf import BpfMap


def a_map(ncpus: int, value_size: int) -> BpfMap:
    """A BpfMap's summing state without a loaded object (only _sum is timed)."""
    bpf_map = object.__new__(BpfMap)
    bpf_map.name, bpf_map.value_size, bpf_map.ncpus, bpf_map.per_cpu = "bench", value_size, ncpus, True
    bpf_map._stride = (value_size + 7) // 8 * 8
    return bpf_map


def loop_sum(bpf_map: BpfMap, raw: bytes) -> bytes:
    n = bpf_map.value_size // 8
    total = [0] * n
    for cpu in range(bpf_map.ncpus):
        part = raw[cpu * bpf_map._stride:cpu * bpf_map._stride + bpf_map.value_size]
        for i, v in enumerate(struct.unpack(f"<{n}Q", part)):
            total[i] += v
    return struct.pack(f"<{n}Q", *(t & 0xFFFFFFFFFFFFFFFF for t in total))


def per_call(function, *args, repeats: int = 300) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        function(*args)
    return (time.perf_counter() - start) / repeats


def main() -> int:
    print(f"{'CPUs':>5} {'slots':>6} {'_sum µs':>9} {'per-CPU loop µs':>16} {'ratio':>6}")
    for ncpus in (2, 64, 128, 256):
        for slots in (1, 40):
            bpf_map = a_map(ncpus, 8 * slots)
            raw = struct.pack(f"<{ncpus * slots}Q", *range(ncpus * slots))
            assert bpf_map._sum(raw) == loop_sum(bpf_map, raw)
            ours, loop = per_call(bpf_map._sum, raw), per_call(loop_sum, bpf_map, raw)
            print(f"{ncpus:>5} {slots:>6} {ours * 1e6:9.1f} {loop * 1e6:16.1f} {loop / ours:5.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
