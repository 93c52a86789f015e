"""A ctypes binding to the system libbpf (Debian libbpf1, libbpf >= 1.1).

Only what the exporter needs: open + load a CO-RE object, attach programs by their SEC()
(tracepoint/, tp_btf/, raw_tp/) or as uprobes, read/update maps, poll ring buffers, and
read per-program run statistics. libbpf's own log (including verifier output) goes to
Python logging under "fabricscope.ebpf.libbpf".

Every failure raises BpfUnavailable with a bounded `reason` (see reasons.py) so callers
can turn it into fabric_ebpf_available{reason} instead of crashing.
"""
from __future__ import annotations

import ctypes
import errno as _errno
import ctypes.util
import logging
import os
import struct
import threading
from pathlib import Path
from typing import Callable, Iterator

from . import elfsym
from .reasons import (ATTACH_FAILED, BAD_OBJECT, LOAD_FAILED, MAP_FULL, NO_LIBBPF, OBJECT_MISSING,
                      BpfUnavailable, reason_for_errno)

__all__ = ["BpfUnavailable", "BpfObject", "BpfMap", "Link", "RingBuffer", "enable_bpf_stats",
           "bpf_stats_enabled", "library"]

log = logging.getLogger("fabricscope.ebpf.libbpf")

# enum bpf_map_type values whose lookups return one value per possible CPU.
_PERCPU_MAP_TYPES = {5, 6, 10, 21}   # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE
# Map types without keys to iterate (ring buffers, perf arrays, program arrays).
_UNITERABLE_MAP_TYPES = {3, 4, 27}   # PROG_ARRAY, PERF_EVENT_ARRAY, RINGBUF
# Entries per BPF_MAP_LOOKUP_BATCH call: one syscall per this many entries, where iterating
# costs two per entry (get_next_key, lookup) and a Python round trip each.
BATCH_ENTRIES = 256
_ENOTSUPP = 524                      # the kernel-internal "operation not supported" errno
BPF_STATS_RUN_TIME = 0
# struct bpf_prog_info (uapi linux/bpf.h): offsets are ABI, stable since kernel 5.1.
_PROG_INFO_SIZE = 232
_PROG_INFO_RUN_TIME_NS = 192
_PROG_INFO_RUN_CNT = 200
_LOG_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}

_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_SAMPLE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _UprobeOpts(ctypes.Structure):
    # struct bpf_uprobe_opts as of libbpf 1.1; `sz` tells libbpf which fields we know.
    _fields_ = [("sz", ctypes.c_size_t), ("ref_ctr_offset", ctypes.c_size_t),
                ("bpf_cookie", ctypes.c_uint64), ("retprobe", ctypes.c_bool),
                ("func_name", ctypes.c_char_p)]


