"""NCCL through uprobes: discovery, attach/detach per library file, event decoding.

exporter/bpf/nccl.bpf.c emits one `struct nccl_event` per collective entry, collective
return, communicator init and communicator destroy. This module:
- decodes those records (decode_event, pure) and applies them to an NcclTracker
  (EventHandler): comm pointer -> (comm id hash, rank, nranks), entry/return pairing per
  thread, bytes = count x datatype size;
- finds libnccl.so* in processes' maps (libtorch_cuda.so where NCCL is linked in
  statically and still exports ncclAllReduce), attaches once per library *file* (uprobes
  are per inode, so one attach covers every process mapping it), and detaches a library
  when no process maps it any more. Which processes to look at comes from exec and
  dlopen hints (exporter/bpf/procwatch.bpf.c, discovery.ProcessWatch) and from pids first
  seen in NCCL events; a full rescan of every process runs only as a slow safety net
  (every 2 s when the hints are unavailable).
Every failure is a metric and a log line; nothing here raises into the exporter.
"""
from __future__ import annotations

import logging
import os
import platform
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from . import discovery
from .commid import comm_label, fold_words, splitmix64, unique_id_hash
from .events import OPS, NcclCall

log = logging.getLogger("fabricscope.exporter.nccl")

# struct nccl_event in exporter/bpf/nccl.bpf.c
EVENT = struct.Struct("<QQQQIIHHiiiiI128s")
EV_COLL_ENTER, EV_COLL_RETURN, EV_COMM_INIT, EV_COMM_END, EV_COLL_DONE = 1, 2, 3, 4, 5
# struct open_call in exporter/bpf/nccl.bpf.c (nccl_open_calls, keyed by pid_tgid)
OPEN_CALL = struct.Struct("<QQQIHHii")
INIT_RANK, INIT_ALL, INIT_SPLIT, INIT_SCALABLE = 1, 2, 3, 4

# ncclDataType_t -> bytes per element (nccl.h): Int8/Char, Uint8, Int32/Int, Uint32,
# Int64, Uint64, Float16/Half, Float32/Float, Float64/Double, Bfloat16, Float8e4m3, Float8e5m2.
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
    """One decoded record. A NamedTuple, not a dataclass: decoding runs once per NCCL call
    entry and return, and building a frozen dataclass cost 4x the unpacking (docs/cost.md)."""
    ts_ns: int
    comm: int
    count: int
    aux: int
    pid: int
    tid: int
    kind: int
    op: int
    dtype: int
    peer: int
    rank: int
    nranks: int
    unique_id: bytes
    seq: int = 0         # collective entry: sequence number on the comm, counted in the kernel


def decode_event(raw: bytes) -> NcclEvent:
    if len(raw) < EVENT.size:
        raise ValueError(f"event record of {len(raw)} bytes, expected {EVENT.size}")
    (ts, comm, count, aux, pid, tid, kind, op, dtype, peer, rank, nranks, seq,
     unique_id) = EVENT.unpack_from(raw)
    return NcclEvent(ts, comm, count, aux, pid, tid, kind, op, dtype, peer, rank, nranks, unique_id, seq)


@dataclass
class _CommRef:
    label: str
    rank: int
    nranks: int


