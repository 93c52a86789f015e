"""One event per returned collective (EV_COLL_DONE), and calls still open read from the
kernel's nccl_open_calls map as hang candidates: what the tracker sees is unchanged."""
from __future__ import annotations

import pytest

from fabricscope.exporter.nccl.tracker import NcclTracker
from fabricscope.exporter.nccl.uprobe import (EV_COLL_DONE, EV_COMM_INIT, EVENT, INIT_RANK, OPEN_CALL,
                                              EventHandler)

UID = b"\x07" * 128
TS = 5_000_000_000


def record(kind, op=0, comm=0x1000, count=0, aux=0, pid=10, tid=11, dtype=7, rank=0, nranks=0, ts=TS, seq=0):
    return EVENT.pack(ts, comm, count, aux, pid, tid, kind, op, dtype, -1, rank, nranks, seq, UID)


def handler():
    tracker = NcclTracker(clock=lambda: TS / 1e9 + 1000.0)
    h = EventHandler(tracker, monotonic_to_wall=1000.0)
    h.handle_raw(record(EV_COMM_INIT, op=INIT_RANK, rank=0, nranks=2))
    return tracker, h


def op(tracker, name="AllReduce"):
    return next(o for o in tracker.snapshot().ops if o.op == name)


def test_a_returned_call_is_entered_and_returned_from_one_event():
    tracker, h = handler()
    h.handle_raw(record(EV_COLL_DONE, count=256, aux=3_000, seq=1))            # returned 3 us after entry
    h.handle_raw(record(EV_COLL_DONE, count=256, aux=5_000, ts=TS + 10_000_000, seq=2))
    stats = op(tracker)
    assert stats.calls == 2 and stats.nbytes == 2 * 256 * 4
    assert stats.enqueue_sum == pytest.approx(8e-6)                            # both enqueue times
    [active] = tracker.active_operations()
    assert active.api_returned and active.sequence == 2
    assert h.open_calls == {} and h.counts()[1] == {}


def test_an_open_call_is_in_flight_while_blocked_and_counted_once_when_it_returns():
    tracker, h = handler()
    blocked = OPEN_CALL.pack(TS, 0x1000, 64, 1, 0, 0, 7, -1)
    h.open_call_seen(10, 11, blocked)                                          # a hang candidate
    h.open_call_seen(10, 11, blocked)                                          # read again next batch
    [active] = tracker.active_operations()
    assert not active.api_returned and op(tracker).calls == 1
    h.handle_raw(record(EV_COLL_DONE, count=64, aux=2_000_000_000, seq=1))     # it returns, 2 s later
    stats = op(tracker)
    assert stats.calls == 1 and stats.enqueue_sum == 2.0
    [active] = tracker.active_operations()
    assert active.api_returned
