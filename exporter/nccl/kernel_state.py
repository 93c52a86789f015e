"""The per-call accounting that exporter/bpf/nccl.bpf.c keeps in BPF maps: its layouts
(keep them in step with the C structs), decoding, and the configuration user space writes
into the program before the probes attach.

Decoding is pure: raw map keys and values in, ProbedRank records (exporter/nccl/tracker.py)
out, so it is tested without a kernel. Times in the maps are CLOCK_MONOTONIC nanoseconds
(bpf_ktime_get_ns); `to_wall` turns them into UNIX seconds.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Iterable

from .events import OPS
from .tracker import BOUNDARY_SLOTS, ProbedOp, ProbedRank

MAX_BOUNDS = 16          # MAX_BOUNDS in nccl.bpf.c: bounds per histogram
RECENT_MAX = 64          # RECENT_MAX: last durations kept per (process, comm, op)
NUM_DATATYPES = 16
NUM_OPS = len(OPS)       # NUM_OPS: op codes 0-7 (exporter/nccl/events.py OPS)

# struct nccl_config
CONFIG = struct.Struct(f"<{MAX_BOUNDS}Q{MAX_BOUNDS}Q{MAX_BOUNDS}QIIII{NUM_DATATYPES}BII")
# struct hist: MAX_BOUNDS + 1 counts (the last above every bound), then the sum in ns
_HIST_WORDS = MAX_BOUNDS + 2
# struct rank_state: ... then BOUNDARY_SLOTS struct boundary (seq, ts), then the lag histogram
RANK_STATE = struct.Struct(f"<QQQQQQQIIHBBBBBB{2 * BOUNDARY_SLOTS}Q{_HIST_WORDS}Q")
CTR_EXACT = 3            # enum ctr_phase: NCCL's counter numbers the rank's ops
# struct op_stats
OP_STATS = struct.Struct(f"<QQQ{_HIST_WORDS}Q{_HIST_WORDS}Q{RECENT_MAX}QQ")
# struct comm_key (pid, pad, comm) and struct op_key (pid, op, comm)
COMM_KEY = struct.Struct("<IIQ")
OP_KEY = struct.Struct("<IIQ")
# nccl_comm_ident values (struct learned_ident): a comm's identity learned by user space (0:
# keep the init's), and where NCCL keeps its operation counter (via, at, words; words 0: none)
IDENT = struct.Struct("<QIIII")
# struct open_call, keyed by pid_tgid
OPEN_CALL = struct.Struct("<QQII")
PID_TGID = struct.Struct("<Q")

# nccl_problems slots, each a u64 count
PROBLEMS = ("events_lost", "unknown_datatype", "state_full")
PROBLEM_COUNT = struct.Struct("<Q")
# The maps whose values user space decodes, by layout (check_layouts).
MAP_LAYOUTS = {"nccl_rank_state": RANK_STATE, "nccl_op_stats": OP_STATS, "nccl_open_calls": OPEN_CALL,
               "nccl_problems": PROBLEM_COUNT, "nccl_comm_ident": IDENT}


class LayoutError(ValueError):
    """A map whose values are not the size of their layout: the object and this module are
    out of step."""


def encode_config(enqueue_bounds: Iterable[float], duration_bounds: Iterable[float],
                  lag_bounds: Iterable[float], boundary_ops: int, datatype_bytes: dict[int, int],
                  pidns_inum: int = 0) -> bytes:
    """struct nccl_config: bounds in seconds become ns (ascending, at most MAX_BOUNDS each);
    `pidns_inum` scopes the accounting to one PID namespace (discovery.pid_namespace)."""
    lists = []
    for name, bounds in (("enqueue", enqueue_bounds), ("duration", duration_bounds), ("lag", lag_bounds)):
        ns = [round(b * 1e9) for b in bounds]
        if len(ns) > MAX_BOUNDS or ns != sorted(ns) or any(b <= 0 for b in ns):
            raise ValueError(f"{name} bounds must be at most {MAX_BOUNDS} ascending positive values, got {ns}")
        lists.append(ns)
    sizes = [0] * NUM_DATATYPES
    for dtype, size in datatype_bytes.items():
        if not 0 <= dtype < NUM_DATATYPES or not 0 < size < 256:
            raise ValueError(f"datatype {dtype} of {size} bytes does not fit struct nccl_config")
        sizes[dtype] = size
    padded = [ns + [0] * (MAX_BOUNDS - len(ns)) for ns in lists]
    return CONFIG.pack(*padded[0], *padded[1], *padded[2], len(lists[0]), len(lists[1]), len(lists[2]),
                       int(boundary_ops), *sizes, int(pidns_inum), 0)


def encode_learned(ident: int, counter) -> bytes:
    """struct learned_ident for a comm: `counter` a commlayout.Counter, or None."""
    if counter is None:
        return IDENT.pack(ident, 0, 0, 0, 0)
    return IDENT.pack(ident, counter.via, counter.at, counter.words, 0)


@dataclass(frozen=True)
class RankState:
    ident: int
    last_ts: int
    last_bytes: int
    seq: int                            # 0: the rank's ops have no exact number
    boundaries: tuple[tuple[int, int, int], ...]   # (slot, k, entry ns) of the filled slots
    last_op: int
    lag: tuple[list[int], int]          # counts (n bounds + 1), sum ns
    calls: int = 0
    has_counter: bool = False
    counter_exact: bool = False         # NCCL's counter moved by exactly the rank's calls
    counter_inexact: bool = False       # ... and once did not: never used for this rank again
    from_init: bool = False

    def numbering(self, no_counter_reason: str) -> tuple[str, str]:
        """(how the rank's ops are numbered, why not) for fabric_nccl_rank_numbering:
        counter (NCCL's own), init (counted from the probed init), none (not judged)."""
        if self.counter_exact and not self.counter_inexact:
            return "counter", ""
        if self.from_init:
            return "init", ""
        if not self.has_counter:
            return "none", no_counter_reason or "no_counter"
        return "none", "counter_inexact" if self.counter_inexact else "counter_unverified"


@dataclass(frozen=True)
class OpStats:
    calls: int
    nbytes: int
    last_ts: int
    enqueue: tuple[list[int], int]
    duration: tuple[list[int], int]
    recent: list[int]                   # ns, oldest first
    durations: int


def _hist(words: tuple[int, ...], n: int) -> tuple[list[int], int]:
    """The first n bounds' counts plus the one above them (slot n), and the sum."""
    return list(words[:n + 1]), words[_HIST_WORDS - 1]


def check_layouts(value_sizes: dict[str, int]) -> None:
    """Once, when the object loads: every value of a BPF map is exactly the map's value
    size, so a layout that matches it decodes every value the map will hold."""
    for name, layout in MAP_LAYOUTS.items():
        size = value_sizes.get(name)
        if size != layout.size:
            raise LayoutError(f"map {name}: values of {size} bytes, expected {layout.size} (nccl.bpf.o and "
                              "exporter/nccl/kernel_state.py disagree)")


def decode_rank_state(raw: bytes, lag_n: int) -> RankState:
    w = RANK_STATE.unpack_from(raw)
    (ident, last_ts, last_bytes, seq, calls, _ctr_last, _ctr_since, _via, _at, last_op,
     words, phase, inexact, from_init, _learned, _pad) = w[:16]
    slots = w[16:16 + 2 * BOUNDARY_SLOTS]
    boundaries = tuple((slot, slots[2 * slot], slots[2 * slot + 1]) for slot in range(BOUNDARY_SLOTS)
                       if slots[2 * slot])
    return RankState(ident, last_ts, last_bytes, seq, boundaries, last_op, _hist(w[16 + 2 * BOUNDARY_SLOTS:], lag_n),
                     calls=calls, has_counter=bool(words), counter_exact=phase == CTR_EXACT,
                     counter_inexact=bool(inexact), from_init=bool(from_init))


def decode_op_stats(raw: bytes, enqueue_n: int, duration_n: int) -> OpStats:
    w = OP_STATS.unpack_from(raw)
    calls, nbytes, last_ts = w[:3]
    enqueue = _hist(w[3:3 + _HIST_WORDS], enqueue_n)
    duration = _hist(w[3 + _HIST_WORDS:3 + 2 * _HIST_WORDS], duration_n)
    ring = w[3 + 2 * _HIST_WORDS:3 + 2 * _HIST_WORDS + RECENT_MAX]
    durations = w[-1]
    if durations <= RECENT_MAX:
        recent = list(ring[:durations])
    else:                                    # slot durations % RECENT_MAX is the oldest
        start = durations % RECENT_MAX
        recent = list(ring[start:] + ring[:start])
    return OpStats(calls, nbytes, last_ts, enqueue, duration, recent, durations)


@dataclass(frozen=True)
class CommRef:
    """What user space knows of a (process, comm pointer): from its init event, or read
    from the communicator when the init came before the probes (uprobe.EventHandler)."""
    label: str
    rank: int
    nranks: int
    source: str = "init"     # init | memory | unknown
    reason: str = ""         # why unknown
    # How its ranks' operations are numbered (RankState.numbering): counter, init, none.
    join: str = "init"
    # Why the library gives no operation counter (commlayout.CommLayout.counter_reason).
    counter_reason: str = ""


def probed_rank(ref: CommRef, state: RankState | None, ops: dict[int, OpStats], api_returned: bool,
                to_wall: Callable[[int], float], observed_at: float) -> ProbedRank:
    """One local rank's kernel accounting, read at `observed_at` (UNIX seconds), as the
    tracker takes it."""
    def seconds(hist: tuple[list[int], int]) -> tuple[list[int], float]:
        return hist[0], hist[1] / 1e9

    probed_ops = tuple(
        ProbedOp(op=OPS[op], calls=s.calls, nbytes=s.nbytes, last_call=to_wall(s.last_ts) if s.last_ts else 0.0,
                 enqueue=seconds(s.enqueue), duration=seconds(s.duration), recent=[d / 1e9 for d in s.recent])
        for op, s in sorted(ops.items()) if 0 <= op < len(OPS) and s.calls)
    if state is None or not state.last_ts:
        return ProbedRank(comm=ref.label, rank=ref.rank, nranks=ref.nranks, ops=probed_ops)
    if not state.seq:                   # no exact number: in flight, never compared with peers
        return ProbedRank(comm=ref.label, rank=ref.rank, nranks=ref.nranks, ops=probed_ops, numbered=False,
                          last_op=OPS[state.last_op] if state.last_op < len(OPS) else None,
                          last_start=to_wall(state.last_ts), last_nbytes=state.last_bytes,
                          api_returned=api_returned, observed_at=observed_at)
    return ProbedRank(
        comm=ref.label, rank=ref.rank, nranks=ref.nranks, ops=probed_ops, sequence=state.seq,
        last_op=OPS[state.last_op] if state.last_op < len(OPS) else None, last_start=to_wall(state.last_ts),
        last_nbytes=state.last_bytes, api_returned=api_returned,
        boundaries=tuple((slot, k, to_wall(ts)) for slot, k, ts in state.boundaries), lag=seconds(state.lag),
        observed_at=observed_at)