class _Lib:
    """The loaded shared library with argument/return types declared once."""

    def __init__(self) -> None:
        names = [os.environ.get("FABRIC_LIBBPF", ""), "libbpf.so.1", ctypes.util.find_library("bpf") or ""]
        errors = []
        for name in filter(None, names):
            try:
                self.so = ctypes.CDLL(name, use_errno=True)
                break
            except OSError as exc:
                errors.append(str(exc))
        else:
            raise BpfUnavailable(NO_LIBBPF, "libbpf.so.1 not found (install Debian package libbpf1): "
                                 + "; ".join(errors))
        self.libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        vp, c_int, c_char_p, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32
        self._declare("bpf_object__open_file", vp, [c_char_p, vp])
        self._declare("bpf_object__load", c_int, [vp])
        self._declare("bpf_object__close", None, [vp])
        self._declare("bpf_object__find_program_by_name", vp, [vp, c_char_p])
        self._declare("bpf_object__next_program", vp, [vp, vp])
        self._declare("bpf_object__find_map_by_name", vp, [vp, c_char_p])
        self._declare("bpf_program__name", c_char_p, [vp])
        self._declare("bpf_program__fd", c_int, [vp])
        self._declare("bpf_program__set_autoload", c_int, [vp, ctypes.c_bool])
        self._declare("bpf_program__section_name", c_char_p, [vp])
        self._declare("bpf_program__set_expected_attach_type", c_int, [vp, c_int])
        self._declare("bpf_program__attach", vp, [vp])
        self._declare("bpf_program__attach_uprobe_opts", vp,
                      [vp, c_int, c_char_p, ctypes.c_size_t, ctypes.POINTER(_UprobeOpts)])
        self._declare("bpf_link__destroy", c_int, [vp])
        self._declare("bpf_map__name", c_char_p, [vp])
        self._declare("bpf_map__fd", c_int, [vp])
        self._declare("bpf_map__key_size", u32, [vp])
        self._declare("bpf_map__value_size", u32, [vp])
        self._declare("bpf_map__max_entries", u32, [vp])
        self._declare("bpf_map__set_max_entries", c_int, [vp, u32])
        self._declare("bpf_map__type", c_int, [vp])
        self._declare("bpf_map_get_next_key", c_int, [c_int, vp, vp])
        self._declare("bpf_map_lookup_elem", c_int, [c_int, vp, vp])
        self._declare("bpf_map_lookup_batch", c_int, [c_int, vp, vp, vp, vp, ctypes.POINTER(u32), vp])
        self._declare("bpf_map_update_elem", c_int, [c_int, vp, vp, ctypes.c_uint64])
        self._declare("bpf_map_delete_elem", c_int, [c_int, vp])
        self._declare("bpf_obj_get_info_by_fd", c_int, [c_int, vp, ctypes.POINTER(u32)])
        self._declare("bpf_enable_stats", c_int, [c_int])
        self._declare("libbpf_num_possible_cpus", c_int, [])
        self._declare("libbpf_set_print", vp, [_PRINT_FN])
        self._declare("ring_buffer__new", vp, [c_int, _SAMPLE_FN, vp, vp])
        self._declare("ring_buffer__poll", c_int, [vp, c_int])
        self._declare("ring_buffer__consume", c_int, [vp])
        self._declare("ring_buffer__free", None, [vp])
        self.libc.syscall.restype = ctypes.c_long
        self.libc.vsnprintf.restype = c_int
        self.libc.vsnprintf.argtypes = [c_char_p, ctypes.c_size_t, c_char_p, vp]
        self.possible_cpus = self.so.libbpf_num_possible_cpus()
        # libbpf's print callback is process-global; keep a reference so it is never freed.
        self._print_cb = _PRINT_FN(self._on_print)
        self.capture: list[str] | None = None
        self.capture_lock = threading.Lock()
        self.so.libbpf_set_print(self._print_cb)

    def _declare(self, name: str, restype, argtypes) -> None:
        fn = getattr(self.so, name)
        fn.restype = restype
        fn.argtypes = argtypes

    def _on_print(self, level: int, fmt: bytes, args: int) -> int:
        # va_list arrives as a pointer on x86_64 and arm64; vsnprintf consumes it once.
        try:
            buf = ctypes.create_string_buffer(4096)
            self.libc.vsnprintf(buf, len(buf), fmt, args)
            line = buf.value.decode("utf-8", "replace").rstrip("\n")
            if self.capture is not None and len(self.capture) < 2000:   # bounded: verifier logs are long
                self.capture.append(line)
            log.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", line)
        except Exception:  # noqa: BLE001 - never let an exception unwind into C
            pass
        return 0


_lib: _Lib | None = None
_lib_lock = threading.Lock()


def library() -> _Lib:
    """The process-wide libbpf handle; raises BpfUnavailable("no_libbpf") if absent."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = _Lib()
        return _lib


def _errno_of(rc: int | None = None) -> int:
    # libbpf 1.x returns -errno from most calls and also sets errno; prefer the return.
    if rc is not None and rc < 0:
        return -rc
    return ctypes.get_errno() or 1


class Link:
    """An attachment of one program; destroy() detaches it."""

    def __init__(self, lib: _Lib, ptr: int, program: str, target: str) -> None:
        self._lib, self._ptr, self.program, self.target = lib, ptr, program, target
        self._lock = threading.Lock()

    @property
    def attached(self) -> bool:
        return self._ptr is not None

    def destroy(self) -> None:
        with self._lock:
            if self._ptr is not None:
                self._lib.so.bpf_link__destroy(self._ptr)
                self._ptr = None

    def __repr__(self) -> str:
        return f"Link({self.program!r} -> {self.target!r}, attached={self.attached})"


class FdLink(Link):
    """A link the kernel gave as a descriptor (BPF_LINK_CREATE), held where Link holds
    libbpf's pointer: closing it detaches."""

    def destroy(self) -> None:
        with self._lock:
            if self._ptr is not None:
                os.close(self._ptr)
                self._ptr = None


