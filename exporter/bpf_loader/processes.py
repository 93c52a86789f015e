"""Which processes the syscalls program counts under their own name.

Bounded by construction: processes that made a GPU-driver ioctl (syscalls.bpf.c adds a
process to `tracked_tgids` at its first ioctl on a GPU character device, recognised by
the majors user space writes into `gpu_majors` from <procfs>/devices) plus a configured
allow-list of process names. Everything else is counted as "other".

User space never walks every process's open files: finding GPU processes that way read
one symlink per open fd of every process, ~9 µs each, every scan (a busy GPU node has tens
of thousands of fds). It only adds the allow-list (one `comm` read per process, and only
when there is an allow-list), removes processes that exited (one stat per tracked
process), and moves GPU processes that found the map full (`untracked_gpu_tgids`) in when
room frees up.
"""
from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path

log = logging.getLogger("fabricscope.ebpf")

GPU_MAJOR_SLOTS = 8   # matches syscalls.bpf.c


def parse_char_majors(text: str, name_prefixes: tuple[str, ...] = ("nvidia",)) -> list[int]:
    """Majors of the character devices whose driver name starts with a prefix (/proc/devices)."""
    majors, in_char = [], False
    for line in text.splitlines():
        line = line.strip()
        if line.endswith(":"):
            in_char = line == "Character devices:"
            continue
        if not in_char or not line:
            continue
        parts = line.split(None, 1)
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if parts[1].startswith(name_prefixes):
            majors.append(int(parts[0]))
    return sorted(set(majors))


def scan_named_processes(procfs: Path, allow_comms: frozenset[str]) -> dict[int, str]:
    """tgid -> comm of every process whose name is in allow_comms."""
    found: dict[int, str] = {}
    if not allow_comms:
        return found
    try:
        entries = os.listdir(procfs)
    except OSError as exc:
        log.warning("cannot list %s: %s", procfs, exc)
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            comm = (procfs / entry / "comm").read_text().rstrip("\n")
        except OSError:
            continue
        if comm in allow_comms:
            found[int(entry)] = comm
    return found


class ProcessTracker:
    """Keeps the kernel's tracked_tgids and gpu_majors maps in step with the host."""

    def __init__(self, procfs: Path, allow_comms: frozenset[str], explicit_majors: list[int] | None,
                 interval_seconds: float) -> None:
        self.procfs = procfs
        self.allow_comms = allow_comms
        self.explicit_majors = explicit_majors
        self.interval = interval_seconds
        self._last_sync = float("-inf")
        # Processes that should be counted by name but found no room in the kernel's
        # tracked_tgids map on the last sync (they count under "other" instead).
        self.untracked = 0

    def majors(self) -> list[int]:
        if self.explicit_majors is not None:
            return list(self.explicit_majors)[:GPU_MAJOR_SLOTS]
        try:
            return parse_char_majors((self.procfs / "devices").read_text())[:GPU_MAJOR_SLOTS]
        except OSError:
            return []

    def request_rescan(self) -> None:
        """Make the next sync() run whatever the interval says."""
        self._last_sync = float("-inf")

    def _alive(self, tgid: int) -> bool:
        return (self.procfs / str(tgid)).exists()

    def sync(self, tracked_map, majors_map, untracked_map=None) -> None:
        now = time.monotonic()
        if now - self._last_sync < self.interval:
            return
        self._last_sync = now
        majors = self.majors()
        for slot in range(GPU_MAJOR_SLOTS):
            value = majors[slot] if slot < len(majors) else 0
            majors_map.update(struct.pack("<I", slot), struct.pack("<I", value))
        tracked = set()
        for key in list(tracked_map.keys()):
            tgid = struct.unpack("<I", key)[0]
            if self._alive(tgid):
                tracked.add(tgid)
            else:
                tracked_map.delete(key)
        waiting = set(scan_named_processes(self.procfs, self.allow_comms))
        if untracked_map is not None:           # GPU processes the kernel had no room for
            for key in list(untracked_map.keys()):
                tgid = struct.unpack("<I", key)[0]
                if self._alive(tgid) and tgid not in tracked:
                    waiting.add(tgid)
                else:
                    untracked_map.delete(key)
        waiting -= tracked
        room = max(0, tracked_map.max_entries - len(tracked))
        for tgid in sorted(waiting)[:room]:
            try:
                tracked_map.update(struct.pack("<I", tgid), struct.pack("<I", 1))
            except Exception as exc:  # noqa: BLE001 - map full (the kernel added one meanwhile) or closed
                log.warning("cannot track process %d: %s", tgid, exc)
                continue
            waiting.discard(tgid)
            if untracked_map is not None:
                untracked_map.delete(struct.pack("<I", tgid))
        untracked = len(waiting)
        if untracked and untracked != self.untracked:
            log.warning("%d processes of interest do not fit the tracked-process map (%d entries); "
                        "their syscalls count under comm=\"other\"", untracked, tracked_map.max_entries)
        self.untracked = untracked
