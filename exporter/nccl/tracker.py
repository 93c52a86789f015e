"""Per-(communicator, rank, op) accounting of NCCL collectives, and hang judgement.

Every source feeds the same tracker: POST /nccl/operations applies whole call records
(record / record_batch); the demo enters and returns calls one by one (call_entered /
call_returned); the uprobes' accounting is done per call in the kernel
(exporter/bpf/nccl.bpf.c) and applied here as cumulative state, about once a second
(apply_probed), so the judgements below are the same whatever the source.

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

Arrival lag and sequence numbers (docs/nccl.md, "Arrival lag"):
- Every rank of a communicator calls its collectives in the same order, so the k-th
  collective a rank enters on a comm is the same operation on every rank. Its sequence
  number k (Send/Recv excluded: they involve two ranks, not the comm) joins the ranks.
- In a synchronous job every rank has the same call-to-call period; a late rank differs
  only in *when* it enters. Arrival lag of rank r at op k = entry(r, k) - min over the
  comm's local ranks of entry(., k), observed once every local rank has entered op k.
- For a comm spanning nodes, each rank exports its sequence number and the entry times of
  its last BOUNDARY_SLOTS ops at a sequence boundary (k a multiple of `boundary_ops`, in slot
  (k / boundary_ops) % BOUNDARY_SLOTS), so a PromQL rule can join ranks of several nodes on
  the same op k even when their scrapes show different latest boundaries.
- The hang's culprit: while a comm hangs, a local rank whose sequence number is behind its
  local peers never entered the op they wait in (`not_entered`); a rank whose API call has
  not returned while a peer's has is `stuck_in_call`.
"""
from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

from .events import NcclCall

# Coarse bucket layouts on purpose: these histograms come per (comm, rank, op), 8 ranks
# and often 2-3 collective types on a node, and no alert reads their buckets (the hang,
# stall and straggler rules take _sum/_count and the gauges). Each bucket is a series of
# every rank's share of the node's budget (docs/metrics.md), so they only tell orders of
# magnitude apart.
# Enqueue time is the API entry->return: microseconds normally, long when NCCL blocks.
ENQUEUE_BUCKETS = (16e-6, 1e-3, 64e-3)
# Operation duration (call-to-call or start->end): sub-millisecond to a minute.
DURATION_BUCKETS = (0.01, 0.1, 1.0, 10.0)

# Arrival lag: the earliest local rank is 0; a late rank microseconds to seconds.
LAG_BUCKETS = (1e-3, 0.01, 0.1, 1.0)

# Sequence boundaries kept per rank (BOUNDARY_SLOTS in exporter/bpf/nccl.bpf.c): boundary k
# in slot (k // boundary_ops) % BOUNDARY_SLOTS. Two nodes' scrapes up to BOUNDARY_SLOTS - 1
# boundaries apart still share one to join on, so boundaries can come faster than scrapes
# (docs/nccl.md, "Across nodes"). Each slot is two series per comm and node (docs/metrics.md).
BOUNDARY_SLOTS = 4

# Two starts closer than this are the same operation (ingest: a start record, then its end).
_SAME_START = 1e-6
# Point-to-point calls involve two ranks, not the communicator: no sequence number.
_P2P = frozenset({"Send", "Recv"})
# Ops waiting for a local rank that never enters them (it stopped, or its entry was lost):
# beyond this many the oldest are forgotten.
_MAX_PENDING_ARRIVALS = 256


class RecordError(ValueError):
    """A record that cannot be taken; `index` and `field` say which, where known."""

    def __init__(self, message: str, index: int | None = None, field_name: str | None = None) -> None:
        super().__init__(message)
        self.index = index
        self.field = field_name


class ConflictError(RecordError):
    """A record disagrees with what is already stored (e.g. another nranks for the comm)."""


class CapacityError(RecordError):
    """Ingested records would need room that only communicators seen through the uprobes hold."""


class Histogram:
    __slots__ = ("buckets", "counts", "total")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)   # last slot: above the top bucket (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def load(self, counts: list[int], total: float) -> None:
        """Take cumulative counts kept elsewhere (the kernel), one per bucket plus +Inf."""
        if len(counts) != len(self.counts):
            raise ValueError(f"{len(counts)} bucket counts for {len(self.counts)} buckets")
        self.counts = list(counts)
        self.total = total

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
    # When the source last saw the rank still in this operation (the kernel's accounting,
    # read about once a second); None: the source reports calls as they happen. Elapsed
    # time is judged up to then: "now" would count the time since the last read as time
    # in flight, and every fast operation would look hung between two reads.
    observed_at: float | None = None