# Uprobes as BPF_TRACE_UPROBE_MULTI links (kernel 6.6+) rather than libbpf 1.1's perf-event
# uprobes. What it buys is detaching: the kernel releases a perf-event uprobe under a global
# mutex and behind grace periods of its own, about 0.1-0.2 s each on a loaded VM, so an
# exporter tracing one libnccl (25 probes) took 2.3-6 s to stop and SIGKILL met some in a
# container; a multi link's release waits once, and several release side by side.
# uapi linux/bpf.h: enum bpf_cmd, enum bpf_attach_type, BPF_F_UPROBE_MULTI_RETURN.
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_BPF_PROG_LOAD, _BPF_LINK_CREATE = 5, 28
_BPF_PROG_TYPE_KPROBE = 2
_BPF_TRACE_UPROBE_MULTI = 48
_BPF_F_UPROBE_MULTI_RETURN = 1
_NO_SUCH_PATH = "/nonexistent/fabricscope-uprobe-multi-probe"


class _LinkCreateUprobeMulti(ctypes.Structure):
    # union bpf_attr, the BPF_LINK_CREATE member with its uprobe_multi arm.
    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32), ("attach_type", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("path", ctypes.c_uint64), ("offsets", ctypes.c_uint64),
                ("ref_ctr_offsets", ctypes.c_uint64), ("cookies", ctypes.c_uint64), ("cnt", ctypes.c_uint32),
                ("multi_flags", ctypes.c_uint32), ("pid", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class _ProgLoad(ctypes.Structure):
    # union bpf_attr, the BPF_PROG_LOAD member up to expected_attach_type.
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16), ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32)]


def _prepare_uprobe_multi(lib: _Lib, obj_ptr: int) -> bool:
    """Before the load: every uprobe/uretprobe program of the object for uprobe_multi links,
    where the kernel has them. Whether it did."""
    programs, prog = [], lib.so.bpf_object__next_program(obj_ptr, None)
    while prog:
        if (lib.so.bpf_program__section_name(prog) or b"").split(b"/")[0] in (b"uprobe", b"uretprobe"):
            programs.append(prog)
        prog = lib.so.bpf_object__next_program(obj_ptr, prog)
    if not programs or not uprobe_multi_supported():
        return False
    for prog in programs:
        lib.so.bpf_program__set_expected_attach_type(prog, _BPF_TRACE_UPROBE_MULTI)
    return True


def _link_create_uprobe_multi(lib: _Lib, prog_fd: int, path: str, offset: int, retprobe: bool, pid: int) -> int:
    """A uprobe_multi link of one probe: its descriptor, or -errno."""
    path_buf = ctypes.create_string_buffer(path.encode())
    offsets = (ctypes.c_uint64 * 1)(offset)
    attr = _LinkCreateUprobeMulti(prog_fd=prog_fd, attach_type=_BPF_TRACE_UPROBE_MULTI,
                                  path=ctypes.addressof(path_buf), offsets=ctypes.addressof(offsets), cnt=1,
                                  multi_flags=_BPF_F_UPROBE_MULTI_RETURN if retprobe else 0, pid=max(pid, 0))
    fd = lib.libc.syscall(_SYS_BPF, _BPF_LINK_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
    return fd if fd >= 0 else -ctypes.get_errno()


_uprobe_multi: bool | None = None


def uprobe_multi_supported() -> bool:
    """Whether this kernel attaches uprobe_multi links. An empty program loaded for that
    attach type is linked to a path that does not exist: a kernel that knows the link type
    looks the path up (ENOENT); one that does not refuses the attach type (EINVAL)."""
    global _uprobe_multi
    if _uprobe_multi is None:
        _uprobe_multi = False
        lib = library()
        if _SYS_BPF is not None:
            insns = (ctypes.c_uint64 * 2)(0xB7, 0x95)          # r0 = 0; exit
            license_ = ctypes.create_string_buffer(b"GPL")
            load = _ProgLoad(prog_type=_BPF_PROG_TYPE_KPROBE, insn_cnt=2, insns=ctypes.addressof(insns),
                             license=ctypes.addressof(license_), expected_attach_type=_BPF_TRACE_UPROBE_MULTI)
            prog_fd = lib.libc.syscall(_SYS_BPF, _BPF_PROG_LOAD, ctypes.byref(load), ctypes.sizeof(load))
            if prog_fd >= 0:
                try:
                    _uprobe_multi = _link_create_uprobe_multi(lib, prog_fd, _NO_SUCH_PATH, 0, False, 0) == -_errno.ENOENT
                finally:
                    os.close(prog_fd)
        log.debug("uprobe_multi links %s", "supported" if _uprobe_multi else "unsupported: perf-event uprobes")
    return _uprobe_multi


def destroy_links(links) -> None:
    """Detach many links at once. Each uprobe's detach waits out RCU grace periods in the
    kernel (~0.2 s apiece, seconds for a library's two dozen probes, one after another);
    detached from parallel threads (ctypes drops the GIL) the waits overlap. The process's
    exit would release them one after another too, so shutdown comes here first."""
    links = list(links)
    if len(links) <= 1:
        for link in links:
            link.destroy()
        return
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(64, len(links)), thread_name_prefix="bpf-detach") as pool:
        list(pool.map(lambda link: link.destroy(), links))


