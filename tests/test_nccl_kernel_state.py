"""The kernel's per-call NCCL accounting (exporter/bpf/nccl.bpf.c maps), decoded and applied
to the tracker without a kernel: what the tracker judges from it. The real maps are read in
tests/test_nccl_uprobe.py (root, fake libnccl)."""
from __future__ import annotations

import pytest

from fabricscope.exporter.nccl import kernel_state as ks
from fabricscope.exporter.nccl.tracker import (BOUNDARY_SLOTS, DURATION_BUCKETS, ENQUEUE_BUCKETS, LAG_BUCKETS,
                                                NcclTracker)
from fabricscope.exporter.nccl.uprobe import DATATYPE_BYTES, kernel_config

NOW = 1_700_000_000.0
MS = 1_000_000


def wall(ts_ns: int) -> float:
    return NOW + ts_ns / 1e9          # monotonic 0 is NOW: entries at small ts are recent


def hist(n_bounds: int, slots: dict[int, int], sum_ns: int) -> list[int]:
    """struct hist words: MAX_BOUNDS + 1 counts, then the sum."""
    counts = [0] * (ks.MAX_BOUNDS + 1)
    for slot, count in slots.items():
        assert slot <= n_bounds
        counts[slot] = count
    return counts + [sum_ns]


def rank_state(ident=0xABC, last_ts=0, last_bytes=0, seq=0, boundaries=(), last_op=0, lag=None,
               calls=None, counter_words=0, phase=0, inexact=0, from_init=1):
    """struct rank_state; by default a rank counted from its probed init (seq = its calls).
    `boundaries`: (slot, k, entry ns) of the filled slots of its boundary ring."""
    lag = lag or hist(len(LAG_BUCKETS), {}, 0)
    calls = seq if calls is None else calls
    ring = [0] * (2 * BOUNDARY_SLOTS)
    for slot, k, ts in boundaries:
        ring[2 * slot:2 * slot + 2] = k, ts
    return ks.RANK_STATE.pack(ident, last_ts, last_bytes, seq, calls, 0, 0, 0, 0, last_op,
                              counter_words, phase, inexact, from_init, 0, 0, *ring, *lag)


def op_stats(calls, nbytes, last_ts, enqueue, duration, durations_ns):
    ring = [0] * ks.RECENT_MAX
    for i, d in enumerate(durations_ns):
        ring[i % ks.RECENT_MAX] = d
    return ks.OP_STATS.pack(calls, nbytes, last_ts, *enqueue, *duration, *ring, len(durations_ns))


def apply(tracker, ref, state_raw, ops_raw, returned=True, observed_at=None):
    state = ks.decode_rank_state(state_raw, len(LAG_BUCKETS)) if state_raw is not None else None
    ops = {op: ks.decode_op_stats(raw, len(ENQUEUE_BUCKETS), len(DURATION_BUCKETS)) for op, raw in ops_raw.items()}
    at = tracker.clock() if observed_at is None else observed_at
    tracker.apply_probed(ks.probed_rank(ref, state, ops, returned, wall, at))


def test_counters_histograms_and_the_rolling_average_come_from_the_kernel():
    tracker = NcclTracker(clock=lambda: NOW + 10, window=4, min_completed=2)
    ref = ks.CommRef("c0ffee", 1, 2)
    durations = [100 * MS] * 70                    # more than the ring holds: it has wrapped
    durations[-1] = 300 * MS                       # the newest
    tenth = DURATION_BUCKETS.index(0.1)            # 100 ms durations land in le="0.1"
    allreduce = op_stats(71, 71 * 4096, 7_100 * MS,
                         hist(len(ENQUEUE_BUCKETS), {0: 70, len(ENQUEUE_BUCKETS): 1}, 71_000),
                         hist(len(DURATION_BUCKETS), {tenth: 69, tenth + 1: 1}, sum(durations)), durations)
    # boundary_ops 16: the ring holds 16 (slot 1), 32, 48 and 64 (slot 0, which 0 never took).
    boundaries = [(slot, k, k * 100 * MS) for slot, k in ((0, 64), (1, 16), (2, 32), (3, 48))]
    apply(tracker, ref, rank_state(last_ts=7_100 * MS, last_bytes=4096, seq=71, boundaries=boundaries,
                                   last_op=0), {0: allreduce})
    snap = tracker.snapshot()
    [op] = snap.ops
    assert (op.comm, op.rank, op.op, op.calls, op.nbytes) == ("c0ffee", 1, "AllReduce", 71, 71 * 4096)
    assert op.last_call == pytest.approx(NOW + 7.1)
    assert op.enqueue[0] == (repr(ENQUEUE_BUCKETS[0]), 70) and op.enqueue[-1] == ("+Inf", 71)
    assert op.enqueue_sum == pytest.approx(71e-6)
    assert dict(op.duration)["0.1"] == 69 and dict(op.duration)["+Inf"] == 70
    # The window's last 4 durations, newest last: 100, 100, 100, 300 ms.
    assert op.completed_average == pytest.approx(0.15)
    [seq] = snap.sequences
    assert seq.sequence == 71
    assert seq.boundaries == ((0, 64, pytest.approx(NOW + 6.4)), (1, 16, pytest.approx(NOW + 1.6)),
                              (2, 32, pytest.approx(NOW + 3.2)), (3, 48, pytest.approx(NOW + 4.8)))
    assert seq.lag_count == 0                      # one local rank: nobody to be late against
    [active] = snap.active
    assert (active.op, active.start, active.nbytes, active.api_returned) == ("AllReduce", pytest.approx(NOW + 7.1),
                                                                             4096, True)
    assert active.elapsed == pytest.approx(2.9) and active.hanging is True     # 2.9 s > 3 x 0.15 s