class EventHandler:
    """Applies decoded events to the tracker. Single-threaded (the ring-buffer poller)."""

    def __init__(self, tracker, monotonic_to_wall=None) -> None:
        self.tracker = tracker
        # bpf_ktime_get_ns is CLOCK_MONOTONIC; wall = monotonic + offset.
        self._offset = monotonic_to_wall if monotonic_to_wall is not None else time.time() - time.monotonic()
        self.comms: dict[tuple[int, int], _CommRef] = {}      # (pid, comm pointer) -> comm
        self.open_calls: dict[tuple[int, int], int] = {}   # (pid, tid) -> entry ts_ns
        self.invalid: dict[str, int] = {}
        self.events = 0
        self._counts_lock = threading.Lock()     # counters are read from scrape threads

    def resync_clock(self) -> None:
        self._offset = time.time() - time.monotonic()

    def _wall(self, ts_ns: int) -> float:
        return ts_ns / 1e9 + self._offset

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
        if event.kind == EV_COLL_DONE:
            # One event per returned call. Its entry may already be known: a call open long
            # enough to be read as a hang candidate (open_call_seen).
            token = (event.pid, event.tid)
            if self.open_calls.get(token) != event.ts_ns:
                self._enter(event)
            if self.open_calls.pop(token, None) is not None:
                self.tracker.call_returned(token, event.aux / 1e9)
        elif event.kind == EV_COLL_ENTER:
            self._enter(event)
        elif event.kind == EV_COLL_RETURN:
            entered = self.open_calls.pop((event.pid, event.tid), None)
            if entered is None:
                self._invalid("unpaired_return")     # the entry was lost or predates attach
                return
            self.tracker.call_returned((event.pid, event.tid), (event.ts_ns - entered) / 1e9)
        elif event.kind == EV_COMM_INIT:
            self._init(event)
        elif event.kind == EV_COMM_END:
            ref = self.comms.pop((event.pid, event.comm), None)
            if ref is not None:
                self.tracker.drop_inflight(ref.label, ref.rank)
        else:
            self._invalid("unknown_kind")

    def open_call_seen(self, pid: int, tid: int, raw: bytes) -> None:
        """A collective still open in the kernel (nccl_open_calls): entered once, as if its
        entry event had come, so a call blocked inside NCCL is in flight while it blocks."""
        ts, comm, count, seq, op, _pad, dtype, peer = OPEN_CALL.unpack_from(raw)
        if self.open_calls.get((pid, tid)) == ts:
            return
        self.handle(NcclEvent(ts, comm, count, 0, pid, tid, EV_COLL_ENTER, op, dtype, peer, 0, 0, b"", seq))

    def _comm(self, pid: int, pointer: int) -> _CommRef:
        ref = self.comms.get((pid, pointer))
        if ref is None:
            # Initialised before we attached: no unique id, rank or size to be had.
            ref = _CommRef(label="unknown-" + comm_label(fold_words([pid, pointer]))[:8], rank=-1, nranks=0)
            self.comms[(pid, pointer)] = ref
        return ref

    def _enter(self, event: NcclEvent) -> None:
        if not 0 <= event.op < len(OPS):
            self._invalid("unknown_op")
            return
        size = DATATYPE_BYTES.get(event.dtype)
        if size is None:
            self._invalid("unknown_datatype")
            size = 0
        ref = self._comm(event.pid, event.comm)
        call = NcclCall(op=OPS[event.op], comm=ref.label, rank=ref.rank, nranks=ref.nranks,
                        nbytes=event.count * size, start=self._wall(event.ts_ns), sequence=event.seq or None)
        self.open_calls[(event.pid, event.tid)] = event.ts_ns
        self.tracker.call_entered(call, token=(event.pid, event.tid))

    def _init(self, event: NcclEvent) -> None:
        if event.op in (INIT_RANK, INIT_SCALABLE):
            label = comm_label(unique_id_hash(event.unique_id))
            rank, nranks = event.rank, event.nranks
        elif event.op == INIT_ALL:
            # One process, all devices: NCCL makes its own unique id; the clique is named by
            # the process and its first communicator.
            label = comm_label(fold_words([event.pid, event.aux]))
            rank, nranks = event.rank, event.nranks
        elif event.op == INIT_SPLIT:
            parent = self._comm(event.pid, event.aux)
            color = splitmix64(event.peer & (2**64 - 1))
            if parent.label.startswith("unknown-"):
                label = "unknown-" + comm_label(fold_words([event.pid, event.comm]))[:8]
            else:
                label = comm_label(splitmix64(int(parent.label, 16) ^ color))
            # The new rank and size are decided inside NCCL, not visible in the arguments:
            # report the split key as the rank (it orders the ranks) and nranks 0 (unknown).
            rank, nranks = event.rank, 0
        else:
            self._invalid("unknown_init")
            return
        self.comms[(event.pid, event.comm)] = _CommRef(label, rank, nranks)
        if rank >= 0:
            self.tracker.register_comm(label, rank, nranks)

    def rank_processes(self) -> list[tuple[str, int, int, int]]:
        """(comm, rank, nranks, pid) of every communicator seen initialised."""
        # list() copies in one step under the GIL: the poller thread adds and removes comms.
        return [(ref.label, ref.rank, ref.nranks, pid) for (pid, _), ref in list(self.comms.items())
                if ref.rank >= 0]

    def process_exited(self, pid: int) -> int:
        """Forget the process; returns how many of its calls were still inside NCCL."""
        blocked = [k for k in self.open_calls if k[0] == pid]
        for key in blocked:
            del self.open_calls[key]
            self.tracker.forget_token(key)
        for key in [k for k in self.comms if k[0] == pid]:
            ref = self.comms.pop(key)
            self.tracker.drop_inflight(ref.label, ref.rank)
        return len(blocked)


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