@dataclass
class _RankSequence:
    sequence: int = 0                  # collectives entered (Send/Recv excluded)
    last_op: str = ""
    # slot -> (k, entry) of the last BOUNDARY_SLOTS ops whose k is a multiple of boundary_ops
    boundaries: dict[int, tuple[int, float]] = field(default_factory=dict)
    lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))


@dataclass
class _Comm:
    nranks: dict[int, int] = field(default_factory=dict)           # rank -> nranks
    stats: dict[tuple[int, str], _OpStats] = field(default_factory=dict)
    inflight: dict[int, _InFlight] = field(default_factory=dict)    # rank -> its open operation
    last_activity: float = 0.0
    # Seen through the uprobes (a real process on this node): never evicted to make room
    # for ingested records, which anyone allowed to POST can invent.
    probed: bool = False
    ranks: dict[int, _RankSequence] = field(default_factory=dict)   # the local ranks that take part
    arrivals: dict[int, dict[int, float]] = field(default_factory=dict)   # sequence -> rank -> entry
    pids: dict[int, int] = field(default_factory=dict)             # rank -> the process that reported it


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
class RankSequence:
    comm: str
    rank: int
    sequence: int
    boundaries: tuple[tuple[int, int, float], ...]   # (slot, k, entry) of the live boundaries
    lag: list[tuple[str, float]]
    lag_sum: float
    lag_count: int


@dataclass(frozen=True)
class Culprit:
    comm: str
    rank: int
    reason: str                # not_entered | stuck_in_call
    sequence: int              # the op the waiting ranks are in
    op: str
    waiting: tuple[int, ...]   # local ranks waiting for it

    def message(self) -> str:
        waiting = _join_ranks(self.waiting)
        verb = "is" if len(self.waiting) == 1 else "are"
        if self.reason == "not_entered":
            return (f"rank {self.rank} never entered {self.op} #{self.sequence}, "
                    f"which {waiting} {verb} waiting in")
        return (f"rank {self.rank} is stuck inside {self.op} #{self.sequence} (the call has not returned) "
                f"while {waiting} {verb} waiting")

    def as_json(self) -> dict[str, Any]:
        return {"comm": self.comm, "rank": self.rank, "reason": self.reason, "sequence": self.sequence,
                "op": self.op, "waiting_ranks": list(self.waiting), "message": self.message()}


def _join_ranks(ranks: tuple[int, ...]) -> str:
    names = [str(r) for r in ranks]
    if len(names) == 1:
        return f"rank {names[0]}"
    return "ranks " + ", ".join(names[:-1]) + " and " + names[-1]


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
    sequence: int = 0          # the rank's collective sequence number on the comm

    def as_json(self) -> dict[str, Any]:
        return {"comm": self.comm, "rank": self.rank, "nranks": self.nranks, "op": self.op,
                "sequence": self.sequence,
                "start": self.start, "bytes": self.nbytes, "elapsed_seconds": round(self.elapsed, 6),
                "average_seconds": None if self.average is None else round(self.average, 6),
                "completed_count": self.completed, "api_returned": self.api_returned,
                "hanging": self.hanging}


@dataclass(frozen=True)
class ProbedOp:
    """One (comm, rank, op) as the kernel counted it since the comm's init: cumulative."""
    op: str
    calls: int
    nbytes: int
    last_call: float                       # UNIX seconds of the latest entry
    enqueue: tuple[list[int], float]       # bucket counts (ENQUEUE_BUCKETS + above), sum seconds
    duration: tuple[list[int], float]      # (DURATION_BUCKETS + above), sum seconds
    recent: list[float]                    # the latest completed durations, oldest first


