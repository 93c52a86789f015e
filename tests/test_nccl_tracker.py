"""NcclTracker: rolling average, hang boundary, minimum count, in-flight rules, eviction."""
from __future__ import annotations

import threading

import pytest

from fabricscope.exporter.nccl.events import NcclCall
from fabricscope.exporter.nccl.tracker import ConflictError, NcclTracker

T0 = 1_800_000_000.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def call(start, op="AllReduce", comm="c1", rank=0, nranks=2, nbytes=1024, end=None):
    return NcclCall(op=op, comm=comm, rank=rank, nranks=nranks, nbytes=nbytes, start=start, end=end)


def ops_of(tracker):
    return {(o.comm, o.rank, o.op): o for o in tracker.snapshot().ops}


def test_rolling_average_is_exactly_the_last_20_completed():
    clock = Clock()
    tracker = NcclTracker(clock=clock)
    # 30 completed operations: durations 1..30 s; only 11..30 may count.
    tracker.record_batch([call(T0 + 100 * i, end=T0 + 100 * i + (i + 1)) for i in range(30)])
    op = ops_of(tracker)[("c1", 0, "AllReduce")]
    assert op.calls == 30
    assert op.completed_average == pytest.approx(sum(range(11, 31)) / 20)
    assert dict(op.duration)["+Inf"] == 30


def test_next_call_completes_the_previous_operation():
    clock = Clock()
    tracker = NcclTracker(clock=clock)
    tracker.call_entered(call(T0), token=("p", 1))
    tracker.call_returned(("p", 1), 0.001)
    assert [a.op for a in tracker.active_operations()] == ["AllReduce"]
    # A call of another type on the same comm and rank ends the AllReduce: call-to-call.
    tracker.call_entered(call(T0 + 0.5, op="AllGather"), token=("p", 1))
    ops = ops_of(tracker)
    assert ops[("c1", 0, "AllReduce")].completed_average == pytest.approx(0.5)
    assert ops[("c1", 0, "AllReduce")].enqueue_sum == pytest.approx(0.001)
    active = tracker.active_operations()
    assert [(a.op, a.api_returned) for a in active] == [("AllGather", False)]   # blocked in the API


def test_other_ranks_and_comms_do_not_complete_each_other():
    tracker = NcclTracker(clock=Clock(T0 + 10))
    tracker.record_batch([call(T0, rank=0), call(T0 + 1, rank=1), call(T0 + 2, comm="c2", rank=0)])
    assert sorted((a.comm, a.rank) for a in tracker.active_operations()) == [("c1", 0), ("c1", 1), ("c2", 0)]


def seeded(clock, completed, duration=1.0):
    tracker = NcclTracker(clock=clock, min_completed=5)
    tracker.record_batch([call(T0 + 10 * i, end=T0 + 10 * i + duration) for i in range(completed)])
    tracker.record(call(T0 + 1000))            # in flight from T0+1000
    return tracker


def test_hanging_boundary_is_strictly_above_3x_average():
    clock = Clock(T0 + 1000 + 3.0)             # elapsed == 3 x 1.0: not yet
    tracker = seeded(clock, completed=5)
    [active] = tracker.active_operations()
    assert active.elapsed == pytest.approx(3.0) and active.average == pytest.approx(1.0)
    assert not active.hanging
    clock.now = T0 + 1000 + 3.01
    assert tracker.active_operations()[0].hanging


def test_no_judgement_before_minimum_completed_count():
    clock = Clock(T0 + 1000 + 100.0)           # 100x the average
    tracker = seeded(clock, completed=4)
    [active] = tracker.active_operations()
    assert active.completed == 4 and not active.hanging


def test_hang_multiplier_from_config():
    clock = Clock(T0 + 1000 + 4.0)
    tracker = NcclTracker.from_config({"hang_multiplier": 5, "min_completed": 2}, clock=clock)
    tracker.record_batch([call(T0 + i * 10, end=T0 + i * 10 + 1) for i in range(3)] + [call(T0 + 1000)])
    assert not tracker.active_operations()[0].hanging
    clock.now = T0 + 1000 + 5.5
    assert tracker.active_operations()[0].hanging


def test_ingested_start_then_end_completes_precisely_without_double_counting():
    tracker = NcclTracker(clock=Clock(T0 + 5))
    tracker.record(call(T0))
    tracker.record(call(T0, end=T0 + 0.25))
    op = ops_of(tracker)[("c1", 0, "AllReduce")]
    assert op.calls == 1 and op.completed_average == pytest.approx(0.25)
    assert tracker.active_operations() == []