class UprobeSource:
    """Background thread: rescan processes, attach/detach, poll the ring buffer."""

    # Full rescans: a safety net when exec/dlopen hints arrive, the only way when they cannot.
    RESCAN_WITH_HINTS = 300.0
    RESCAN_WITHOUT_HINTS = 2.0
    # Collective events are drained in batches this often (ms).
    BATCH_MS = 100
    # How often traced processes are checked for having exited (a stat each).
    EXIT_CHECK_SECONDS = 1.0

    # Ring buffer for NCCL events. Drained every BATCH_MS, it must hold one batch: 1 MiB is
    # ~5,400 events, 54,000 a second (a job of 8 ranks at 3,000 calls/s each). Its pages count
    # in the exporter's RSS (twice the size once the ring has wrapped), so it is not larger.
    RING_BYTES = 1 << 20

    def __init__(self, procfs: Path, sysfs: Path, object_path: Path, rescan_seconds: float | None = None,
                 watch_object_path: Path | None = None, ring_bytes: int | None = None) -> None:
        """rescan_seconds None: RESCAN_WITH_HINTS, or RESCAN_WITHOUT_HINTS when the process
        watch (procwatch.bpf.o beside object_path) cannot run."""
        self.procfs = Path(procfs)
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
        self.full_rescans = 0
        self.looks = 0
        self._calling_untraced: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._obj = None
        self._ring = None
        self._handler: EventHandler | None = None
        self._libraries: dict[tuple[int, int], _Library] = {}
        self._pids: set[int] = set()
        self._exited = 0
        self._lost_logged = 0
        self._told_no_library = False

    # ---- lifecycle ---------------------------------------------------------------------

    def attach(self, tracker) -> None:
        self._handler = EventHandler(tracker)
        if not self._load():
            return
        self._thread = threading.Thread(target=self._run, name="nccl-uprobes", daemon=True)
        self._thread.start()

    def _load(self) -> bool:
        if platform.machine() not in ("x86_64", "AMD64"):
            return self._unavailable("unsupported_arch", f"NCCL uprobes decode x86-64 arguments; this is "
                                                         f"{platform.machine()}")
        try:
            from ..ebpf import reasons
            from ..ebpf.libbpf import BpfObject, BpfUnavailable
        except ImportError as exc:
            return self._unavailable("no_libbpf", str(exc))
        problem = reasons.preflight(self.sysfs)
        if problem:
            return self._unavailable(*problem)
        try:
            self._obj = BpfObject.load(self.object_path, map_sizes={"nccl_events": self.ring_bytes})
            self._ring = self._obj.ring_buffer("nccl_events", self._handler.handle_raw)
        except (BpfUnavailable, KeyError) as exc:
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
        from ..ebpf import elfsym
        from ..ebpf.libbpf import BpfObject, BpfUnavailable

        watch = discovery.ProcessWatch()
        try:
            obj = BpfObject.load(self.watch_object_path)
        except BpfUnavailable as exc:
            self.watch_reason = exc.reason
            log.warning("process watch unavailable (%s): full rescans every %.1fs", exc, self.rescan_seconds)
            return
        try:
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
        with self._lock:
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
        next_scan = next_exit_check = 0.0
        batch = 0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_scan or (self.watch is not None and self._hints_lost()):
                    self.rescan()
                    self._handler.resync_clock()
                    next_scan = time.monotonic() + self.rescan_seconds
                elif self.watch is not None:
                    self._look_at_hinted()
                    if now >= next_exit_check:
                        self._forget_exited()
                        next_exit_check = now + self.EXIT_CHECK_SECONDS
            except Exception:              # a scan bug must not end tracing
                log.exception("NCCL process discovery failed")
            # Collective events do not wake this thread (nccl.bpf.c): wait for an init/destroy
            # or the batch interval, then drain everything pending in one go.
            # A batch that filled a quarter of the ring: drain again sooner, before it fills.
            busy = batch * (EVENT.size + 8) > self.ring_bytes // 4
            rc = self._ring.poll(10 if busy else self.BATCH_MS)
            if rc >= 0:
                batch = rc = rc + self._ring.consume()
            if rc < 0 and rc != -4:        # -EINTR is harmless
                log.warning("NCCL ring buffer poll failed: %s", os.strerror(-rc))
                self._stop.wait(0.5)
            if self._watch_ring is not None:
                self._watch_ring.consume()
            self._read_open_calls()

    # A call open longer than this is entered from the open-calls map (a hang candidate);
    # shorter ones arrive, entry and return together, when they return.
    CANDIDATE_NS = 20_000_000

    def _read_open_calls(self) -> None:
        """Calls still inside NCCL for over CANDIDATE_NS: the tracker must see them in flight.
        Entries of processes no longer traced (killed inside a call) are deleted."""
        try:
            open_calls = self._obj.map("nccl_open_calls")
            entries = open_calls.items()
        except Exception as exc:            # a read failure must not end tracing
            log.debug("cannot read nccl_open_calls: %s", exc)
            return
        now = time.monotonic_ns()             # bpf_ktime_get_ns is CLOCK_MONOTONIC
        # The thread's previous call returned before this one entered, so its event is in
        # the ring already: deliver it first, or the tracker would see the two out of order.
        self._ring.consume()
        with self._lock:
            traced = set(self._pids)
        for key, raw in entries:
            pid_tgid = struct.unpack("<Q", key)[0]
            pid, tid = pid_tgid >> 32, pid_tgid & 0xFFFFFFFF
            if now - struct.unpack_from("<Q", raw)[0] < self.CANDIDATE_NS:
                continue
            if pid not in traced and not (self.procfs / str(pid)).exists():
                open_calls.delete(key)
                continue
            self._handler.open_call_seen(pid, tid, raw)

    def _hints_lost(self) -> bool:
        """Hints dropped (kernel ring full, or too many pending): only a full rescan is safe."""
        lost = 0
        try:
            value = self._watch_obj.map("proc_events_lost").lookup(b"\0" * 4)
            lost = struct.unpack("<Q", value)[0] if value else 0
        except Exception as exc:
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
        calling = {pid for pid, _ in list(self._handler.comms)} - known
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
                    self._handler.process_exited(pid)
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
        with self._lock:
            gone = {pid for pid in self._pids if not (self.procfs / str(pid)).exists()}
            if not gone:
                return
            for library in self._libraries.values():
                library.pids -= gone
            self._pids -= gone
            for pid in sorted(gone):
                self._process_exited(pid)

    def _process_exited(self, pid: int) -> None:
        inflight = self._handler.process_exited(pid)
        self._exited += 1
        log.info("traced process %d exited%s", pid, f" with {inflight} NCCL call(s) open" if inflight else "")

    def poll_once(self, timeout_ms: int = 100) -> None:
        """Drain pending events now (tests and benches; the thread does this on its own)."""
        if self._ring is not None:
            self._ring.poll(timeout_ms)
            self._ring.consume()
            self._read_open_calls()

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
            for pid in self._pids - traced:
                self._process_exited(pid)
            # Traced: mapping a library whose probes are in place (new ones join below).
            self._pids = set().union(*(lib.pids for lib in self._libraries.values() if lib.links))
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
        from ..ebpf.libbpf import BpfUnavailable

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
        for link in library.links:
            link.destroy()
        library.links = []
        library.symbols = []

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
        lost = 0
        with self._lock:
            if self._obj is not None:
                try:
                    value = self._obj.map("nccl_events_lost").lookup(b"\0" * 4)
                    lost = struct.unpack("<Q", value)[0] if value else 0
                    if lost > self._lost_logged:
                        log.warning("NCCL ring buffer full: %d event(s) dropped in the kernel so far", lost)
                        self._lost_logged = lost
                except Exception as exc:        # reading a counter must not fail the scrape
                    log.debug("cannot read nccl_events_lost: %s", exc)
            libraries = {lib.ref.path: bool(lib.links) for lib in self._libraries.values()}
            events, invalid = self._handler.counts() if self._handler else (0, {})
            return UprobeStatus(reason=self.reason, libraries=libraries, processes_traced=len(self._pids),
                                processes_exited=self._exited,
                                events_lost=lost, invalid=invalid, events=events)