class BpfMap:
    """One map of a loaded object. Reads allocate their own buffers: thread-safe."""

    def __init__(self, obj: "BpfObject", ptr: int) -> None:
        lib = obj._lib
        self._obj, self._lib = obj, lib
        self.name = lib.so.bpf_map__name(ptr).decode()
        self.fd = lib.so.bpf_map__fd(ptr)
        self.key_size = lib.so.bpf_map__key_size(ptr)
        self.value_size = lib.so.bpf_map__value_size(ptr)
        self.max_entries = lib.so.bpf_map__max_entries(ptr)
        self.type = lib.so.bpf_map__type(ptr)
        self.per_cpu = self.type in _PERCPU_MAP_TYPES
        self.ncpus = lib.possible_cpus if self.per_cpu else 1
        # Per-CPU values are each rounded up to 8 bytes in the lookup buffer.
        self._stride = (self.value_size + 7) // 8 * 8 if self.per_cpu else self.value_size
        self._no_batch = False               # BPF_MAP_LOOKUP_BATCH refused (kernel < 5.6, map type)

    def _key(self, key: bytes) -> ctypes.Array:
        if len(key) != self.key_size:
            raise ValueError(f"map {self.name}: key is {len(key)} bytes, expected {self.key_size}")
        return ctypes.create_string_buffer(bytes(key), self.key_size)

    def _raw_lookup(self, key_buf) -> bytes | None:
        value = ctypes.create_string_buffer(self._stride * self.ncpus)
        rc = self._lib.so.bpf_map_lookup_elem(self.fd, key_buf, value)
        if rc < 0:
            return None
        return value.raw

    def _split(self, raw: bytes) -> list[bytes]:
        return [raw[i * self._stride:i * self._stride + self.value_size] for i in range(self.ncpus)]

    def _sum(self, raw: bytes) -> bytes:
        # Per-CPU values are summed as arrays of u64 (counters and histogram slots).
        if self.value_size % 8:
            raise ValueError(f"map {self.name}: per-CPU values of {self.value_size} bytes cannot be summed as u64")
        # One unpack of the whole buffer and one C-level sum per slot across the CPUs: the
        # per-CPU loop in Python grew with the CPU count (a 40-slot histogram on 64 CPUs
        # took 288 µs a lookup that way, 88 µs this way; bench/percpu_sum.py).
        n = self.value_size // 8
        words = struct.unpack(f"<{len(raw) // 8}Q", raw)
        step = self._stride // 8
        return struct.pack(f"<{n}Q", *(sum(words[i::step]) & 0xFFFFFFFFFFFFFFFF for i in range(n)))

    def lookup(self, key: bytes, per_cpu: bool = False) -> bytes | list[bytes] | None:
        """The value for `key`, None if absent. Per-CPU maps: summed, or a list if per_cpu."""
        self._obj._check_open()
        raw = self._raw_lookup(self._key(key))
        if raw is None:
            return None
        if not self.per_cpu:
            return raw[:self.value_size]
        return self._split(raw) if per_cpu else self._sum(raw)

    def keys(self) -> Iterator[bytes]:
        self._obj._check_open()
        if self.type in _UNITERABLE_MAP_TYPES:
            raise TypeError(f"map {self.name} (type {self.type}) has no keys to iterate")
        prev, cur = None, ctypes.create_string_buffer(self.key_size)
        # A hash map being updated concurrently can restart iteration; bound it.
        for _ in range(self.max_entries * 2 + 1):
            rc = self._lib.so.bpf_map_get_next_key(self.fd, prev, cur)
            if rc < 0:
                return
            yield cur.raw
            prev = ctypes.create_string_buffer(cur.raw, self.key_size)

    def items(self, per_cpu: bool = False) -> list[tuple[bytes, bytes | list[bytes]]]:
        """All (key, value) pairs as raw bytes; per-CPU values summed unless per_cpu."""
        batched = self._lookup_batched()
        if batched is not None:
            if not self.per_cpu:
                return [(key, raw[:self.value_size]) for key, raw in batched]
            return [(key, self._split(raw) if per_cpu else self._sum(raw)) for key, raw in batched]
        out = []
        seen = set()
        for key in self.keys():
            if key in seen:
                continue
            seen.add(key)
            value = self.lookup(key, per_cpu=per_cpu)
            if value is not None:   # deleted between get_next_key and lookup
                out.append((key, value))
        return out

    def _lookup_batched(self) -> list[tuple[bytes, bytes]] | None:
        """Every (key, raw value) by BPF_MAP_LOOKUP_BATCH, or None where the kernel or the
        map type has no batch lookup (kernels before 5.6; the caller then iterates). The map
        may change during the sweep, as it may while iterating: an entry added or deleted
        meanwhile is seen or not, never half."""
        self._obj._check_open()
        if self.type in _UNITERABLE_MAP_TYPES or self._no_batch:
            return None
        so, width = self._lib.so, self._stride * self.ncpus
        room = min(BATCH_ENTRIES, self.max_entries)
        token = max(8, self.key_size)        # the kernel's batch token: a bucket or index, at most a key
        start, after = None, ctypes.create_string_buffer(token)
        count = ctypes.c_uint32()
        out: list[tuple[bytes, bytes]] = []
        for _ in range(self.max_entries + 2):   # bound: each call moves on or grows its room
            keys = ctypes.create_string_buffer(room * self.key_size)
            values = ctypes.create_string_buffer(room * width)
            count.value = room
            rc = so.bpf_map_lookup_batch(self.fd, start, after, keys, values, ctypes.byref(count), None)
            err = _errno_of(rc) if rc < 0 else 0
            if err == _errno.ENOSPC and room < self.max_entries:
                room = min(room * 2, self.max_entries)   # one hash bucket holds more than the room
                continue
            if err and err != _errno.ENOENT:
                if err in (_errno.EINVAL, _errno.EOPNOTSUPP, _ENOTSUPP):
                    self._no_batch = True        # not asked again: this kernel or map type has none
                log.debug("map %s: batch lookup failed (%s); iterating", self.name, os.strerror(err))
                return None
            got = count.value
            keys_raw = ctypes.string_at(keys, got * self.key_size)
            values_raw = ctypes.string_at(values, got * width)
            out.extend((keys_raw[i * self.key_size:(i + 1) * self.key_size], values_raw[i * width:(i + 1) * width])
                       for i in range(got))
            if err == _errno.ENOENT:         # the sweep is complete
                return out
            start, after = after, ctypes.create_string_buffer(token)
        return out

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        self._obj._check_open()
        if self.per_cpu:
            if len(value) == self.value_size:
                value = value * self.ncpus
            value = b"".join(value[i * self.value_size:(i + 1) * self.value_size].ljust(self._stride, b"\0")
                             for i in range(self.ncpus))
        elif len(value) != self.value_size:
            raise ValueError(f"map {self.name}: value is {len(value)} bytes, expected {self.value_size}")
        buf = ctypes.create_string_buffer(bytes(value), len(value))
        rc = self._lib.so.bpf_map_update_elem(self.fd, self._key(key), buf, flags)
        if rc < 0:
            err = _errno_of(rc)
            reason = reason_for_errno("update", err)
            raise BpfUnavailable(reason, f"map {self.name}: update failed: {os.strerror(err)}"
                                 + (" (map full)" if reason == MAP_FULL else ""))

    def delete(self, key: bytes) -> bool:
        """Delete `key`; False if it was absent."""
        self._obj._check_open()
        return self._lib.so.bpf_map_delete_elem(self.fd, self._key(key)) == 0


