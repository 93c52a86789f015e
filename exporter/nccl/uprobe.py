"""NCCL through uprobes: discovery, attach/detach per library file, the kernel's accounting.

exporter/bpf/nccl.bpf.c accounts every collective call in BPF maps (per process, comm and
op) and sends only communicator init and destroy through its ring buffer. This module:
- decodes those two events (decode_event, pure) and keeps comm pointer -> (comm id, rank,
  nranks) per process (EventHandler);
- reads the kernel's accounting about once a second (KernelReader, layouts in
  kernel_state.py) and hands each local rank's cumulative state to the NcclTracker, which
  judges hangs, culprits and lag as it does for every source. The work per read is
  bounded by the (comm, rank, op) series, whatever the collective rate;
- finds libnccl.so* in processes' maps (libtorch_cuda.so where NCCL is linked in
  statically and still exports ncclAllReduce), attaches once per library *file* (uprobes
  are per inode, so one attach covers every process mapping it), and detaches a library
  when no process maps it any more. Which processes to look at comes from exec and
  dlopen hints (exporter/bpf/procwatch.bpf.c, discovery.ProcessWatch) and from pids first
  seen in the kernel's accounting; a full rescan of every process runs only as a slow
  safety net (every 2 s when the hints are unavailable).
Every failure is a metric and a log line; nothing here raises into the exporter.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import platform
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from . import commread, discovery
from . import kernel_state as ks
from .commid import comm_label, fold_words
from .tracker import DURATION_BUCKETS, ENQUEUE_BUCKETS, LAG_BUCKETS

log = logging.getLogger("fabricscope.exporter.nccl")

# struct nccl_event in exporter/bpf/nccl.bpf.c
EVENT = struct.Struct("<QQQQIIHHiii")
EV_COMM_INIT, EV_COMM_END = 3, 4
INIT_RANK, INIT_ALL, INIT_SPLIT, INIT_SCALABLE = 1, 2, 3, 4

# ncclDataType_t -> bytes per element (nccl.h): Int8/Char, Uint8, Int32/Int, Uint32,
# Int64, Uint64, Float16/Half, Float32/Float, Float64/Double, Bfloat16, Float8e4m3, Float8e5m2.
# Written into the program's nccl_config: the kernel sizes calls with it.
# Send and Recv (events.OPS): no sequence number.
P2P_OPS = (6, 7)

DATATYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}

# (symbol, entry program, return program or None). A library gets every one it exports.
_COLL_RETURN, _INIT_RETURN = "nccl_coll_return", "nccl_comm_init_return"
PROBES = [
    ("ncclAllReduce", "nccl_allreduce_enter", _COLL_RETURN),
    ("ncclAllGather", "nccl_allgather_enter", _COLL_RETURN),
    ("ncclReduceScatter", "nccl_reducescatter_enter", _COLL_RETURN),
    ("ncclBroadcast", "nccl_broadcast_enter", _COLL_RETURN),
    ("ncclBcast", "nccl_bcast_enter", _COLL_RETURN),
    ("ncclReduce", "nccl_reduce_enter", _COLL_RETURN),
    ("ncclAllToAll", "nccl_alltoall_enter", _COLL_RETURN),
    ("ncclAlltoAll", "nccl_alltoall_enter", _COLL_RETURN),
    ("ncclSend", "nccl_send_enter", _COLL_RETURN),
    ("ncclRecv", "nccl_recv_enter", _COLL_RETURN),
    ("ncclCommInitRank", "nccl_comm_init_rank_enter", _INIT_RETURN),
    ("ncclCommInitRankConfig", "nccl_comm_init_rank_enter", _INIT_RETURN),
    ("ncclCommInitRankScalable", "nccl_comm_init_scalable_enter", _INIT_RETURN),
    ("ncclCommInitAll", "nccl_comm_init_all_enter", _INIT_RETURN),
    ("ncclCommSplit", "nccl_comm_split_enter", _INIT_RETURN),
    ("ncclCommDestroy", "nccl_comm_end_enter", None),
    ("ncclCommAbort", "nccl_comm_end_enter", None),
]


class NcclEvent(NamedTuple):
    """One decoded communicator init or destroy."""
    ts_ns: int
    comm: int
    ident: int           # init: the comm identity the kernel computed (0: unknown parent)
    aux: int
    pid: int
    tid: int
    kind: int
    op: int
    peer: int
    rank: int
    nranks: int


def decode_event(raw: bytes) -> NcclEvent:
    if len(raw) < EVENT.size:
        raise ValueError(f"event record of {len(raw)} bytes, expected {EVENT.size}")
    return NcclEvent(*EVENT.unpack_from(raw))


def kernel_config(tracker, pidns_inum: int = 0) -> bytes:
    """struct nccl_config for this tracker: its bucket bounds and sequence boundaries, and
    the PID namespace whose processes are accounted."""
    return ks.encode_config(ENQUEUE_BUCKETS, DURATION_BUCKETS, LAG_BUCKETS, tracker.boundary_ops, DATATYPE_BYTES,
                            pidns_inum)


class EventHandler:
    """Communicator init and destroy events, and the comms they name. Single-threaded (the
    ring-buffer poller).

    A comm is named by NCCL's own commHash, rank and nRanks, read from the communicator
    (`identify`: commread.read_comm with the library's layout), whether its init was seen
    or not: an exporter that starts or restarts while a job runs names its comms exactly
    as one that saw them initialised. Where the communicator cannot be read (a library
    whose layout is unknown, no access to the rank's memory), a seen init still names the
    comm from its arguments (the ncclUniqueId fold of commid.py), and a comm initialised
    before the probes is `unknown-...` with rank -1 and its reason."""

    # A comm that could not be read is tried again this often (a non-blocking init may
    # still be filling it in; access may come back).
    RETRY_SECONDS = 10.0

    def __init__(self, tracker, identify: Callable[[int, int], "commread.CommFields"] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tracker = tracker
        self.identify = identify
        self.clock = clock
        self.comms: dict[tuple[int, int], ks.CommRef] = {}      # (pid, comm pointer) -> comm
        self.ended: list[tuple[int, int, ks.CommRef]] = []      # destroyed (pid, pointer, comm), for a last read
        # What the kernel learns of comms read from memory: (pid, pointer, identity for the
        # arrival join (0: keep the init's), NCCL's operation counter or None), written into
        # nccl_comm_ident by the reader.
        self.learned: list[tuple[int, int, int, object]] = []
        self._retry_at: dict[tuple[int, int], float] = {}
        self.invalid: dict[str, int] = {}
        self.events = 0
        self._counts_lock = threading.Lock()     # counters are read from scrape threads

    def _invalid(self, reason: str) -> None:
        with self._counts_lock:
            self.invalid[reason] = self.invalid.get(reason, 0) + 1

    def counts(self) -> tuple[int, dict[str, int]]:
        with self._counts_lock:
            return self.events, dict(self.invalid)

    def handle_raw(self, raw: bytes) -> None:
        try:
            event = decode_event(raw)
        except ValueError:
            self._invalid("short_record")
            return
        self.handle(event)

    def handle(self, event: NcclEvent) -> None:
        self.events += 1
        if event.kind == EV_COMM_INIT:
            self._init(event)
        elif event.kind == EV_COMM_END:
            ref = self.comms.get((event.pid, event.comm))
            if ref is not None:
                self.ended.append((event.pid, event.comm, ref))
        else:
            self._invalid("unknown_kind")

    def comm(self, pid: int, pointer: int) -> ks.CommRef:
        """The comm a (process, pointer) in the kernel's accounting stands for. One whose
        init was never seen (the job started before the probes) is read from memory."""
        key = (pid, pointer)
        ref = self.comms.get(key)
        if ref is not None and (ref.source != "unknown" or self.clock() < self._retry_at.get(key, 0.0)):
            return ref
        read = self._read(pid, pointer)
        if isinstance(read, str):
            if ref is None:
                ref = ks.CommRef(_unknown_label(pid, pointer), -1, 0, source="unknown", reason=read, join="none",
                                 counter_reason=read)
                self.comms[key] = ref
            return ref
        if ref is not None:                                 # read at last: its placeholder goes
            self.tracker.forget_comm(ref.label)
        # Numbered by NCCL's own counter once the kernel has seen it exact, else not judged.
        ref = ks.CommRef(comm_label(read.comm_hash), read.rank, read.nranks, source="memory", join="none",
                         counter_reason=read.counter_reason)
        self.comms[key] = ref
        self.learned.append((pid, pointer, read.comm_hash, read.counter))
        self.tracker.register_comm(ref.label, ref.rank, ref.nranks)
        log.info("NCCL comm %s rank %d of %d (pid %d) named from its communicator: its init came before "
                 "the probes", ref.label, ref.rank, ref.nranks, pid)
        return ref

    def _read(self, pid: int, pointer: int) -> "commread.CommFields | str":
        """The communicator's fields, or the reason they cannot be had."""
        from .commlayout import LayoutUnknown

        if self.identify is None:
            return "no_reader"
        try:
            fields = self.identify(pid, pointer)
        except (commread.CommUnreadable, LayoutUnknown) as exc:
            self._retry_at[(pid, pointer)] = self.clock() + self.RETRY_SECONDS
            log.debug("NCCL comm %#x of pid %d not readable: %s", pointer, pid, exc)
            return exc.reason
        self._retry_at.pop((pid, pointer), None)
        return fields

    def _init(self, event: NcclEvent) -> None:
        if event.op not in (INIT_RANK, INIT_SCALABLE, INIT_ALL, INIT_SPLIT):
            self._invalid("unknown_init")
            return
        read = self._read(event.pid, event.comm)
        if not isinstance(read, str):
            # NCCL's own hash, rank and size: what an exporter that starts later reads too.
            ref = ks.CommRef(comm_label(read.comm_hash), read.rank, read.nranks, counter_reason=read.counter_reason)
            # A split of a comm the kernel never named takes NCCL's hash for its identity.
            self.learned.append((event.pid, event.comm, 0 if event.ident else read.comm_hash, read.counter))
        else:
            if event.op == INIT_SPLIT and not event.ident:
                # A split of a comm initialised before we attached: no identity to derive.
                label = _unknown_label(event.pid, event.comm)
            else:
                label = comm_label(event.ident)
            # A split's new rank and size are decided inside NCCL, not visible in the
            # arguments: the split key stands for the rank (it orders the ranks), nranks 0.
            ref = ks.CommRef(label, event.rank, 0 if event.op == INIT_SPLIT else event.nranks, counter_reason=read)
        self._retry_at.pop((event.pid, event.comm), None)
        self.comms[(event.pid, event.comm)] = ref
        if ref.rank >= 0:
            self.tracker.register_comm(ref.label, ref.rank, ref.nranks)

    def sources(self) -> dict[tuple[str, str, str], int]:
        """Comms known now by how they were named (init, memory, unknown), why unknown, and
        how their ranks' operations are numbered (CommRef.join)."""
        counts: dict[tuple[str, str, str], int] = {}
        for ref in list(self.comms.values()):
            key = (ref.source, ref.reason, ref.join)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def end(self, pid: int, pointer: int, ref: ks.CommRef) -> bool:
        """A destroyed comm, read one last time: it no longer takes part. False when its
        pointer names a newer comm by now (malloc reuses a freed ncclComm: an init of the same
        pointer came after the destroy), which keeps the pointer and its kernel entries."""
        self.tracker.drop_inflight(ref.label, ref.rank)
        if self.comms.get((pid, pointer)) is not ref:
            return False
        del self.comms[(pid, pointer)]
        self._retry_at.pop((pid, pointer), None)
        return True

    def rank_processes(self) -> list[tuple[str, int, int, int]]:
        """(comm, rank, nranks, pid) of every communicator seen initialised."""
        # list() copies in one step under the GIL: the poller thread adds and removes comms.
        return [(ref.label, ref.rank, ref.nranks, pid) for (pid, _), ref in list(self.comms.items())
                if ref.rank >= 0]

    def process_exited(self, pid: int) -> None:
        """Forget the process's comms: their open operations will never be followed."""
        for key in [k for k in self.comms if k[0] == pid]:
            ref = self.comms.pop(key)
            self._retry_at.pop(key, None)
            self.tracker.drop_inflight(ref.label, ref.rank)


def _unknown_label(pid: int, pointer: int) -> str:
    """The label of a comm whose identity was never seen (initialised before the probes)."""
    return "unknown-" + comm_label(fold_words([pid, pointer]))[:8]


class KernelReader:
    """Reads nccl_rank_state, nccl_op_stats and nccl_open_calls and applies what changed
    to the tracker. A rank whose entries are byte-for-byte what the last read saw is not
    applied again (a comm the tracker evicted as idle stays evicted)."""

    def __init__(self, obj, handler: EventHandler) -> None:
        self.handler = handler
        self.rank_state = obj.map("nccl_rank_state")
        self.op_stats = obj.map("nccl_op_stats")
        self.open_calls = obj.map("nccl_open_calls")
        self.problems = obj.map("nccl_problems")
        self.comm_ident = obj.map("nccl_comm_ident")
        ks.check_layouts({name: obj.map(name).value_size for name in ks.MAP_LAYOUTS})
        # bpf_ktime_get_ns is CLOCK_MONOTONIC; wall = monotonic + offset.
        self._offset = time.time() - time.monotonic()
        self._seen: dict[tuple[int, int], tuple] = {}
        self.pids: set[int] = set()          # processes with entries in the maps at the last read
        # (comm, rank) -> (numbering, reason) of every named local rank (RankState.numbering).
        self.numbering: dict[tuple[str, int], tuple[str, str]] = {}

    def resync_clock(self) -> None:
        self._offset = time.time() - time.monotonic()

    def to_wall(self, ts_ns: int) -> float:
        return ts_ns / 1e9 + self._offset

    def read(self, drain_events: Callable[[], object] = lambda: None) -> set[int]:
        """Apply every rank that changed; returns the pids seen in the maps.

        `drain_events` (the ring buffer's consume) runs between reading the maps and naming
        their comms: every comm in the maps sent its init event before its first call, so
        after the drain each is named, never labelled unknown for want of an event still in
        the ring."""
        tracker = self.handler.tracker
        lag_n, enqueue_n, duration_n = len(LAG_BUCKETS), len(ENQUEUE_BUCKETS), len(DURATION_BUCKETS)
        ranks: dict[tuple[int, int], list] = {}
        for key, raw in self.rank_state.items():
            pid, _pad, comm = ks.COMM_KEY.unpack(key)
            ranks[(pid, comm)] = [raw, {}]
        for key, raw in self.op_stats.items():
            pid, op, comm = ks.OP_KEY.unpack(key)
            ranks.setdefault((pid, comm), [None, {}])[1][op] = raw
        # Open calls after the states: a call entering between the two reads is then either
        # unseen in both (its rank reads as its previous, returned call) or seen in both, never
        # seen entered but missing from the open calls (which would call a blocked call returned).
        inside: set[tuple[int, int, int]] = set()        # (pid, comm, entry ts) of calls not returned
        for key, raw in self.open_calls.items():
            ts, comm, _op, _pad = ks.OPEN_CALL.unpack_from(raw)
            inside.add((ks.PID_TGID.unpack(key)[0] >> 32, comm, ts))
        observed_at = time.time()          # the maps were read just now
        drain_events()
        numbering = {}
        for (pid, comm), (state_raw, ops_raw) in ranks.items():
            state = ks.decode_rank_state(state_raw, lag_n) if state_raw is not None else None
            returned = state is None or (pid, comm, state.last_ts) not in inside
            signature = (state_raw, tuple(sorted(ops_raw.items())), returned)
            ref = self.handler.comm(pid, comm)
            if state is not None and state.calls:
                how = state.numbering(ref.counter_reason)
                if ref.rank >= 0:
                    numbering[(ref.label, ref.rank)] = how
                if ref.join != how[0] and self.handler.comms.get((pid, comm)) is ref:
                    ref = self.handler.comms[(pid, comm)] = dataclasses.replace(ref, join=how[0])
            if self._seen.get((pid, comm)) == signature:
                tracker.observed(ref.label, ref.rank, observed_at)     # still in the same operation
                continue
            self._seen[(pid, comm)] = signature
            ops = {op: ks.decode_op_stats(raw, enqueue_n, duration_n) for op, raw in ops_raw.items()}
            tracker.apply_probed(ks.probed_rank(ref, state, ops, returned, self.to_wall, observed_at))
        self.pids = {pid for pid, _ in ranks} | {pid for pid, _, _ in inside}
        self.numbering = numbering
        self._teach_kernel()
        return {pid for pid, _ in ranks}

    def _teach_kernel(self) -> None:
        """Comms read from memory: their identity for the kernel's arrival join (when their
        init was not seen) and where NCCL keeps their operation counter, which the kernel
        takes at the rank's next call (nccl_comm_ident in nccl.bpf.c)."""
        learned, self.handler.learned = self.handler.learned, []
        for pid, pointer, ident, counter in learned:
            self.comm_ident.update(ks.COMM_KEY.pack(pid, 0, pointer), ks.encode_learned(ident, counter))

    def take_ended(self) -> list[tuple[int, int, ks.CommRef]]:
        """The comms destroyed so far, for end_comms after one more read."""
        ended, self.handler.ended = self.handler.ended, []
        return ended

    def end_comms(self, ended: list[tuple[int, int, ks.CommRef]]) -> None:
        """Comms destroyed before the last read began (take_ended): that read was their
        last; drop their open operation in the tracker, and their kernel entries unless a
        newer comm took the pointer (its init reset them for itself)."""
        for pid, comm, ref in ended:
            if not self.handler.end(pid, comm, ref):
                continue
            self.rank_state.delete(ks.COMM_KEY.pack(pid, 0, comm))
            self.comm_ident.delete(ks.COMM_KEY.pack(pid, 0, comm))
            for op in range(ks.NUM_OPS):
                self.op_stats.delete(ks.OP_KEY.pack(pid, op, comm))
            self._seen.pop((pid, comm), None)

    def forget_processes(self, pids: set[int]) -> None:
        """Delete every entry of processes that exited (their threads' open calls too). Only
        pids the last read found in the maps have any: most exited processes (DataLoader
        workers) cost nothing here."""
        pids = pids & self.pids
        if not pids:
            return
        for bpf_map, layout in ((self.rank_state, ks.COMM_KEY), (self.op_stats, ks.OP_KEY),
                                (self.comm_ident, ks.COMM_KEY)):
            for key, _ in bpf_map.items():
                if layout.unpack(key)[0] in pids:
                    bpf_map.delete(key)
        for key, _ in self.open_calls.items():
            if ks.PID_TGID.unpack(key)[0] >> 32 in pids:
                self.open_calls.delete(key)
        for key in [k for k in self._seen if k[0] in pids]:
            del self._seen[key]
        self.pids -= pids

    def problem_counts(self) -> dict[str, int]:
        out = {}
        for slot, name in enumerate(ks.PROBLEMS):
            value = self.problems.lookup(struct.pack("<I", slot))
            out[name] = ks.PROBLEM_COUNT.unpack(value)[0] if value else 0
        return out


@dataclass
class _Library:
    ref: discovery.LibraryRef
    links: list = field(default_factory=list)
    symbols: list[str] = field(default_factory=list)
    error: str | None = None
    pids: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class UprobeStatus:
    reason: str                         # ok, or why uprobes are not running
    libraries: dict[str, bool]          # library path -> attached
    processes_traced: int
    processes_exited: int               # traced processes that went away
    events_lost: int                    # dropped in the kernel: ring buffer full
    invalid: dict[str, int]
    events: int
    identities: dict[tuple[str, str, str], int] = field(default_factory=dict)   # (source, reason, join) -> comms
    # (comm, rank) -> (numbering, reason): how each local rank's operations are numbered
    numbering: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)


class UprobeSource:
    """Background thread: rescan processes, attach/detach, poll the ring buffer."""

    # Full rescans: a safety net when exec/dlopen hints arrive, the only way when they cannot.
    RESCAN_WITH_HINTS = 300.0
    RESCAN_WITHOUT_HINTS = 2.0
    # The loop wakes this often (ms) for discovery hints; communicator init and destroy
    # wake it at once.
    LOOP_MS = 250
    # The kernel's accounting is read this often: what a scrape sees is at most this old.
    READ_SECONDS = 1.0
    # How often traced processes are checked for having exited (a stat each).
    EXIT_CHECK_SECONDS = 1.0

    # Ring buffer for communicator init and destroy only (64 bytes each): 64 KiB holds
    # 1,000, a job creating its communicators all at once. Its pages count in RSS.
    RING_BYTES = 1 << 16

    def __init__(self, procfs: Path, sysfs: Path, object_path: Path, rescan_seconds: float | None = None,
                 watch_object_path: Path | None = None, ring_bytes: int | None = None) -> None:
        """rescan_seconds None: RESCAN_WITH_HINTS, or RESCAN_WITHOUT_HINTS when the process
        watch (procwatch.bpf.o beside object_path) cannot run. Nothing is kept across
        restarts: NCCL's own counter numbers the operations (docs/nccl.md, "Numbering")."""
        self.procfs = Path(procfs)
        # The processes this procfs shows are the ones traced, by the ids it shows.
        self.pidns = discovery.pid_namespace(self.procfs)
        self.sysfs = Path(sysfs)
        self.object_path = Path(object_path)
        self.watch_object_path = Path(watch_object_path or self.object_path.with_name("procwatch.bpf.o"))
        self.ring_bytes = ring_bytes or self.RING_BYTES
        self._rescan_setting = rescan_seconds
        self.rescan_seconds = rescan_seconds if rescan_seconds is not None else self.RESCAN_WITHOUT_HINTS
        self.reason = "starting"
        self.watch: discovery.ProcessWatch | None = None
        self.watch_reason = "starting"
        self._watch_obj = None
        self._watch_ring = None
        self._watch_lost = 0
        self._watch_lost_map = None
        self.full_rescans = 0
        self.looks = 0
        self._calling_untraced: set[int] = set()
        self._calling: set[int] = set()            # pids in the kernel's accounting
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._obj = None
        self._ring = None
        self._handler: EventHandler | None = None
        self._reader: KernelReader | None = None
        self._libraries: dict[tuple[int, int], _Library] = {}
        self._pids: set[int] = set()
        self._exited = 0
        self._lost_logged = 0
        self._told_no_library = False

    # ---- lifecycle ---------------------------------------------------------------------

    def attach(self, tracker) -> None:
        self._handler = EventHandler(tracker, identify=self.identify)
        if not self._load():
            return
        self._thread = threading.Thread(target=self._run, name="nccl-uprobes", daemon=True)
        self._thread.start()

    def _load(self) -> bool:
        if platform.machine() not in ("x86_64", "AMD64"):
            return self._unavailable("unsupported_arch", f"NCCL uprobes decode x86-64 arguments; this is "
                                                         f"{platform.machine()}")
        try:
            from ..bpf_loader import reasons
            from ..bpf_loader.libbpf import BpfObject, BpfUnavailable
        except ImportError as exc:
            return self._unavailable("no_libbpf", str(exc))
        problem = reasons.preflight(self.sysfs)
        if problem:
            return self._unavailable(*problem)
        try:
            self._obj = BpfObject.load(self.object_path, map_sizes={"nccl_events": self.ring_bytes})
            self._obj.map("nccl_config").update(b"\0" * 4, kernel_config(self._handler.tracker, self.pidns))
            self._ring = self._obj.ring_buffer("nccl_events", self._handler.handle_raw)
            self._reader = KernelReader(self._obj, self._handler)
        except (BpfUnavailable, KeyError, ValueError) as exc:
            if self._obj is not None:
                self._obj.close()
                self._obj = None
            return self._unavailable(getattr(exc, "reason", "bad_object"), str(exc))
        self.reason = "ok"
        self._load_watch()
        log.info("NCCL uprobes loaded from %s; process discovery from %s, full rescan of %s every %.0fs",
                 self.object_path, "exec/dlopen hints" if self.watch else "rescans only", self.procfs,
                 self.rescan_seconds)
        return True

    def _load_watch(self) -> None:
        """exec + dlopen hints; without them, discovery falls back to frequent full rescans."""
        from ..bpf_loader import elfsym
        from ..bpf_loader.libbpf import BpfObject, BpfUnavailable

        watch = discovery.ProcessWatch()
        try:
            obj = BpfObject.load(self.watch_object_path)
        except BpfUnavailable as exc:
            self.watch_reason = exc.reason
            log.warning("process watch unavailable (%s): full rescans every %.1fs", exc, self.rescan_seconds)
            return
        try:
            obj.map("proc_pidns").update(b"\0" * 4, struct.pack("<I", self.pidns))
            obj.attach("proc_exec")
            libcs = discovery.libc_paths(self.procfs)
            for path in libcs:
                # Offset from .dynsym ourselves: glibc >= 2.34 defines dlopen twice (two symbol
                # versions, one address), which libbpf's name lookup refuses as ambiguous.
                try:
                    offset = elfsym.symbol_file_offset(path, "dlopen")
                    obj.attach_uprobe_at("proc_dlopen_return", path, offset, retprobe=True, label="dlopen")
                except (OSError, elfsym.ElfError, BpfUnavailable) as exc:   # libdl.so.2 of a new glibc: no dlopen
                    log.debug("no dlopen hint from %s: %s", path, exc)
            if not libcs:
                log.warning("process watch: no libc in %s/self/maps; late dlopen found by rescans only", self.procfs)
            self._watch_ring = obj.ring_buffer("proc_events", watch.handle_raw)
        except (BpfUnavailable, KeyError) as exc:
            obj.close()
            self.watch_reason = getattr(exc, "reason", "bad_object")
            log.warning("process watch unavailable (%s): full rescans every %.1fs", exc, self.rescan_seconds)
            return
        self._watch_obj, self.watch, self.watch_reason = obj, watch, "ok"
        if self._rescan_setting is None:
            self.rescan_seconds = self.RESCAN_WITH_HINTS

    def _unavailable(self, reason: str, message: str) -> bool:
        self.reason = reason
        log.warning("NCCL uprobes unavailable (%s): %s", reason, message)
        return False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)      # an attach in progress finishes first
        from ..bpf_loader.libbpf import destroy_links
        with self._lock:
            # Every library's probes in one parallel round (libbpf.destroy_links).
            destroy_links([link for library in self._libraries.values() for link in library.links])
            for library in self._libraries.values():
                self._detach(library)
            self._libraries.clear()
            if self._obj is not None:
                self._obj.close()          # also frees the ring buffer
                self._obj = None
            if self._watch_obj is not None:
                self._watch_obj.close()
                self._watch_obj = None

    # ---- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        next_scan = next_exit_check = next_read = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            # Once a second: traced processes that exited, and hints the kernel dropped (a lost
            # hint then costs a rescan a second late; checked every wakeup it cost more than
            # the map reads).
            checks_due = now >= next_exit_check
            try:
                if now >= next_scan or (self.watch is not None and checks_due and self._hints_lost()):
                    self.rescan()
                    self._reader.resync_clock()
                    next_scan = time.monotonic() + self.rescan_seconds
                elif self.watch is not None:
                    self._look_at_hinted()
                    if checks_due:
                        self._forget_exited()
                if checks_due:
                    next_exit_check = now + self.EXIT_CHECK_SECONDS
            except Exception:              # a scan bug must not end tracing
                log.exception("NCCL process discovery failed")
            rc = self._ring.poll(self.LOOP_MS)
            if rc < 0 and rc != -4:        # -EINTR is harmless
                log.warning("NCCL ring buffer poll failed: %s", os.strerror(-rc))
                self._stop.wait(0.5)
            if self._watch_ring is not None:
                self._watch_ring.consume()
            if rc > 0 or self._handler.ended or time.monotonic() >= next_read:
                self._read_kernel()
                next_read = time.monotonic() + self.READ_SECONDS

    def _read_kernel(self) -> None:
        """Apply the kernel's accounting to the tracker; pids seen in it but not traced
        (forks that never exec'd map an already-probed library) get a look."""
        try:
            self._ring.consume()
            ending = self._reader.take_ended()    # destroyed before this read: it is their last
            pids = self._reader.read(drain_events=self._ring.consume)
            self._reader.end_comms(ending)
        except Exception as exc:  # noqa: BLE001 - a read failure must not end tracing
            log.warning("cannot read the NCCL accounting maps: %s", exc)
            return
        with self._lock:
            self._calling = pids - self._pids

    def _hints_lost(self) -> bool:
        """Hints dropped (kernel ring full, or too many pending): only a full rescan is safe."""
        lost = 0
        try:
            if self._watch_lost_map is None:
                self._watch_lost_map = self._watch_obj.map("proc_events_lost")
            value = self._watch_lost_map.lookup(b"\0" * 4)
            lost = struct.unpack("<Q", value)[0] if value else 0
        except Exception as exc:  # noqa: BLE001 - a counter read must not stop the watcher
            log.debug("cannot read proc_events_lost: %s", exc)
        if lost > self._watch_lost or self.watch.overflowed:
            log.warning("process hints lost (%d dropped in the kernel, queue overflowed: %s): full rescan",
                        lost - self._watch_lost, self.watch.overflowed)
            self._watch_lost = lost
            return True
        return False

    def _look_at_hinted(self) -> None:
        """Read the maps of hinted processes only, and of processes seen calling NCCL but not
        yet known (forks that never exec'd map an already-probed library)."""
        with self._lock:
            known = self._pids | self._calling_untraced
        calling = self._calling - known
        pids = set(self.watch.due()) | calling
        if not pids:
            return
        self.looks += len(pids)
        self._calling_untraced |= calling           # looked at once; the rescan reconsiders them
        found: dict[tuple[int, int], tuple[discovery.LibraryRef, set[int]]] = {}
        for pid in sorted(pids):
            maps = discovery.read_maps(self.procfs, pid)
            if maps is None:
                if pid in calling:                  # called NCCL, gone before we looked
                    self._processes_exited({pid})
                continue
            for ref in self._libraries_of(pid, maps):
                found.setdefault((ref.dev, ref.inode), (ref, set()))[1].add(pid)
        new = []
        with self._lock:
            for key, (ref, mapped_by) in found.items():
                library = self._libraries.get(key)
                if library is None:
                    new.append((key, ref, mapped_by))
                    continue
                library.pids |= mapped_by
                if library.links:
                    self._pids |= mapped_by
        for key, ref, mapped_by in new:
            self._add_library(key, ref, mapped_by)

    def _forget_exited(self) -> None:
        # One stat per traced process a second (a rank and its DataLoader workers: tens per
        # GPU). A Path built per pid cost 28 µs of the 30 µs each; a string costs ~2 µs.
        prefix = f"{self.procfs}/"
        with self._lock:
            gone = {pid for pid in self._pids if not os.path.exists(f"{prefix}{pid}")}
            if not gone:
                return
            for library in self._libraries.values():
                library.pids -= gone
            self._pids -= gone
        self._processes_exited(gone)        # the map walks outside the lock a scrape waits on

    def _processes_exited(self, pids: set[int]) -> None:
        """Traced processes gone (DataLoader workers leave together at an epoch's end): their
        comms and kernel entries, in one pass over the maps."""
        for pid in sorted(pids):
            self._handler.process_exited(pid)
            log.info("traced process %d exited", pid)
        try:
            self._reader.forget_processes(pids)
        except Exception as exc:  # noqa: BLE001 - stale entries age out of the LRU maps anyway
            log.debug("cannot delete the kernel entries of processes %s: %s", sorted(pids), exc)
        with self._lock:
            self._exited += len(pids)

    def poll_once(self, timeout_ms: int = 100) -> None:
        """Drain pending events now (tests and benches; the thread does this on its own)."""
        if self._ring is not None:
            self._ring.poll(timeout_ms)
            self._read_kernel()

    def rescan(self) -> None:
        """Read every process's maps: the safety net (and the only way without hints)."""
        self.full_rescans += 1
        self._calling_untraced = set()
        if self.watch is not None:
            self.watch.reset()
        found: dict[tuple[int, int], tuple[discovery.LibraryRef, set[int]]] = {}
        for pid in discovery.process_ids(self.procfs):
            maps = discovery.read_maps(self.procfs, pid)
            if maps is None:
                continue
            for ref in self._libraries_of(pid, maps):
                entry = found.setdefault((ref.dev, ref.inode), (ref, set()))
                entry[1].add(pid)
        traced = set().union(*(pids for _, pids in found.values()))
        with self._lock:
            new = [(key, ref) for key, (ref, _) in found.items() if key not in self._libraries]
            gone = [self._libraries.pop(key) for key in list(self._libraries) if key not in found]
            for key, library in self._libraries.items():
                library.pids = found[key][1]
            exited = self._pids - traced
            # Traced: mapping a library whose probes are in place (new ones join below).
            self._pids = set().union(*(lib.pids for lib in self._libraries.values() if lib.links))
        if exited:
            self._processes_exited(exited)
        if not found and not self._told_no_library:
            log.info("no process maps libnccl yet; %s", "looking at processes as they exec or dlopen"
                     if self.watch else f"looking again every {self.rescan_seconds:.1f}s")
        self._told_no_library = not found
        # Each probe takes ~100 ms to place or remove in a VM: never do it under the lock a
        # scrape waits on. Only this thread changes the set of libraries.
        for library in gone:
            log.info("no process maps %s any more: detaching", library.ref.path)
            self._detach(library)
        for key, ref in new:
            self._add_library(key, ref, found[key][1])

    def _add_library(self, key: tuple[int, int], ref: discovery.LibraryRef, pids: set[int]) -> None:
        library = _Library(ref=ref, pids=pids)
        self._attach(library)
        with self._lock:
            self._libraries[key] = library
            if library.links:
                self._pids |= library.pids

    def _libraries_of(self, pid: int, maps: str) -> list[discovery.LibraryRef]:
        if not discovery.may_map_nccl(maps):
            return []
        nccl, fallback = discovery.nccl_candidates(discovery.mapped_files(maps))
        refs = [ref for ref in (discovery.resolve(self.procfs, pid, path) for path in nccl) if ref]
        if refs:
            return refs
        for path in fallback:
            ref = discovery.resolve(self.procfs, pid, path)
            if ref is None:
                continue
            try:
                if discovery.PROBE_SYMBOL in discovery.exported_functions(ref.host_path):
                    refs.append(ref)
            except (OSError, ValueError) as exc:
                log.debug("cannot read symbols of %s: %s", ref.host_path, exc)
        return refs

    def _attach(self, library: _Library) -> None:
        from ..bpf_loader.libbpf import BpfUnavailable

        try:
            exported = discovery.exported_functions(library.ref.host_path)
        except (OSError, ValueError) as exc:
            library.error = f"cannot read symbols: {exc}"
            log.warning("NCCL library %s: %s", library.ref.path, library.error)
            return
        if discovery.PROBE_SYMBOL not in exported:
            library.error = f"{discovery.PROBE_SYMBOL} is not exported"
            log.warning("NCCL library %s: %s", library.ref.path, library.error)
            return
        for symbol, program, return_program in PROBES:
            if symbol not in exported:
                continue
            try:
                library.links.append(self._obj.attach_uprobe(program, library.ref.host_path, symbol))
                if return_program:
                    library.links.append(self._obj.attach_uprobe(return_program, library.ref.host_path,
                                                                 symbol, retprobe=True))
                library.symbols.append(symbol)
            except (BpfUnavailable, KeyError) as exc:
                library.error = str(exc)
                log.warning("NCCL uprobe on %s:%s failed: %s", library.ref.path, symbol, exc)
        if "ncclAllReduce" not in library.symbols:
            self._detach(library)
            library.error = library.error or "ncclAllReduce could not be probed"
            return
        log.info("NCCL uprobes attached to %s (%d functions)", library.ref.path, len(library.symbols))

    def _detach(self, library: _Library) -> None:
        from ..bpf_loader.libbpf import destroy_links
        destroy_links(library.links)
        library.links = []
        library.symbols = []

    def identify(self, pid: int, pointer: int) -> commread.CommFields:
        """Hash, rank and size of the ncclComm at `pointer` in `pid`, read with the layout
        of the probed library the process maps (commlayout.py)."""
        from .commlayout import LayoutUnknown, library_layout

        with self._lock:
            paths = [lib.ref.host_path for lib in self._libraries.values() if pid in lib.pids and lib.links]
        if not paths:
            # A rank that called before discovery listed it (its init is the first call a
            # process makes, often within the same second as its dlopen): its own maps.
            maps = discovery.read_maps(self.procfs, pid)
            paths = [ref.host_path for ref in self._libraries_of(pid, maps)] if maps else []
        if not paths:
            raise LayoutUnknown("library_unknown", f"pid {pid} maps no NCCL library")
        problem: Exception | None = None
        for path in paths:
            try:
                layout = library_layout(path)
                fields = commread.read_comm(self.procfs, pid, pointer, layout)
                return dataclasses.replace(fields, counter=layout.counter, counter_reason=layout.counter_reason)
            except (LayoutUnknown, commread.CommUnreadable) as exc:
                problem = exc
        raise problem

    # ---- reading ---------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return self._obj is not None

    def traced_pids(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._pids)

    def rank_processes(self) -> list[tuple[str, int, int, int]]:
        return self._handler.rank_processes() if self._handler is not None else []

    def status(self) -> UprobeStatus:
        lost, kernel_invalid = 0, {}
        with self._lock:
            if self._obj is not None and self._reader is not None:
                try:
                    problems = self._reader.problem_counts()
                    lost = problems.pop("events_lost")
                    kernel_invalid = {k: v for k, v in problems.items() if v}
                    if lost > self._lost_logged:
                        log.warning("NCCL ring buffer full: %d event(s) dropped in the kernel so far", lost)
                        self._lost_logged = lost
                except Exception as exc:  # noqa: BLE001 - reading a counter must not fail the scrape
                    log.debug("cannot read nccl_problems: %s", exc)
            libraries = {lib.ref.path: bool(lib.links) for lib in self._libraries.values()}
            events, invalid = self._handler.counts() if self._handler else (0, {})
            invalid.update(kernel_invalid)
            return UprobeStatus(reason=self.reason, libraries=libraries, processes_traced=len(self._pids),
                                processes_exited=self._exited,
                                events_lost=lost, invalid=invalid, events=events,
                                identities=self._handler.sources() if self._handler else {},
                                numbering=dict(self._reader.numbering) if self._reader else {})
