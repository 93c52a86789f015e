"""A histogram's quantile over a sliding window, computed where the histogram is read.

A rule such as `histogram_quantile(0.99, rate(x_bucket[1m]))` selects every bucket series
of every node at every evaluation (122 a node for the RTT excess: 122,000 series every
10 s at 1,000 nodes). When the rule only ever needs the node's own quantile, the exporter
computes it from the cumulative bucket counts it already holds and exports one gauge.

`bucket_quantile` is PromQL's `histogram_quantile` (promql/quantile.go, bucketQuantile):
linear interpolation inside the bucket holding the rank, the first bucket's lower bound
0, a rank in the +Inf bucket answers the highest finite bound, no answer for an empty
histogram. `QuantileWindow` keeps timed snapshots of the cumulative counts and answers
the quantile of the increase between the newest snapshot at least `window` old (else
the oldest kept) and now: what the rule's `rate()` over the window saw, without its
extrapolation (a common factor of every bucket, so it does not move the quantile).
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from typing import Callable, Sequence

# Collections closer together than this share a snapshot: two Prometheus replicas
# scraping the same node must not double the snapshots kept (or halve their spacing).
MIN_SNAPSHOT_SPACING_SECONDS = 1.0


def bucket_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float | None:
    """The q-quantile of a histogram, as PromQL's histogram_quantile answers it.

    `bounds` are the finite upper bounds, ascending; `cumulative` the cumulative counts of
    those buckets followed by the +Inf bucket's (one more entry than `bounds`). None where
    PromQL answers NaN for lack of observations.
    """
    if len(cumulative) != len(bounds) + 1:
        raise ValueError(f"need one count per finite bound plus +Inf: {len(bounds)} bounds, "
                         f"{len(cumulative)} counts")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    observations = cumulative[-1]
    if observations <= 0:
        return None
    rank = q * observations
    # The first bucket whose cumulative count reaches the rank (sort.Search in Prometheus,
    # over every bucket but +Inf).
    b = bisect.bisect_left(cumulative, rank, 0, len(bounds))
    if b == len(bounds):
        return bounds[-1]          # in the +Inf bucket: the highest finite bound
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], cumulative[b]
    if b > 0:
        start = bounds[b - 1]
        count -= cumulative[b - 1]
        rank -= cumulative[b - 1]
    return start + (end - start) * (rank / count)


class QuantileWindow:
    """Snapshots of one histogram's cumulative counts over the last `window_seconds`."""

    def __init__(self, quantile: float, window_seconds: float, bounds: Sequence[float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0.0 <= quantile <= 1.0:
            raise ValueError(f"quantile must be within 0..1, got {quantile}")
        if not window_seconds > 0:
            raise ValueError(f"window must be positive, got {window_seconds}")
        self.quantile = quantile
        self.window_seconds = window_seconds
        self.bounds = tuple(bounds)
        self._clock = clock
        # (time, cumulative counts), oldest first. Bounded in time (nothing older than the
        # start snapshot is kept) and so in count: at most window / spacing + 2.
        self._snapshots: deque[tuple[float, tuple[int, ...]]] = deque()

    def __len__(self) -> int:
        return len(self._snapshots)

    def observe(self, cumulative: Sequence[int]) -> float | None:
        """Record this collection's counts; the quantile of the increase over the window,
        or None (absent) on the first collection and when the window saw no samples."""
        now, counts = self._clock(), tuple(cumulative)
        if len(counts) != len(self.bounds) + 1:
            raise ValueError(f"histogram has {len(counts)} buckets, the window {len(self.bounds) + 1}")
        if self._snapshots and any(c < s for c, s in zip(counts, self._snapshots[-1][1])):
            # The counts went backwards: the kernel's histogram was reset (program reloaded).
            # The older snapshots describe another histogram; start afresh.
            self._snapshots.clear()
        if not self._snapshots or now - self._snapshots[-1][0] >= MIN_SNAPSHOT_SPACING_SECONDS:
            self._snapshots.append((now, counts))
        start = self._start(now)
        if start is None:
            return None
        increase = [c - s for c, s in zip(counts, start)]
        return bucket_quantile(self.quantile, self.bounds, increase)

    def _start(self, now: float) -> tuple[int, ...] | None:
        """The newest snapshot at least a window old, else the oldest kept; older ones are
        dropped. None when only this collection's own snapshot is kept."""
        cutoff = now - self.window_seconds
        while len(self._snapshots) > 1 and self._snapshots[1][0] <= cutoff:
            self._snapshots.popleft()
        first_time, first = self._snapshots[0]
        if len(self._snapshots) == 1 and first_time == now:
            return None
        return first
