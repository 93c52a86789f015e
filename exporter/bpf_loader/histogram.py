"""Kernel log-linear histograms -> Prometheus histogram buckets in seconds.

The kernel side (exporter/bpf/fabric.h, DECLARE_HIST) keeps per histogram one
`struct { u64 slots[N]; u64 sum; }` whose slot function is log-linear: every power of two
above 2^min_exp is split into 2^sub_bits equal-width buckets, up to 2^max_exp; below
sits one bucket for v <= 2^min_exp, above one overflow bucket. Factor-2 buckets cannot
carry a rule such as "p99 > 3x its average" (interpolating inside a bucket twice as wide
as its lower bound moves a p99 ratio in steps of about 2x); 8 buckets per power of two
keep the interpolated p99 within a few percent (docs/ebpf.md has the figures).

Every bucket bound is an integer in the kernel's unit, so slot i is exactly the bucket
le = upper_bound(i) x unit_seconds: no interpolation, no re-bucketing here.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache


@dataclass(frozen=True)
class BucketLayout:
    """Slot layout of one kernel histogram; mirrors DECLARE_HIST(name, sub_bits, min_exp, max_exp)."""
    sub_bits: int    # 2^sub_bits buckets per power of two
    min_exp: int     # first bucket: v <= 2^min_exp
    max_exp: int     # last finite bucket ends at 2^max_exp; above is the overflow slot

    def __post_init__(self) -> None:
        if not 0 <= self.sub_bits <= 4:
            raise ValueError(f"sub_bits must be 0..4, got {self.sub_bits}")
        if not self.sub_bits <= self.min_exp < self.max_exp <= 40:
            raise ValueError(f"need sub_bits <= min_exp < max_exp <= 40, got {self}")

    @property
    def slots(self) -> int:
        """Slots in the kernel array: the first bucket, the split powers of two, overflow."""
        return 2 + ((self.max_exp - self.min_exp) << self.sub_bits)

    @property
    def value_size(self) -> int:
        return 8 * (self.slots + 1)   # slots, then sum

    @cached_property
    def upper_bounds(self) -> tuple[int, ...]:
        """Inclusive upper bound of every finite slot, in the kernel's unit."""
        bounds = [1 << self.min_exp]
        for exp in range(self.min_exp, self.max_exp):
            width = 1 << (exp - self.sub_bits)
            bounds += [(1 << exp) + (sub + 1) * width for sub in range(1 << self.sub_bits)]
        return tuple(bounds)

    def slot_for(self, value: int) -> int:
        """The slot the kernel puts `value` in (mirrors loglin_slot() in fabric.h)."""
        if value <= 1 << self.min_exp:
            return 0
        exp = (value - 1).bit_length() - 1          # value in (2^exp, 2^(exp+1)]
        if exp >= self.max_exp:
            return self.slots - 1
        sub = ((value - 1) - (1 << exp)) >> (exp - self.sub_bits)
        return 1 + ((exp - self.min_exp) << self.sub_bits) + sub


@dataclass(frozen=True)
class KernelHistogram:
    slots: tuple[int, ...]   # non-cumulative counts, one per layout slot
    sum: int                 # sum of observed values, in the kernel's unit

    @property
    def count(self) -> int:
        return sum(self.slots)


def parse_hist(raw: bytes, layout: BucketLayout) -> KernelHistogram:
    """Decode a histogram map value (per-CPU values already summed)."""
    if len(raw) != layout.value_size:
        raise ValueError(f"histogram value is {len(raw)} bytes, expected {layout.value_size} "
                         f"for {layout} (BPF object and declaration disagree: rebuild with `make bpf`)")
    values = struct.unpack(f"<{layout.slots + 1}Q", raw)
    return KernelHistogram(slots=values[:-1], sum=values[-1])


def encode_hist(hist: KernelHistogram, layout: BucketLayout) -> bytes:
    """The inverse of parse_hist (the demo source stores what the kernel would)."""
    if len(hist.slots) != layout.slots:
        raise ValueError(f"histogram needs {layout.slots} slots for {layout}, got {len(hist.slots)}")
    return struct.pack(f"<{layout.slots + 1}Q", *hist.slots, hist.sum)


def le_text(bound: int, unit_seconds: float) -> str:
    """The `le` label of a bound: the shortest decimal of bound x unit (1.8e-05, 0.000136)."""
    return repr(float(f"{bound * unit_seconds:.12g}"))


@lru_cache(maxsize=None)
def bucket_bounds(layout: BucketLayout, unit_seconds: float) -> tuple[str, ...]:
    """Every finite `le` label the exporter exposes for this layout, in order (cached: the
    same few layouts are converted on every scrape)."""
    return tuple(le_text(bound, unit_seconds) for bound in layout.upper_bounds)


def to_prometheus_buckets(hist: KernelHistogram, layout: BucketLayout,
                          unit_seconds: float) -> tuple[list[tuple[str, int]], float]:
    """([(le, cumulative count)...] ending with +Inf, sum in seconds) for HistogramMetricFamily.

    Empty slots are kept: a bucket set that changes shape between scrapes breaks rate()
    over buckets, so every scrape exposes the same finite bounds.
    """
    buckets, running = [], 0
    for le, count in zip(bucket_bounds(layout, unit_seconds), hist.slots):
        running += count
        buckets.append((le, running))
    running += hist.slots[-1]
    buckets.append(("+Inf", running))
    return buckets, hist.sum * unit_seconds
