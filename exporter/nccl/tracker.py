"""Per-(communicator, rank, op) accounting of NCCL collectives, and hang judgement.

Every source feeds the same tracker: uprobes (call_entered at the API entry, call_returned
at its return), POST /nccl/operations and the demo (record / record_batch).

"In flight" and "completed", honestly (see docs/nccl.md):
- NCCL calls are asynchronous: the API returns once the work is enqueued on the stream.
  From uprobes alone the earliest evidence that a rank moved past an operation is the
  same rank's next collective call on that communicator (NCCL serialises a
  communicator's operations on its stream). So an operation is in flight from its entry
  until that next call, and its duration is the call-to-call interval: an upper bound of
  the real completion time.
- A call whose API has not returned yet (the rank is blocked inside NCCL) is in flight
  whatever the next-call rule says; `api_returned` tells the two apart.
- A record that carries `end` (ingest API) completes precisely at `end`.

Hanging = in-flight elapsed > multiplier x rolling average of the last `window` completed
operations of that (comm, rank, op), judged only once `min_completed` operations exist.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

from .events import NcclCall

# Enqueue time is the API entry->return: microseconds normally, long when NCCL blocks.
ENQUEUE_BUCKETS = (1e-6, 4e-6, 16e-6, 64e-6, 256e-6, 1e-3, 4e-3, 16e-3, 64e-3, 0.25, 1.0, 4.0)
# Operation duration (call-to-call or start->end): sub-millisecond to a minute.
DURATION_BUCKETS = (1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# Two starts closer than this are the same operation (ingest: a start record, then its end).
_SAME_START = 1e-6


class RecordError(ValueError):
    """A record that cannot be taken; `index` and `field` say which, where known."""

    def __init__(self, message: str, index: int | None = None, field_name: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field_name


class ConflictError(RecordError):
    """A record disagrees with what is already stored (e.g. another nranks for a rank)."""


class Histogram:
    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)   # last slot: above the top bucket (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        """[(le, cumulative count)] including +Inf, as prometheus_client wants them."""
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts):
            running += count
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@dataclass
class _OpStats:
    calls: int = 0
    nbytes: int = 0
    last_call: float = 0.0
    enqueue: Histogram = field(default_factory=lambda: Histogram(ENQUEUE_BUCKETS))
    duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    recent: deque = field(default_factory=deque)     # last `window` completed durations


@dataclass
class _InFlight:
    op: str
    start: float
    nbytes: int
    api_returned: bool


@dataclass
class _Comm:
    nranks: dict[int, int] = field(default_factory=dict)           # rank -> nranks
    stats: dict[tuple[int, str], _OpStats] = field(default_factory=dict)
    inflight: dict[int, _InFlight] = field(default_factory=dict)    # rank -> its open operation
    last_activity: float = 0.0


@dataclass(frozen=True)
class OpSnapshot:
    comm: str
    rank: int
    op: str
    calls: int
    nbytes: int
    last_call: float
    enqueue: list[tuple[str, float]]
    enqueue_sum: float
    duration: list[tuple[str, float]]
    duration_sum: float
    completed_average: float | None


@dataclass(frozen=True)
class ActiveOperation:
    comm: str
    rank: int
    nranks: int
    op: str
    start: float
    nbytes: int
    elapsed: float
    average: float | None      # rolling average of completed ops of this type, if any
    completed: int             # how many completed ops the average is over
    api_returned: bool
    hanging: bool

    def as_json(self) -> dict[str, Any]:
        return {"comm": self.comm, "rank": self.rank, "nranks": self.nranks, "op": self.op,
                "start": self.start, "bytes": self.nbytes, "elapsed_seconds": round(self.elapsed, 6),
                "average_seconds": None if self.average is None else round(self.average, 6),
                "completed_count": self.completed, "api_returned": self.api_returned,
                "hanging": self.hanging}


@dataclass(frozen=True)
class TrackerSnapshot:
    comms: list[tuple[str, int, int]]          # (comm, rank, nranks)
    ops: list[OpSnapshot]
    active: list[ActiveOperation]
    evicted: dict[str, int]                    # reason -> comms evicted
    dropped_calls: int                         # calls refused by the series limit


class NcclTracker:
    # The `nccl` config keys that are tracker settings (from_config).
    CONFIG_KEYS = frozenset({"hang_multiplier", "min_completed", "window", "max_comms", "max_series",
                             "idle_evict_seconds"})

    def __init__(self, *, hang_multiplier: float = 3.0, min_completed: int = 5, window: int = 20,
                 max_comms: int = 128, max_series: int = 4096, idle_evict_seconds: float = 3600.0,
                 clock: Callable[[], float] = time.time) -> None:
        if hang_multiplier <= 1.0:
            raise ValueError(f"hang_multiplier must be > 1, got {hang_multiplier}")
        if window < 1 or min_completed < 1 or min_completed > window:
            raise ValueError(f"need 1 <= min_completed ({min_completed}) <= window ({window})")
        self.hang_multiplier = float(hang_multiplier)
        self.min_completed = int(min_completed)
        self.window = int(window)
        self.max_comms = int(max_comms)
        self.max_series = int(max_series)
        self.idle_evict_seconds = float(idle_evict_seconds)
        self.clock = clock
        self._lock = threading.RLock()
        self._comms: dict[str, _Comm] = {}
        self._series = 0
        # Uprobe calls whose API has not returned: token (pid, tid) -> (comm, rank, op, start).
        self._pending: dict[Hashable, tuple[str, int, str, float]] = {}
        self._evicted = {"idle": 0, "capacity": 0}
        self._dropped_calls = 0

    @classmethod
    def from_config(cls, section: dict[str, Any], clock: Callable[[], float] = time.time) -> "NcclTracker":
        return cls(clock=clock, **{key: section[key] for key in cls.CONFIG_KEYS if key in section})

    # ---- feeding ---------------------------------------------------------------------

    def register_comm(self, comm: str, rank: int, nranks: int) -> None:
        """A communicator was initialised (uprobe on ncclCommInit*): comm_info before any call."""
        with self._lock:
            state = self._comm(comm)
            state.nranks[rank] = nranks
            state.last_activity = max(state.last_activity, self.clock())

    def call_entered(self, call: NcclCall, token: Hashable | None = None) -> None:
        """The rank entered a collective. With a token, the call stays 'blocked' until
        call_returned(token) says the API returned."""
        with self._lock:
            if self._open(call, api_returned=token is None) and token is not None:
                self._pending[token] = (call.comm, call.rank, call.op, call.start)

    def call_returned(self, token: Hashable, enqueue_seconds: float) -> None:
        """The API call of `token` returned after enqueue_seconds (entry -> return, taken
        from the source's own clock: nanoseconds survive no round trip through UNIX time)."""
        with self._lock:
            pending = self._pending.pop(token, None)
            if pending is None:
                return                       # entry lost or its comm evicted: nothing to pair
            comm, rank, op, start = pending
            state = self._comms.get(comm)
            if state is None:
                return
            stats = state.stats.get((rank, op))
            if stats is not None:
                stats.enqueue.observe(max(0.0, enqueue_seconds))
            inflight = state.inflight.get(rank)
            if inflight is not None and abs(inflight.start - start) < _SAME_START:
                inflight.api_returned = True

    def forget_token(self, token: Hashable) -> None:
        """The thread's process exited inside the call: it will never return."""
        with self._lock:
            self._pending.pop(token, None)

    def record(self, call: NcclCall) -> None:
        self.record_batch([call])

    def record_batch(self, calls: Iterable[NcclCall]) -> None:
        """Apply whole records (ingest API, demo). All or nothing: a conflicting record
        raises ConflictError before anything is stored."""
        calls = list(calls)
        with self._lock:
            self._check_conflicts(calls)
            for call in calls:
                if call.end is not None and self._completes_open(call):
                    continue
                if not self._open(call, api_returned=True):
                    continue
                if call.enqueue_seconds is not None:
                    self._comms[call.comm].stats[(call.rank, call.op)].enqueue.observe(call.enqueue_seconds)
                if call.end is not None and not self._completes_open(call):
                    # Older than the rank's open operation: still a precise completed one.
                    stats = self._comms[call.comm].stats[(call.rank, call.op)]
                    stats.duration.observe(call.end - call.start)
                    stats.recent.append(call.end - call.start)

    def drop_inflight(self, comm: str, rank: int) -> None:
        """The rank's process went away: its open operation will never be followed."""
        with self._lock:
            state = self._comms.get(comm)
            if state is not None:
                state.inflight.pop(rank, None)

    # ---- reading -----------------------------------------------------------------------

    def snapshot(self) -> TrackerSnapshot:
        with self._lock:
            now = self.clock()
            self._evict_idle(now)
            comms, ops = [], []
            for comm, state in self._comms.items():
                for rank, nranks in sorted(state.nranks.items()):
                    comms.append((comm, rank, nranks))
                for (rank, op), stats in sorted(state.stats.items()):
                    ops.append(OpSnapshot(
                        comm=comm, rank=rank, op=op, calls=stats.calls, nbytes=stats.nbytes,
                        last_call=stats.last_call, enqueue=stats.enqueue.cumulative(),
                        enqueue_sum=stats.enqueue.total, duration=stats.duration.cumulative(),
                        duration_sum=stats.duration.total,
                        completed_average=(sum(stats.recent) / len(stats.recent)) if stats.recent else None))
            return TrackerSnapshot(comms=comms, ops=ops, active=self._active(now),
                                   evicted=dict(self._evicted), dropped_calls=self._dropped_calls)

    def active_operations(self) -> list[ActiveOperation]:
        with self._lock:
            return self._active(self.clock())

    # ---- internals (lock held) -------------------------------------------------------------

    def _active(self, now: float) -> list[ActiveOperation]:
        out = []
        for comm, state in self._comms.items():
            for rank, inflight in sorted(state.inflight.items()):
                stats = state.stats.get((rank, inflight.op))
                recent = stats.recent if stats is not None else ()
                average = sum(recent) / len(recent) if recent else None
                elapsed = max(0.0, now - inflight.start)
                hanging = (len(recent) >= self.min_completed and average is not None
                           and elapsed > self.hang_multiplier * average)
                out.append(ActiveOperation(comm=comm, rank=rank, nranks=state.nranks.get(rank, 0),
                                           op=inflight.op, start=inflight.start, nbytes=inflight.nbytes,
                                           elapsed=elapsed, average=average, completed=len(recent),
                                           api_returned=inflight.api_returned, hanging=hanging))
        return out

    def _comm(self, comm: str) -> _Comm:
        state = self._comms.get(comm)
        if state is not None:
            return state
        if len(self._comms) >= self.max_comms:
            self._evict_lru(exclude=comm)
        state = self._comms[comm] = _Comm(last_activity=self.clock())
        return state

    def _open(self, call: NcclCall, api_returned: bool) -> bool:
        """Count the call and make it the rank's open operation. False if refused."""
        state = self._comm(call.comm)
        key = (call.rank, call.op)
        stats = state.stats.get(key)
        if stats is None:
            while self._series >= self.max_series and self._evict_lru(exclude=call.comm):
                pass
            if self._series >= self.max_series:
                self._dropped_calls += 1
                return False
            stats = state.stats[key] = _OpStats(recent=deque(maxlen=self.window))
            self._series += 1
        state.nranks[call.rank] = call.nranks
        stats.calls += 1
        stats.nbytes += call.nbytes
        stats.last_call = max(stats.last_call, call.start)
        state.last_activity = max(state.last_activity, self.clock())
        previous = state.inflight.get(call.rank)
        if previous is not None and previous.start > call.start:
            return True                      # an older record arriving late: counted, not opened
        if previous is not None:
            # The next call is the earliest evidence the rank moved past the previous one.
            self._complete(state, call.rank, previous, call.start - previous.start)
        state.inflight[call.rank] = _InFlight(call.op, call.start, call.nbytes, api_returned)
        return True

    def _completes_open(self, call: NcclCall) -> bool:
        """A record with `end` for the rank's open operation: complete it precisely."""
        state = self._comms.get(call.comm)
        inflight = state.inflight.get(call.rank) if state else None
        if inflight is None or inflight.op != call.op or abs(inflight.start - call.start) >= _SAME_START:
            return False
        self._complete(state, call.rank, inflight, call.end - call.start)
        state.last_activity = max(state.last_activity, self.clock())
        return True

    def _complete(self, state: _Comm, rank: int, inflight: _InFlight, duration: float) -> None:
        if state.inflight.get(rank) is inflight:
            del state.inflight[rank]
        stats = state.stats.get((rank, inflight.op))
        if stats is None or duration < 0:
            return
        stats.duration.observe(duration)
        stats.recent.append(duration)

    def _check_conflicts(self, calls: list[NcclCall]) -> None:
        seen: dict[tuple[str, int], int] = {}
        for index, call in enumerate(calls):
            state = self._comms.get(call.comm)
            stored = state.nranks.get(call.rank) if state else None
            earlier = seen.setdefault((call.comm, call.rank), call.nranks)
            for other, where in ((stored, "already stored"), (earlier, "earlier in this batch")):
                if other is not None and other != call.nranks:
                    raise ConflictError(f"record {index}: nranks {call.nranks} disagrees with nranks {other} "
                                        f"{where} for comm {call.comm} rank {call.rank}", index, "nranks")

    def _evict_lru(self, exclude: str) -> bool:
        candidates = [(state.last_activity, comm) for comm, state in self._comms.items() if comm != exclude]
        if not candidates:
            return False
        self._drop_comm(min(candidates)[1])
        self._evicted["capacity"] += 1
        return True

    def _evict_idle(self, now: float) -> None:
        for comm in [c for c, s in self._comms.items() if now - s.last_activity > self.idle_evict_seconds]:
            self._drop_comm(comm)
            self._evicted["idle"] += 1

    def _drop_comm(self, comm: str) -> None:
        state = self._comms.pop(comm)
        self._series -= len(state.stats)
        for token in [t for t, pending in self._pending.items() if pending[0] == comm]:
            del self._pending[token]