def test_nranks_conflict_rejects_the_whole_batch():
    tracker = NcclTracker(clock=Clock())
    tracker.record(call(T0, nranks=4))
    with pytest.raises(ConflictError) as info:
        tracker.record_batch([call(T0 + 1, nranks=4, rank=1), call(T0 + 2, nranks=8)])
    assert info.value.index == 1 and info.value.field == "nranks"
    assert ops_of(tracker)[("c1", 0, "AllReduce")].calls == 1
    assert ("c1", 1, "AllReduce") not in ops_of(tracker)


def test_idle_communicators_are_evicted():
    clock = Clock()
    tracker = NcclTracker(clock=clock, idle_evict_seconds=60)
    tracker.record(call(T0, comm="old"))
    clock.now = T0 + 50
    tracker.record(call(T0 + 50, comm="new"))
    clock.now = T0 + 61
    snap = tracker.snapshot()
    assert {o.comm for o in snap.ops} == {"new"}
    assert snap.evicted["idle"] == 1


def test_capacity_evicts_least_recently_active_comm():
    clock = Clock()
    tracker = NcclTracker(clock=clock, max_comms=2)
    for i, comm in enumerate(["a", "b", "c"]):
        clock.now = T0 + i
        tracker.record(call(T0 + i, comm=comm))
    snap = tracker.snapshot()
    assert {o.comm for o in snap.ops} == {"b", "c"} and snap.evicted["capacity"] == 1


def test_series_limit_bounds_memory():
    tracker = NcclTracker(clock=Clock(), max_series=3, max_comms=10)
    tracker.record_batch([call(T0 + i, rank=i, nranks=10) for i in range(5)])
    snap = tracker.snapshot()
    assert len(snap.ops) == 3 and snap.dropped_calls == 2


def test_dropped_rank_is_no_longer_in_flight():
    tracker = NcclTracker(clock=Clock())
    tracker.call_entered(call(T0), token=(7, 7))
    tracker.drop_inflight("c1", 0)
    assert tracker.active_operations() == []