@dataclass(frozen=True)
class ProbedRank:
    """A local rank's state in the kernel (exporter/nccl/kernel_state.py)."""
    comm: str
    rank: int
    nranks: int
    ops: tuple[ProbedOp, ...] = ()
    sequence: int = 0
    last_op: str | None = None             # the rank's latest call: in flight until its next
    last_start: float | None = None
    last_nbytes: int = 0
    api_returned: bool = True
    boundaries: tuple[tuple[int, int, float], ...] = ()   # (slot, k, entry UNIX seconds) as the kernel keeps them
    lag: tuple[list[int], float] | None = None   # bucket counts (LAG_BUCKETS + above), sum seconds
    observed_at: float | None = None       # when the kernel's state was read (UNIX seconds)
    # False: the rank's ops have no exact number (docs/nccl.md, "Numbering"): no lag, no
    # sequence, never a culprit, whatever its peers do.
    numbered: bool = True


@dataclass(frozen=True)
class TrackerSnapshot:
    comms: list[tuple[str, int, int]]          # (comm, rank, nranks)
    ops: list[OpSnapshot]
    active: list[ActiveOperation]
    evicted: dict[str, int]                    # reason -> comms evicted
    dropped_calls: int                         # calls refused by the series limit
    sequences: list[RankSequence] = field(default_factory=list)
    culprits: list[Culprit] = field(default_factory=list)
    # (comm, slot, k, earliest entry): the boundary every local rank of the comm holds in that
    # slot, and when the first of them entered it
    boundaries: list[tuple[str, int, int, float]] = field(default_factory=list)


# The hang verdict's defaults. The tracker is the one home of the hang threshold: the
# recording rules read its fabric_nccl_hanging verdict and the dashboard draws its hang
# line from these, so nothing else restates them.
DEFAULT_HANG_MULTIPLIER = 3.0
DEFAULT_MIN_COMPLETED = 5
DEFAULT_WINDOW = 20


