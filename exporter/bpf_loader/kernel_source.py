"""The real MapSource: BPF objects loaded into this kernel.

Startup does the expensive work once (preflight, tracefs, load, attach); a scrape only
reads maps. Any failure becomes a bounded reason plus one log line: the objects that
did load keep serving, and when none did the collector reports the first reason.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from pathlib import Path

from . import reasons
from .declarations import ObjectDecl
from .objects import object_path
from .processes import ProcessTracker
from .reasons import BpfUnavailable
from .tracefs import ensure_tracefs

log = logging.getLogger("fabricscope.ebpf")


class KernelMapSource:
    def __init__(self, decls: list[ObjectDecl], object_dir: Path | None, sysfs: Path, procfs: Path,
                 tracker: ProcessTracker | None, enable_stats: bool = True,
                 tcp_namespaces: tuple[str, ...] = ()) -> None:
        self.decls = decls
        self.tcp_namespaces = tcp_namespaces
        self.object_dir = object_dir
        self.sysfs = sysfs
        self.procfs = procfs
        self.tracker = tracker
        self._objects: dict[str, object] = {}           # object name -> BpfObject
        self._attached: dict[str, bool] = {p: False for d in decls for p in d.programs}
        self._detached: dict[str, tuple[str, str]] = {}   # program -> (reason, message) it did not attach
        self._stats = None
        self._lock = threading.Lock()
        self._reason, self._message = reasons.DISABLED, "not started"
        self._start(enable_stats)

    def _start(self, enable_stats: bool) -> None:
        problem = reasons.preflight(self.sysfs)
        if problem:
            self._reason, self._message = problem
            return
        try:
            from .libbpf import library
            library()
        except BpfUnavailable as exc:
            self._reason, self._message = exc.reason, exc.message
            return
        tracefs_ok, tracefs_message = None, ""
        problems: dict[str, tuple[str, str]] = {}   # object -> (reason, message), the last one wins
        for decl in self.decls:
            skip: tuple[str, ...] = ()
            if decl.tracefs_programs:
                if tracefs_ok is None:
                    tracefs_ok, tracefs_message = ensure_tracefs()
                    log.log(logging.INFO if tracefs_ok else logging.ERROR, "%s", tracefs_message)
                if not tracefs_ok:
                    # The object's tp_btf/raw_tp programs still run; these stay unattached.
                    skip = decl.tracefs_programs
                    problems[decl.object] = (reasons.NO_TRACEFS, tracefs_message)
                    self._detach(skip, reasons.NO_TRACEFS, tracefs_message)
            if set(skip) == set(decl.programs):
                continue
            try:
                self._objects[decl.object] = self._load(decl, skip)
            except BpfUnavailable as exc:
                problems[decl.object] = (exc.reason, exc.message)
                self._detach(decl.programs, exc.reason, exc.message)
                log.error("eBPF object %s unavailable (%s): %s", decl.object, exc.reason, exc.message)
        if self._objects and not self._detached:
            self._reason, self._message = reasons.OK, ""
        elif self._objects:
            # Partly attached: the loaded programs serve, but "ok" would hide the rest.
            program, (reason, message) = next(iter(self._detached.items()))
            self._reason = reason
            self._message = (f"{len(self._detached)} of {len(self._attached)} declared programs not attached "
                             f"({', '.join(self._detached)}); {program}: {message}")
        elif problems:
            self._reason, self._message = next(iter(problems.values()))
        else:
            self._reason, self._message = reasons.OBJECT_MISSING, "no BPF program declarations found"
        if self._objects and enable_stats:
            from .libbpf import enable_bpf_stats
            try:
                self._stats = enable_bpf_stats()
            except BpfUnavailable as exc:
                log.warning("BPF run-time statistics unavailable: %s", exc)
        elif self._objects:
            log.info("BPF run-time statistics off (ebpf.enable_stats: true turns them on; "
                     "they cost two clock reads per program run)")

    def _load(self, decl: ObjectDecl, skip: tuple[str, ...] = ()):
        from .libbpf import BpfObject
        obj = BpfObject.load(object_path(decl.object, self.object_dir), skip_programs=skip)
        if decl.object == "tcp" and self.tcp_namespaces:
            try:   # before attaching: never a moment of counting every namespace
                watch_namespaces(obj, self.tcp_namespaces)
            except BpfUnavailable:
                obj.close()
                raise
        failures = []
        for program in decl.programs:
            if program in skip:
                continue
            try:
                obj.attach(program)
                self._attached[program] = True
            except (BpfUnavailable, KeyError) as exc:
                failures.append(exc)
                self._detach((program,), getattr(exc, "reason", reasons.ATTACH_FAILED), str(exc))
                log.error("eBPF program %s.%s not attached: %s", decl.object, program, exc)
        if failures and not any(self._attached[p] for p in decl.programs if p not in skip):
            obj.close()
            first = failures[0]
            raise first if isinstance(first, BpfUnavailable) else BpfUnavailable(reasons.ATTACH_FAILED, str(first))
        return obj

    def _detach(self, programs, reason: str, message: str) -> None:
        for program in programs:
            self._detached.setdefault(program, (reason, message))

    def availability(self) -> tuple[str, str]:
        return self._reason, self._message

    def programs(self) -> dict[str, bool]:
        return dict(self._attached)

    def program_stats(self) -> dict[str, tuple[int, int]] | None:
        if self._stats is None:
            from .libbpf import bpf_stats_enabled
            if not bpf_stats_enabled(self.procfs):
                return None
        stats: dict[str, tuple[int, int]] = {}
        with self._lock:
            for obj in self._objects.values():
                stats.update(obj.program_stats())
        return stats

    def read_map(self, obj: str, map_name: str) -> list[tuple[bytes, bytes]]:
        with self._lock:
            loaded = self._objects.get(obj)
            if loaded is None:
                raise KeyError(obj)
            return loaded.map(map_name).items()

    def peers(self) -> dict[str, str]:
        return {}

    def untracked_processes(self) -> int:
        return self.tracker.untracked if self.tracker is not None else 0

    def refresh(self) -> None:
        syscalls = self._objects.get("syscalls")
        if syscalls is None or self.tracker is None:
            return
        try:
            self.tracker.sync(syscalls.map("tracked_tgids"), syscalls.map("gpu_majors"),
                              syscalls.map("untracked_gpu_tgids"))
        except Exception:   # tracking is best effort; the counters keep counting as "other"
            log.exception("syncing tracked processes failed")

    def close(self) -> None:
        with self._lock:
            for obj in self._objects.values():
                obj.close()
            self._objects.clear()
            self._attached = {p: False for p in self._attached}
            if self._stats is not None:
                self._stats.close()
                self._stats = None


def watch_namespaces(tcp, paths: tuple[str, ...]) -> None:
    """Make the tcp object count only sockets of these network namespaces: their inode
    numbers (a namespace file's inode is the namespace's id) into tcp_netns_watched, then
    the filter on. A namespace that went away since the config was checked is an error."""
    watched = tcp.map("tcp_netns_watched")
    for path in paths:
        try:
            inode = os.stat(path).st_ino
        except OSError as exc:
            raise BpfUnavailable(reasons.LOAD_FAILED, f"network namespace {path}: {exc.strerror}") from None
        watched.update(struct.pack("<I", inode), b"\x01")
    tcp.map("tcp_netns_filter").update(struct.pack("<I", 0), struct.pack("<I", 1))
    log.info("eBPF tcp: counting the sockets of %d network namespaces only", len(paths))