class RingBuffer:
    """A libbpf ring_buffer over one BPF_MAP_TYPE_RINGBUF map; poll from one thread."""

    def __init__(self, obj: "BpfObject", bpf_map: BpfMap, callback: Callable[[bytes], None]) -> None:
        self._lib, self.map_name, self._callback = obj._lib, bpf_map.name, callback
        self._cb = _SAMPLE_FN(self._on_sample)   # referenced for the ring buffer's lifetime
        self._lock = threading.Lock()
        self._ptr = self._lib.so.ring_buffer__new(bpf_map.fd, self._cb, None, None)
        if not self._ptr:
            err = _errno_of()
            raise BpfUnavailable(LOAD_FAILED, f"ring buffer on map {bpf_map.name}: {os.strerror(err)}")

    def _on_sample(self, _ctx, data, size) -> int:
        try:
            self._callback(ctypes.string_at(data, size))
        except Exception:  # a bad record or a callback bug must not unwind into libbpf
            log.exception("ring buffer %s: callback failed", self.map_name)
        return 0

    def poll(self, timeout_ms: int = 100) -> int:
        """Wait up to timeout_ms for records and deliver them; returns how many (or -errno)."""
        with self._lock:
            if self._ptr is None:
                return 0
            return self._lib.so.ring_buffer__poll(self._ptr, int(timeout_ms))

    def consume(self) -> int:
        """Deliver every record already in the ring, without waiting (records submitted with
        BPF_RB_NO_WAKEUP never wake poll); returns how many (or -errno)."""
        with self._lock:
            if self._ptr is None:
                return 0
            return self._lib.so.ring_buffer__consume(self._ptr)

    def close(self) -> None:
        with self._lock:
            if self._ptr is not None:
                self._lib.so.ring_buffer__free(self._ptr)
                self._ptr = None


