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
the time the exporter was down. `sequence_bases` returns what to add to each rank's new
count so that all of them number the same op alike.

How many ops went by while no exporter ran is not known exactly (the period drifts, the
job slows while an exporter starts: tens of ops off over a few seconds, measured on the
fake libnccl), so the numbering is not continued: the lowest rank keeps its count from
the attach. Other nodes' exporters number the comm's ops from its init, so the cross-node
boundary join (rules/mixin/rules/nccl.libsonnet, which joins only equal sequence numbers) leaves
this node out instead of joining it on a guessed op, which would show a lag of a few
periods that is not there.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankMark:
    seq: int          # collectives entered (the rank's sequence number)
    entry_ns: int     # CLOCK_MONOTONIC entry of op `seq`


def sequence_bases(before: dict[int, RankMark], now: dict[int, RankMark], period_ns: float) -> dict[int, int]:
    """rank -> what to add to its current count so that every rank numbers each op as the
    lowest rank does (its base is 0). `before` and `now` hold the same ranks."""
    if set(before) != set(now) or not now:
        raise ValueError(f"ranks before {sorted(before)} and now {sorted(now)} differ")
    if period_ns <= 0:
        raise ValueError(f"period {period_ns} ns")
    ref = min(now)
    elapsed_ref = now[ref].entry_ns - before[ref].entry_ns
    bases = {}
    for rank, mark in now.items():
        # How many more ops this rank made than the reference since the marks were saved.
        ops_apart = round(((mark.entry_ns - before[rank].entry_ns) - elapsed_ref) / period_ns)
        bases[rank] = now[ref].seq + (before[rank].seq - before[ref].seq) + ops_apart - mark.seq
    return bases