def test_concurrent_feeding_loses_nothing():
    tracker = NcclTracker(clock=Clock())

    def feed(rank):
        for i in range(2000):
            tracker.call_entered(call(T0 + i, rank=rank, nranks=4), token=(rank, 0))
            tracker.call_returned((rank, 0), 1e-5)

    threads = [threading.Thread(target=feed, args=(r,)) for r in range(4)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        tracker.snapshot()
    assert sum(o.calls for o in tracker.snapshot().ops) == 8000


def test_invalid_parameters_are_refused():
    with pytest.raises(ValueError, match="hang_multiplier"):
        NcclTracker(hang_multiplier=1.0)
    with pytest.raises(ValueError, match="min_completed"):
        NcclTracker(min_completed=30, window=20)


# ---- arrival lag, sequence numbers, the hang's culprit ---------------------------------------------

def steps(tracker, ranks, n, late=None, delay=0.0, start=T0, period=0.1, skip=None):
    """n synchronous steps: every rank enters op k at start + k*period (the late one +delay)."""
    for k in range(n):
        for rank in ranks:
            if skip and skip(rank, k):
                continue
            at = start + k * period + (delay if rank == late else 0.0)
            token = ("t", rank)
            tracker.call_entered(call(at, rank=rank, nranks=len(ranks)), token=token)
            tracker.call_returned(token, 1e-5)


def test_arrival_lag_is_entry_minus_the_earliest_local_rank():
    clock = Clock(T0 + 100)
    tracker = NcclTracker(clock=clock, boundary_ops=4)
    steps(tracker, range(3), 10, late=1, delay=0.04)
    seqs = {s.rank: s for s in tracker.snapshot().sequences}
    assert seqs[1].lag_count == 10 and seqs[1].lag_sum == pytest.approx(0.4)
    assert seqs[0].lag_sum == 0 and seqs[2].lag_sum == 0
    # The last boundaries, each in slot (k // 4) % 4: 4 and 8 (ops 1-10 reach no other).
    assert all(s.sequence == 10 and [(slot, k) for slot, k, _ in s.boundaries] == [(1, 4), (2, 8)]
               for s in seqs.values())
    assert seqs[1].boundaries[-1][2] - seqs[0].boundaries[-1][2] == pytest.approx(0.04)


def test_each_rank_keeps_its_last_boundaries_one_per_slot():
    """Boundaries 4, 8, ... 40 over 42 ops: the last four (28, 32, 36, 40) stay, each in slot
    (k // 4) % 4, so a peer scraped a few boundaries earlier still finds one in common; the
    slot of 24 was taken by 40."""
    clock = Clock(T0 + 100)
    tracker = NcclTracker(clock=clock, boundary_ops=4)
    steps(tracker, range(2), 42, late=1, delay=0.01)
    for seq in tracker.snapshot().sequences:
        assert [(slot, k) for slot, k, _ in seq.boundaries] == [(0, 32), (1, 36), (2, 40), (3, 28)]
        entries = dict((k, at) for _, k, at in seq.boundaries)
        assert entries[40] - entries[36] == pytest.approx(entries[36] - entries[32])


def test_the_node_exports_the_slots_its_ranks_agree_on_and_its_first_entry():
    """Rank 1 is 10 ms late into every op; rank 2 has not entered op 40 yet. The node's
    boundaries are the slots every local rank holds alike, entered first by rank 0; slot 2
    (40 on ranks 0 and 1, 24 on rank 2) is left out."""
    tracker = NcclTracker(clock=Clock(T0 + 100), boundary_ops=4)
    steps(tracker, range(3), 42, late=1, delay=0.01, skip=lambda rank, k: rank == 2 and k >= 39)
    node = {slot: (k, at) for comm, slot, k, at in tracker.snapshot().boundaries}
    assert {slot: k for slot, (k, _) in node.items()} == {0: 32, 1: 36, 3: 28}
    rank0 = {k: at for seq in tracker.snapshot().sequences if seq.rank == 0 for _, k, at in seq.boundaries}
    assert all(at == rank0[k] for k, at in node.values())


def test_boundaries_from_before_the_numbering_moved_are_dropped():
    """A rank whose numbering moves (a source that numbers ops jumping from its own count to
    another) forgets the boundaries it kept: under the new numbers they are other ops', and a
    peer reaching the same k would join on them."""
    tracker = NcclTracker(clock=Clock(T0 + 100), boundary_ops=4)
    steps(tracker, [0], 10)                              # boundaries 4 and 8
    for k in (5, 6, 7, 8):                                # renumbered from 5: op 8 is a new one
        tracker.call_entered(NcclCall(op="AllReduce", comm="c1", rank=0, nranks=1, nbytes=4, start=T0 + k + 10,
                                      sequence=k))
    [seq] = tracker.snapshot().sequences
    assert [(slot, k) for slot, k, _ in seq.boundaries] == [(2, 8)]          # 4 is gone, 8 is the new op 8
    assert seq.boundaries[0][2] == pytest.approx(T0 + 18)


def test_one_local_rank_has_no_lag_but_still_a_sequence():
    tracker = NcclTracker(clock=Clock(T0 + 100))
    steps(tracker, [5], 3)
    [seq] = tracker.snapshot().sequences
    assert seq.lag_count == 0 and seq.sequence == 3


def test_a_rank_that_goes_away_no_longer_holds_up_its_peers_lag():
    tracker = NcclTracker(clock=Clock(T0 + 100))
    steps(tracker, range(3), 5, skip=lambda rank, k: rank == 2 and k >= 3)
    tracker.drop_inflight("c1", 2)                        # its process exited
    seqs = {s.rank: s for s in tracker.snapshot().sequences}
    assert set(seqs) == {0, 1} and seqs[0].lag_count == 5


def test_a_rank_stuck_inside_its_call_while_peers_returned_is_the_culprit():
    clock = Clock(T0)
    tracker = NcclTracker(clock=clock)
    steps(tracker, range(3), 10)
    for rank in range(3):
        tracker.call_entered(call(T0 + 1.0, rank=rank, nranks=3), token=("t", rank))
        if rank != 1:
            tracker.call_returned(("t", rank), 1e-5)
    clock.now = T0 + 10
    [culprit] = tracker.snapshot().culprits
    assert (culprit.rank, culprit.reason, culprit.sequence, culprit.waiting) == (1, "stuck_in_call", 11, (0, 2))
    assert culprit.message() == ("rank 1 is stuck inside AllReduce #11 (the call has not returned) while "
                                 "ranks 0 and 2 are waiting")


def test_no_culprit_without_a_hang_or_when_every_rank_is_inside():
    clock = Clock(T0)
    tracker = NcclTracker(clock=clock)
    steps(tracker, range(2), 10, skip=lambda rank, k: rank == 1 and k == 9)
    clock.now = T0 + 0.95                                 # rank 1 is behind, but nothing hangs yet
    assert tracker.snapshot().culprits == []
    clock.now = T0 + 10
    assert [(c.rank, c.reason) for c in tracker.snapshot().culprits] == [(1, "not_entered")]
    tracker = NcclTracker(clock=clock)
    for rank in range(2):                                 # both inside, none returned: no one to blame
        tracker.call_entered(call(T0 - 5, rank=rank), token=("t", rank))
    steps(tracker, range(2), 6, start=T0 - 3)
    for rank in range(2):
        tracker.call_entered(call(T0 - 2, rank=rank), token=("u", rank))
    assert tracker.snapshot().culprits == []
