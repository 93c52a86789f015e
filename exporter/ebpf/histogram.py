"""Kernel log2 histograms -> Prometheus histogram buckets in seconds.

The kernel side (exporter/bpf/fabric.h) keeps `struct log2_hist { u64 slots[32]; u64 sum; }`
where slot i counts values v with 2^(i-1) < v <= 2^i (slot 0: v <= 1) in some unit (µs).
So slot i is exactly the bucket le = 2^i x unit_seconds, and the last slot is the
overflow (+Inf). Conversion is exact: no interpolation, no re-bucketing.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

HIST_SLOTS = 32
HIST_VALUE_SIZE = 8 * (HIST_SLOTS + 1)


@dataclass(frozen=True)
class Log2Histogram:
    slots: tuple[int, ...]   # HIST_SLOTS counts, non-cumulative
    sum: int                 # sum of observed values, in the kernel's unit

    @property
    def count(self) -> int:
        return sum(self.slots)


def parse_log2_hist(raw: bytes) -> Log2Histogram:
    """Decode a `struct log2_hist` map value (per-CPU values already summed)."""
    if len(raw) != HIST_VALUE_SIZE:
        raise ValueError(f"log2 histogram value is {len(raw)} bytes, expected {HIST_VALUE_SIZE}")
    values = struct.unpack(f"<{HIST_SLOTS + 1}Q", raw)
    return Log2Histogram(slots=values[:HIST_SLOTS], sum=values[HIST_SLOTS])


def encode_log2_hist(hist: Log2Histogram) -> bytes:
    """The inverse of parse_log2_hist (the demo source stores what the kernel would)."""
    if len(hist.slots) != HIST_SLOTS:
        raise ValueError(f"log2 histogram needs {HIST_SLOTS} slots, got {len(hist.slots)}")
    return struct.pack(f"<{HIST_SLOTS + 1}Q", *hist.slots, hist.sum)


def slot_for(value: int) -> int:
    """The slot the kernel puts `value` in: ceil(log2(value)), clamped (mirrors log2_slot())."""
    if value <= 1:
        return 0
    return min((value - 1).bit_length(), HIST_SLOTS - 1)


def le_seconds(slot: int, unit_seconds: float) -> float:
    return float(2 ** slot) * unit_seconds


def to_prometheus_buckets(hist: Log2Histogram, unit_seconds: float) -> tuple[list[tuple[str, int]], float]:
    """([(le, cumulative count)...] ending with +Inf, sum in seconds) for HistogramMetricFamily.

    Leading empty slots are kept: a bucket set that changes shape between scrapes breaks
    rate() over buckets, so every scrape exposes the same HIST_SLOTS-1 finite bounds.
    """
    buckets, running = [], 0
    for slot in range(HIST_SLOTS - 1):
        running += hist.slots[slot]
        buckets.append((_format_le(le_seconds(slot, unit_seconds)), running))
    running += hist.slots[HIST_SLOTS - 1]
    buckets.append(("+Inf", running))
    return buckets, hist.sum * unit_seconds


def _format_le(value: float) -> str:
    # Stable, exact text for powers of two times 1e-6 (e.g. 3.2e-05, 0.000512, 1.048576).
    return repr(value)