def test_a_rank_behind_its_peer_is_the_culprit_and_a_call_inside_nccl_is_not_returned():
    tracker = NcclTracker(clock=lambda: NOW + 60)
    one = [100 * MS] * 10
    for rank, seq, returned in ((0, 20, False), (1, 19, True)):
        ref = ks.CommRef("feed", rank, 2)
        tracker.register_comm("feed", rank, 2)
        late = LAG_BUCKETS.index(0.01)             # 5 ms late lands in le="0.01"
        lag = hist(len(LAG_BUCKETS), {0: seq} if rank == 0 else {late: seq}, 0 if rank == 0 else seq * 5 * MS)
        stats = op_stats(seq, seq * 8, seq * 100 * MS, hist(len(ENQUEUE_BUCKETS), {0: seq}, seq * 1000),
                         hist(len(DURATION_BUCKETS), {3: len(one)}, sum(one)), one)
        apply(tracker, ref, rank_state(last_ts=seq * 100 * MS, seq=seq, last_op=0, lag=lag), {0: stats},
              returned=returned)
    snap = tracker.snapshot()
    [culprit] = snap.culprits
    assert culprit.message() == "rank 1 never entered AllReduce #20, which rank 0 is waiting in"
    assert {a.rank: a.api_returned for a in snap.active} == {0: False, 1: True}
    lag = {s.rank: (s.lag_count, s.lag_sum) for s in snap.sequences}
    assert lag[0] == (20, 0.0) and lag[1] == (19, pytest.approx(19 * 0.005))


def test_unknown_comm_is_counted_without_a_rank_sequence():
    tracker = NcclTracker(clock=lambda: NOW)
    ref = ks.CommRef("unknown-1234abcd", -1, 0)
    stats = op_stats(3, 24, 300 * MS, hist(len(ENQUEUE_BUCKETS), {0: 3}, 3000),
                     hist(len(DURATION_BUCKETS), {3: 2}, 200 * MS), [100 * MS, 100 * MS])
    apply(tracker, ref, rank_state(ident=0, last_ts=300 * MS, seq=3, last_op=0), {0: stats})
    snap = tracker.snapshot()
    assert [(o.comm, o.rank, o.calls) for o in snap.ops] == [("unknown-1234abcd", -1, 3)]
    assert snap.sequences == []


def test_a_rank_without_an_exact_number_is_in_flight_but_never_compared_or_blamed():
    """Rank 1 has no exact number (a late-started exporter, a counter that never moved): its
    hang still shows, but it gets no sequence and no lag, and is never the culprit."""
    tracker = NcclTracker(clock=lambda: NOW + 60, window=4, min_completed=2)
    stats = op_stats(20, 80, 2_000 * MS, hist(len(ENQUEUE_BUCKETS), {0: 20}, 1000),
                     hist(len(DURATION_BUCKETS), {3: 19}, 19 * 100 * MS), [100 * MS] * 19)
    apply(tracker, ks.CommRef("c0", 0, 2), rank_state(last_ts=2_000 * MS, seq=20, last_op=0), {0: stats})
    unnumbered = rank_state(last_ts=1_900 * MS, seq=0, calls=19, last_op=0, counter_words=5, phase=2, from_init=0)
    state = ks.decode_rank_state(unnumbered, len(LAG_BUCKETS))
    assert state.numbering("") == ("none", "counter_unverified")
    apply(tracker, ks.CommRef("c0", 1, 2), unnumbered, {0: stats})
    snap = tracker.snapshot()
    assert {a.rank for a in snap.active if a.hanging} == {0, 1}
    assert [s.rank for s in snap.sequences] == [0] and snap.culprits == []


