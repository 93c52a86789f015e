"""Joining a communicator's local ranks on the same operation after the exporter restarted.

Arrival lag and the hang's culprit join local ranks by sequence number: the k-th collective
each rank enters is the same operation. A restarted exporter counts from its attach, and
the probes cannot tell which operation each rank was in at that instant: with a rank 40 ms
late to every step, its peers have usually entered op k and wait while it has not, so
counting from the attach joins them one op apart (lag shown on the wrong ranks, no culprit).
Uprobe timings alone cannot settle it: a periodic job looks the same shifted by one op.

What settles it is what the previous exporter knew. It saves, every few seconds, each
local rank's sequence number and the entry time of that op (`RankMark`; CLOCK_MONOTONIC,
which survives the exporter but not a reboot). After the restart, every rank has made
n_r more calls since its saved mark; the ranks march in step, so n_r - n_0 is the whole
number of periods nearest to (elapsed_r - elapsed_0), a difference of lags, never of
the (jittery) time the exporter was down. That gives every rank its sequence number in the
previous numbering: `sequence_bases` returns what to add to each rank's new count.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankMark:
    seq: int          # collectives entered (the rank's sequence number)
    entry_ns: int     # CLOCK_MONOTONIC entry of op `seq`


def sequence_bases(before: dict[int, RankMark], now: dict[int, RankMark], period_ns: float) -> dict[int, int]:
    """rank -> what to add to its current count so that every rank numbers ops as the
    previous exporter did. `before` and `now` hold the same ranks."""
    if set(before) != set(now) or not now:
        raise ValueError(f"ranks before {sorted(before)} and now {sorted(now)} differ")
    if period_ns <= 0:
        raise ValueError(f"period {period_ns} ns")
    ref = min(now)
    elapsed_ref = now[ref].entry_ns - before[ref].entry_ns
    # The reference's own count may be off by whole periods (jitter over the downtime);
    # that error is common to every rank and only shifts the numbering, not the join.
    seq_ref = before[ref].seq + round(elapsed_ref / period_ns)
    bases = {}
    for rank, mark in now.items():
        ops_apart = round(((mark.entry_ns - before[rank].entry_ns) - elapsed_ref) / period_ns)
        bases[rank] = seq_ref + (before[rank].seq - before[ref].seq) + ops_apart - mark.seq
    return bases