class NcclTracker:
    # The `nccl` config keys that are tracker settings (from_config).
    CONFIG_KEYS = frozenset({"hang_multiplier", "min_completed", "window", "max_comms", "max_series",
                             "idle_evict_seconds", "boundary_ops"})

    def __init__(self, *, hang_multiplier: float = DEFAULT_HANG_MULTIPLIER,
                 min_completed: int = DEFAULT_MIN_COMPLETED, window: int = DEFAULT_WINDOW,
                 max_comms: int = 128, max_series: int = 4096, idle_evict_seconds: float = 3600.0,
                 boundary_ops: int = 64, clock: Callable[[], float] = time.time) -> None:
        if hang_multiplier <= 1.0:
            raise ValueError(f"hang_multiplier must be > 1, got {hang_multiplier}")
        if window < 1 or min_completed < 1 or min_completed > window:
            raise ValueError(f"need 1 <= min_completed ({min_completed}) <= window ({window})")
        if boundary_ops < 1:
            raise ValueError(f"boundary_ops must be >= 1, got {boundary_ops}")
        self.boundary_ops = int(boundary_ops)
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
        # Entered calls whose API has not returned (call_entered): token -> (comm, rank, op, start).
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
            state = self._comm(comm, probed=True)
            state.nranks[rank] = nranks
            if rank >= 0:
                state.ranks.setdefault(rank, _RankSequence())
            state.last_activity = max(state.last_activity, self.clock())

    def call_entered(self, call: NcclCall, token: Hashable | None = None) -> None:
        """The rank entered a collective. With a token, the call stays 'blocked' until
        call_returned(token) says the API returned."""
        with self._lock:
            if self._open(call, api_returned=token is None, probed=True) and token is not None:
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

    def apply_probed(self, probed: ProbedRank) -> None:
        """Take a local rank's kernel accounting: its counters and histograms replace what
        is stored (they are cumulative), its latest call is its operation in flight."""
        with self._lock:
            state = self._comm(probed.comm, probed=True)
            state.nranks[probed.rank] = probed.nranks
            for op in probed.ops:
                stats = self._stats(state, probed.comm, (probed.rank, op.op), probed=True)
                if stats is None:
                    continue
                stats.calls, stats.nbytes = op.calls, op.nbytes
                stats.last_call = max(stats.last_call, op.last_call)
                stats.enqueue.load(*op.enqueue)
                stats.duration.load(*op.duration)
                stats.recent = deque(op.recent[-self.window:], maxlen=self.window)
            if probed.last_start is None or probed.last_op is None:
                return
            state.last_activity = max(state.last_activity, probed.last_start)
            state.inflight[probed.rank] = _InFlight(probed.last_op, probed.last_start, probed.last_nbytes,
                                                    probed.api_returned, probed.observed_at)
            if not probed.numbered:
                state.ranks.pop(probed.rank, None)
                return
            if probed.rank < 0 or (probed.last_op in _P2P and not probed.sequence):
                return                       # unknown rank, or only Send/Recv so far: no sequence
            seq = state.ranks.setdefault(probed.rank, _RankSequence())
            seq.sequence = probed.sequence
            if probed.last_op not in _P2P:
                seq.last_op = probed.last_op
            seq.boundaries = {slot: (k, start) for slot, k, start in probed.boundaries}
            if probed.lag is not None:
                seq.lag.load(*probed.lag)

    def observed(self, comm: str, rank: int, at: float) -> None:
        """The kernel's state of a rank was read again, unchanged: its operation in flight
        is still in flight at `at`. A comm evicted meanwhile stays evicted."""
        with self._lock:
            state = self._comms.get(comm)
            inflight = state.inflight.get(rank) if state is not None else None
            if inflight is not None and inflight.observed_at is not None:
                inflight.observed_at = max(inflight.observed_at, at)

    def record(self, call: NcclCall) -> None:
        self.record_batch([call])

    def record_batch(self, calls: Iterable[NcclCall]) -> None:
        """Apply whole records (ingest API, demo). All or nothing: a conflicting record
        raises ConflictError before anything is stored."""
        calls = list(calls)
        with self._lock:
            self._check_conflicts(calls)
            self._check_capacity(calls)
            for call in calls:
                if call.end is not None and self._completes_open(call):
                    continue
                if not self._open(call, api_returned=True, probed=False):
                    continue
                if call.enqueue_seconds is not None:
                    self._comms[call.comm].stats[(call.rank, call.op)].enqueue.observe(call.enqueue_seconds)
                if call.end is not None and not self._completes_open(call):
                    # Older than the rank's open operation: still a precise completed one.
                    stats = self._comms[call.comm].stats[(call.rank, call.op)]
                    stats.duration.observe(call.end - call.start)
                    stats.recent.append(call.end - call.start)

    def forget_comm(self, comm: str) -> None:
        """Drop a comm's label and everything under it: an `unknown-` placeholder whose
        communicator was read at last goes on under its real name."""
        with self._lock:
            if comm in self._comms:
                self._drop_comm(comm)

    def drop_inflight(self, comm: str, rank: int) -> None:
        """The rank's process went away: its open operation will never be followed."""
        with self._lock:
            state = self._comms.get(comm)
            if state is not None:
                state.inflight.pop(rank, None)
                # It no longer takes part: its peers' later ops must not wait for it.
                if state.ranks.pop(rank, None) is not None:
                    self._settle_arrivals(state)

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
            active = self._active(now)
            # Arrival lag needs a local peer to be late against: with one local rank there is
            # none (the kernel still counts its zeros), and the sequence boundaries join nodes.
            sequences = [RankSequence(comm=comm, rank=rank, sequence=seq.sequence,
                                      boundaries=tuple((slot, k, at) for slot, (k, at) in sorted(seq.boundaries.items())),
                                      lag=seq.lag.cumulative(),
                                      lag_sum=seq.lag.total,
                                      lag_count=sum(seq.lag.counts) if len(state.ranks) >= 2 else 0)
                         for comm, state in self._comms.items() for rank, seq in sorted(state.ranks.items())]
            return TrackerSnapshot(comms=comms, ops=ops, active=active, evicted=dict(self._evicted),
                                   dropped_calls=self._dropped_calls, sequences=sequences,
                                   culprits=self._culprits(active), boundaries=self._node_boundaries())

    def rank_processes(self) -> list[tuple[str, int, int, int]]:
        """(comm, rank, nranks, pid) of the ranks whose records named their process."""
        with self._lock:
            return [(comm, rank, state.nranks.get(rank, 0), pid)
                    for comm, state in self._comms.items() for rank, pid in sorted(state.pids.items())]

    def active_operations(self) -> list[ActiveOperation]:
        with self._lock:
            return self._active(self.clock())

    def hang_culprits(self) -> tuple[list[ActiveOperation], list[Culprit]]:
        with self._lock:
            active = self._active(self.clock())
            return active, self._culprits(active)

    # ---- internals (lock held) -------------------------------------------------------------

    def _active(self, now: float) -> list[ActiveOperation]:
        out = []
        for comm, state in self._comms.items():
            for rank, inflight in sorted(state.inflight.items()):
                stats = state.stats.get((rank, inflight.op))
                recent = stats.recent if stats is not None else ()
                average = sum(recent) / len(recent) if recent else None
                seen = now if inflight.observed_at is None else min(now, inflight.observed_at)
                elapsed = max(0.0, seen - inflight.start)
                hanging = (len(recent) >= self.min_completed and average is not None
                           and elapsed > self.hang_multiplier * average)
                seq = state.ranks.get(rank)
                out.append(ActiveOperation(comm=comm, rank=rank, nranks=state.nranks.get(rank, 0),
                                           op=inflight.op, start=inflight.start, nbytes=inflight.nbytes,
                                           elapsed=elapsed, average=average, completed=len(recent),
                                           api_returned=inflight.api_returned, hanging=hanging,
                                           sequence=seq.sequence if seq else 0))
        return out

    def _culprits(self, active: list[ActiveOperation]) -> list[Culprit]:
        """While a comm hangs, the local ranks holding it up (see the module docstring)."""
        hanging = {a.comm for a in active if a.hanging}
        by_rank = {(a.comm, a.rank): a for a in active}
        out = []
        for comm in sorted(hanging):
            ranks = self._comms[comm].ranks
            if len(ranks) < 2:
                continue                     # nobody local to compare with
            front = max(seq.sequence for seq in ranks.values())
            ahead = sorted(r for r, seq in ranks.items() if seq.sequence == front)
            op = ranks[ahead[0]].last_op
            behind = sorted(r for r, seq in ranks.items() if seq.sequence < front)
            out += [Culprit(comm, rank, "not_entered", front, op, tuple(ahead)) for rank in behind]
            if behind:
                continue
            # Everyone entered the op: a rank still inside the call while a peer's returned.
            inside = [r for r in ahead if (comm, r) in by_rank and not by_rank[(comm, r)].api_returned]
            returned = tuple(r for r in ahead if r not in inside)
            if inside and returned:
                out += [Culprit(comm, rank, "stuck_in_call", front, op, returned) for rank in inside]
        return out

    def _comm(self, comm: str, probed: bool) -> _Comm:
        state = self._comms.get(comm)
        if state is not None:
            state.probed |= probed
            return state
        if len(self._comms) >= self.max_comms:
            self._evict_lru(exclude=comm, probed_too=probed)
        state = self._comms[comm] = _Comm(last_activity=self.clock(), probed=probed)
        return state

    def _open(self, call: NcclCall, api_returned: bool, probed: bool) -> bool:
        """Count the call and make it the rank's open operation. False if refused."""
        state = self._comm(call.comm, probed)
        stats = self._stats(state, call.comm, (call.rank, call.op), probed)
        if stats is None:
            return False
        state.nranks[call.rank] = call.nranks
        if call.pid is not None:
            state.pids[call.rank] = call.pid
        stats.calls += 1
        stats.nbytes += call.nbytes
        stats.last_call = max(stats.last_call, call.start)
        state.last_activity = max(state.last_activity, self.clock())
        previous = state.inflight.get(call.rank)
        if previous is not None and previous.start > call.start:
            return True                      # an older record arriving late: counted, not opened
        if call.op not in _P2P and call.rank >= 0:
            self._arrive(state, call)
        if previous is not None:
            # The next call is the earliest evidence the rank moved past the previous one.
            self._complete(state, call.rank, previous, call.start - previous.start)
        state.inflight[call.rank] = _InFlight(call.op, call.start, call.nbytes, api_returned)
        return True

    def _stats(self, state: _Comm, comm: str, key: tuple[int, str], probed: bool) -> _OpStats | None:
        """The (rank, op) series, made room for under max_series; None (and a dropped call)
        when there is none."""
        stats = state.stats.get(key)
        if stats is None:
            while self._series >= self.max_series and self._evict_lru(exclude=comm, probed_too=probed):
                pass
            if self._series >= self.max_series:
                self._dropped_calls += 1
                return None
            stats = state.stats[key] = _OpStats(recent=deque(maxlen=self.window))
            self._series += 1
        return stats

    def _arrive(self, state: _Comm, call: NcclCall) -> None:
        """Number the rank's collective and judge arrival lag once every local rank entered it."""
        seq = state.ranks.setdefault(call.rank, _RankSequence())
        number = call.sequence if call.sequence is not None else seq.sequence + 1
        if number != seq.sequence + 1:
            # The numbering moved (as in nccl.bpf.c): a kept boundary is some other op's under
            # the new numbers, and a peer reaching that k would join on it.
            seq.boundaries.clear()
        seq.sequence = number
        seq.last_op = call.op
        if seq.sequence % self.boundary_ops == 0:
            seq.boundaries[(seq.sequence // self.boundary_ops) % BOUNDARY_SLOTS] = (seq.sequence, call.start)
        state.arrivals.setdefault(seq.sequence, {})[call.rank] = call.start
        while len(state.arrivals) > _MAX_PENDING_ARRIVALS:
            del state.arrivals[min(state.arrivals)]
        self._settle_arrivals(state, [seq.sequence])

    def _node_boundaries(self) -> list[tuple[str, int, int, float]]:
        """Per comm, the slots in which every local rank holds the same boundary k, and the
        earliest local entry into it: the node's part of the cross-node join (docs/nccl.md,
        "Across nodes"). The join compares nodes' earliest ranks (each rank's lag behind that
        is its arrival lag), so the node exports one entry per slot, not one per rank. A slot a
        local rank has not filled, or has refilled ahead of its peers, is left out: the node
        joins only on an op all its ranks entered."""
        out = []
        for comm, state in self._comms.items():
            if not state.ranks:
                continue
            for slot in range(BOUNDARY_SLOTS):
                held = [seq.boundaries.get(slot) for seq in state.ranks.values()]
                if None not in held and len({k for k, _ in held}) == 1:
                    out.append((comm, slot, held[0][0], min(at for _, at in held)))
        return out

    def _settle_arrivals(self, state: _Comm, sequences=None) -> None:
        """Observe the lag of every op in `sequences` (default: all pending) that all local
        ranks have entered."""
        if len(state.ranks) < 2:
            # One local rank has no local peer to be late against (the cross-node join,
            # sequence boundaries, covers it), or its peer has not shown itself yet: keep
            # the entries, bounded by _MAX_PENDING_ARRIVALS.
            return
        members = state.ranks.keys()
        for sequence in sorted(state.arrivals) if sequences is None else sequences:
            entries = state.arrivals.get(sequence)
            if entries is None or not members <= entries.keys():
                continue
            earliest = min(entries[r] for r in members)
            for rank in members:
                state.ranks[rank].lag.observe(entries[rank] - earliest)
            del state.arrivals[sequence]

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
        """One size per communicator: every rank of a comm has the same nranks, so the ranks
        a comm can hold are bounded by it (rank < nranks is checked on parsing)."""
        seen: dict[str, int] = {}
        for index, call in enumerate(calls):
            state = self._comms.get(call.comm)
            sizes = {n for n in state.nranks.values() if n > 0} if state else set()
            stored = next(iter(sizes)) if len(sizes) == 1 else None
            earlier = seen.setdefault(call.comm, call.nranks)
            for other, where in ((stored, "already stored"), (earlier, "earlier in this batch")):
                if other is not None and other != call.nranks:
                    raise ConflictError(f"record {index}: nranks {call.nranks} disagrees with nranks {other} "
                                        f"{where} for comm {call.comm}", index, "nranks")

    def _check_capacity(self, calls: list[NcclCall]) -> None:
        """Refuse a batch whose new communicators could only fit by evicting probed ones."""
        new = {call.comm for call in calls} - self._comms.keys()
        evictable = sum(1 for comm, state in self._comms.items() if not state.probed and comm not in new)
        if len(self._comms) + len(new) - self.max_comms > evictable:
            raise CapacityError(f"{len(new)} new communicator(s) do not fit: {len(self._comms)} of max_comms "
                                f"{self.max_comms} are tracked and only {evictable} ingested one(s) may be evicted; "
                                f"communicators seen on this node's processes are kept", None, "comm")

    def _evict_lru(self, exclude: str, probed_too: bool = True) -> bool:
        candidates = [(state.last_activity, comm) for comm, state in self._comms.items()
                      if comm != exclude and (probed_too or not state.probed)]
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