@pytest.mark.parametrize("fields, numbering", [
    ({"counter_words": 5, "phase": 3}, ("counter", "")),
    ({"counter_words": 5, "phase": 3, "inexact": 1}, ("init", "")),            # counted from the init instead
    ({"counter_words": 5, "phase": 3, "inexact": 1, "from_init": 0}, ("none", "counter_inexact")),
    ({"counter_words": 1, "phase": 1, "from_init": 0}, ("none", "counter_unverified")),
    ({"from_init": 0}, ("none", "release_not_tabled")),
])
def test_how_a_rank_is_numbered_is_said(fields, numbering):
    state = ks.decode_rank_state(rank_state(seq=5, **fields), len(LAG_BUCKETS))
    assert state.numbering("release_not_tabled") == numbering


def test_unfilled_boundary_slots_are_not_boundaries():
    """A slot whose k is 0 was never filled (a fresh rank, or one whose numbering moved):
    only the filled ones reach the tracker, each under its own slot."""
    state = ks.decode_rank_state(rank_state(seq=40, boundaries=[(2, 40, 4_000 * MS)]), len(LAG_BUCKETS))
    assert state.boundaries == ((2, 40, 4_000 * MS),)


def test_maps_whose_values_are_not_their_layouts_size_are_refused_at_load():
    sizes = {name: layout.size for name, layout in ks.MAP_LAYOUTS.items()}
    ks.check_layouts(sizes)
    for name, wrong in (("nccl_rank_state", 10), ("nccl_op_stats", ks.OP_STATS.size + 8), ("nccl_open_calls", None)):
        with pytest.raises(ks.LayoutError, match=f"map {name}: values of {wrong} bytes"):
            ks.check_layouts({**sizes, name: wrong})


def test_the_config_carries_the_trackers_bounds_in_ns_and_refuses_what_does_not_fit():
    raw = kernel_config(NcclTracker(boundary_ops=32))
    words = ks.CONFIG.unpack(raw)
    m = ks.MAX_BOUNDS
    assert words[:len(ENQUEUE_BUCKETS)] == tuple(round(b * 1e9) for b in ENQUEUE_BUCKETS)
    assert words[m:m + len(DURATION_BUCKETS)] == tuple(round(b * 1e9) for b in DURATION_BUCKETS)
    assert words[3 * m:3 * m + 4] == (len(ENQUEUE_BUCKETS), len(DURATION_BUCKETS), len(LAG_BUCKETS), 32)
    assert words[3 * m + 4 + 9] == DATATYPE_BYTES[9] == 2                 # bfloat16
    with pytest.raises(ValueError, match="ascending"):
        ks.encode_config([2.0, 1.0], DURATION_BUCKETS, LAG_BUCKETS, 64, DATATYPE_BYTES)
    with pytest.raises(ValueError, match="at most 16"):
        ks.encode_config([i + 1.0 for i in range(17)], DURATION_BUCKETS, LAG_BUCKETS, 64, DATATYPE_BYTES)
    with pytest.raises(ValueError, match="datatype 20"):
        ks.encode_config(ENQUEUE_BUCKETS, DURATION_BUCKETS, LAG_BUCKETS, 64, {20: 4})


def test_elapsed_time_counts_only_up_to_the_read_that_saw_the_rank_in_flight():
    """Between two reads of the kernel's state a fast operation has long completed: judged
    up to "now" it would look hung on almost every scrape."""
    now = [NOW + 10.0]
    tracker = NcclTracker(clock=lambda: now[0], window=4, min_completed=2)
    ref = ks.CommRef("beef", 0, 2)
    ten_ms = [10 * MS] * 8
    stats = op_stats(9, 72, 9_990 * MS, hist(len(ENQUEUE_BUCKETS), {0: 9}, 9000),
                     hist(len(DURATION_BUCKETS), {3: 8}, sum(ten_ms)), ten_ms)
    # Read at NOW + 10.0 s: the rank entered its latest op 10 ms before.
    apply(tracker, ref, rank_state(last_ts=9_990 * MS, seq=9, last_op=0), {0: stats}, observed_at=NOW + 10.0)
    now[0] = NOW + 10.9                         # a scrape just before the next read
    [active] = tracker.active_operations()
    assert active.elapsed == pytest.approx(0.01) and active.hanging is False
    # The next reads find the rank still in that op: now it is in flight for real.
    for at in (NOW + 11.0, NOW + 12.0):
        tracker.observed("beef", 0, at)
    now[0] = NOW + 12.5
    [active] = tracker.active_operations()
    assert active.elapsed == pytest.approx(2.01) and active.hanging is True
    tracker.observed("gone", 0, NOW + 13.0)     # an evicted or unknown comm: nothing happens
    assert tracker.active_operations() == [active]