class BpfObject:
    """A loaded BPF object file: its programs, maps, the links and ring buffers made from it."""

    def __init__(self, lib: _Lib, ptr: int, path: Path) -> None:
        self._lib, self._ptr, self.path = lib, ptr, path
        self._lock = threading.RLock()
        self._links: list[Link] = []
        self._rings: list[RingBuffer] = []
        self._maps: dict[str, BpfMap] = {}
        self.uprobe_multi = False      # uprobe programs loaded for uprobe_multi links

    @classmethod
    def load(cls, path: str | Path, skip_programs: tuple[str, ...] = (),
             map_sizes: dict[str, int] | None = None) -> "BpfObject":
        """Open and load `path`; programs named in skip_programs are not loaded; map_sizes
        (map name -> max_entries, bytes for a ring buffer) resizes maps before the load."""
        lib = library()
        path = Path(path)
        if not path.is_file():
            raise BpfUnavailable(OBJECT_MISSING, f"BPF object {path} does not exist (run `make -C exporter/bpf`)")
        with lib.capture_lock:
            lib.capture = []
            try:
                ptr = lib.so.bpf_object__open_file(str(path).encode(), None)
                if not ptr:
                    err = _errno_of()
                    raise BpfUnavailable(reason_for_errno("open", err),
                                         f"cannot open BPF object {path}: {os.strerror(err)}"
                                         + _tail(lib.capture))
                for name in skip_programs:
                    prog = lib.so.bpf_object__find_program_by_name(ptr, name.encode())
                    if prog:
                        lib.so.bpf_program__set_autoload(prog, False)
                multi = _prepare_uprobe_multi(lib, ptr)
                for name, entries in (map_sizes or {}).items():
                    found = lib.so.bpf_object__find_map_by_name(ptr, name.encode())
                    rc = lib.so.bpf_map__set_max_entries(found, entries) if found else -_errno.ENOENT
                    if rc < 0:
                        lib.so.bpf_object__close(ptr)
                        raise BpfUnavailable(BAD_OBJECT, f"{path.name}: cannot size map {name} to {entries}: "
                                             f"{os.strerror(-rc)}")
                rc = lib.so.bpf_object__load(ptr)
                if rc < 0:
                    err = _errno_of(rc)
                    lib.so.bpf_object__close(ptr)
                    raise BpfUnavailable(reason_for_errno("load", err),
                                         f"kernel refused {path.name}: {os.strerror(err)}" + _tail(lib.capture))
            finally:
                lib.capture = None
        loaded = cls(lib, ptr, path)
        loaded.uprobe_multi = multi
        return loaded

    def _check_open(self) -> None:
        if self._ptr is None:
            raise ValueError(f"BPF object {self.path} is closed")

    def _program(self, name: str) -> int:
        self._check_open()
        prog = self._lib.so.bpf_object__find_program_by_name(self._ptr, name.encode())
        if not prog:
            raise KeyError(f"{self.path.name} has no program {name!r}")
        return prog

    def attach(self, program_name: str) -> Link:
        """Attach by the program's SEC() (tracepoint/, tp_btf/, raw_tp/ ...)."""
        with self._lock:
            prog = self._program(program_name)
            ptr = self._lib.so.bpf_program__attach(prog)
            if not ptr:
                err = _errno_of()
                raise BpfUnavailable(reason_for_errno("attach", err),
                                     f"attach {program_name}: {os.strerror(err)}")
            link = Link(self._lib, ptr, program_name, "sec")
            self._links.append(link)
            return link

    def attach_uprobe(self, program_name: str, binary_path: str, symbol: str, pid: int = -1,
                      retprobe: bool = False) -> Link:
        """Attach a uprobe (or uretprobe) to `symbol` in `binary_path` for `pid` (-1: all)."""
        if self.uprobe_multi:
            try:
                real = _resolve_library(binary_path)
                offset = elfsym.symbol_file_offset(real, symbol)
            except (OSError, elfsym.ElfError) as exc:
                raise BpfUnavailable(ATTACH_FAILED, f"uprobe {program_name} on {binary_path}:{symbol}: {exc}") from None
            return self.attach_uprobe_at(program_name, str(real), offset, pid, retprobe, symbol)
        with self._lock:
            prog = self._program(program_name)
            opts = _UprobeOpts(sz=ctypes.sizeof(_UprobeOpts), retprobe=retprobe, func_name=symbol.encode())
            ptr = self._lib.so.bpf_program__attach_uprobe_opts(prog, pid, binary_path.encode(), 0,
                                                                ctypes.byref(opts))
            if not ptr:
                first_err = _errno_of()
                # libbpf could not resolve the name: compute the offset from .dynsym ourselves.
                try:
                    real = _resolve_library(binary_path)
                    offset = elfsym.symbol_file_offset(real, symbol)
                except (OSError, elfsym.ElfError) as exc:
                    raise BpfUnavailable(ATTACH_FAILED, f"uprobe {program_name} on {binary_path}:{symbol}: "
                                         f"{os.strerror(first_err)}; {exc}") from None
                return self.attach_uprobe_at(program_name, str(real), offset, pid, retprobe, symbol)
            link = Link(self._lib, ptr, program_name, f"{binary_path}:{symbol}")
            self._links.append(link)
            return link

    def attach_uprobe_at(self, program_name: str, binary_path: str, offset: int, pid: int = -1,
                         retprobe: bool = False, label: str = "") -> Link:
        """Attach a uprobe at a file offset of `binary_path` (see elfsym.symbol_file_offset)."""
        with self._lock:
            prog = self._program(program_name)
            if self.uprobe_multi:
                fd = _link_create_uprobe_multi(self._lib, self._lib.so.bpf_program__fd(prog), binary_path, offset,
                                               retprobe, pid)
                if fd < 0:
                    raise BpfUnavailable(reason_for_errno("attach", -fd), f"uprobe {program_name} on "
                                         f"{binary_path}:{label}+{offset:#x}: {os.strerror(-fd)}")
                link = FdLink(self._lib, fd, program_name, f"{binary_path}:{label or hex(offset)}")
                self._links.append(link)
                return link
            opts = _UprobeOpts(sz=ctypes.sizeof(_UprobeOpts), retprobe=retprobe, func_name=None)
            ptr = self._lib.so.bpf_program__attach_uprobe_opts(prog, pid, binary_path.encode(), offset,
                                                                ctypes.byref(opts))
            if not ptr:
                err = _errno_of()
                raise BpfUnavailable(reason_for_errno("attach", err),
                                     f"uprobe {program_name} on {binary_path}:{label}+{offset:#x}: {os.strerror(err)}")
            link = Link(self._lib, ptr, program_name, f"{binary_path}:{label or hex(offset)}")
            self._links.append(link)
            return link

    def map(self, name: str) -> BpfMap:
        with self._lock:
            self._check_open()
            if name not in self._maps:
                ptr = self._lib.so.bpf_object__find_map_by_name(self._ptr, name.encode())
                if not ptr:
                    raise KeyError(f"{self.path.name} has no map {name!r}")
                self._maps[name] = BpfMap(self, ptr)
            return self._maps[name]

    def ring_buffer(self, map_name: str, callback: Callable[[bytes], None]) -> RingBuffer:
        with self._lock:
            ring = RingBuffer(self, self.map(map_name), callback)
            self._rings.append(ring)
            return ring

    def program_stats(self) -> dict[str, tuple[int, int]]:
        """name -> (run_count, run_time_ns); both stay 0 unless bpf stats are enabled."""
        with self._lock:
            self._check_open()
            stats, prog = {}, None
            while True:
                prog = self._lib.so.bpf_object__next_program(self._ptr, prog)
                if not prog:
                    return stats
                fd = self._lib.so.bpf_program__fd(prog)
                if fd < 0:   # not loaded (autoload off)
                    continue
                info = ctypes.create_string_buffer(_PROG_INFO_SIZE)
                size = ctypes.c_uint32(_PROG_INFO_SIZE)
                if self._lib.so.bpf_obj_get_info_by_fd(fd, info, ctypes.byref(size)) < 0:
                    continue
                if size.value < _PROG_INFO_RUN_CNT + 8:
                    continue   # kernel older than 5.1: no run statistics
                run_time, run_cnt = struct.unpack_from("<QQ", info.raw, _PROG_INFO_RUN_TIME_NS)
                stats[self._lib.so.bpf_program__name(prog).decode()] = (run_cnt, run_time)

    def close(self) -> None:
        with self._lock:
            for ring in self._rings:
                ring.close()
            for link in self._links:
                link.destroy()
            self._rings, self._links, self._maps = [], [], {}
            if self._ptr is not None:
                self._lib.so.bpf_object__close(self._ptr)
                self._ptr = None

    def __enter__(self) -> "BpfObject":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StatsHandle:
    """Keeps kernel BPF run-time statistics on while open (BPF_ENABLE_STATS holds an fd)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def enable_bpf_stats() -> StatsHandle:
    """Turn on run_cnt/run_time_ns accounting for as long as the handle stays open.

    Costs ~20 ns per program run; this is what kernel.bpf_stats_enabled=1 does, but scoped
    to this process instead of a global sysctl someone has to remember to turn off.
    """
    lib = library()
    fd = lib.so.bpf_enable_stats(BPF_STATS_RUN_TIME)
    if fd < 0:
        err = _errno_of(fd)
        raise BpfUnavailable(reason_for_errno("load", err), f"BPF_ENABLE_STATS failed: {os.strerror(err)}")
    return StatsHandle(fd)


def bpf_stats_enabled(procfs: Path = Path("/proc")) -> bool:
    """Whether the kernel is accounting program run time now (sysctl or a held stats fd)."""
    try:
        return (procfs / "sys/kernel/bpf_stats_enabled").read_text().strip() == "1"
    except OSError:
        return False


def _tail(lines: list[str] | None, n: int = 12) -> str:
    if not lines:
        return ""
    return "\nlibbpf: " + "\nlibbpf: ".join(lines[-n:])


def _resolve_library(binary_path: str) -> Path:
    if "/" in binary_path:
        return Path(binary_path)
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu",
             "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib"]
    for d in dirs:
        candidate = Path(d) / binary_path
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"library {binary_path} not found in {':'.join(dirs)}")
