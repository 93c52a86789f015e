"""Which processes the syscalls program counts under their own name.

Bounded by construction: processes that hold a GPU device open (a /dev/nvidia* fd, found
by scanning <procfs>/*/fd) plus a configured allow-list of process names. Everything
else is counted as "other". The GPU driver's character-device majors come from
<procfs>/devices, so the kernel program can recognise a GPU ioctl by its fd.
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


def _holds_device(fd_dir: Path, device_prefix: str) -> bool:
    try:
        fds = os.listdir(fd_dir)
    except OSError:   # process gone, or not ours to look at
        return False
    for fd in fds:
        try:
            if os.readlink(fd_dir / fd).startswith(device_prefix):
                return True
        except OSError:
            continue
    return False


def scan_tracked_processes(procfs: Path, device_prefix: str = "/dev/nvidia",
                           allow_comms: frozenset[str] = frozenset()) -> dict[int, str]:
    """tgid -> comm of every process holding a `device_prefix`* fd or named in allow_comms."""
    found: dict[int, str] = {}
    try:
        entries = os.listdir(procfs)
    except OSError as exc:
        log.warning("cannot list %s: %s", procfs, exc)
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        pid_dir = procfs / entry
        try:
            comm = (pid_dir / "comm").read_text().rstrip("\n")
        except OSError:
            continue
        if comm in allow_comms or (device_prefix and _holds_device(pid_dir / "fd", device_prefix)):
            found[int(entry)] = comm
    return found


class ProcessTracker:
    """Keeps the kernel's tracked_tgids and gpu_majors maps in step with the host."""

    def __init__(self, procfs: Path, device_prefix: str, allow_comms: frozenset[str],
                 explicit_majors: list[int] | None, interval_seconds: float) -> None:
        self.procfs = procfs
        self.device_prefix = device_prefix
        self.allow_comms = allow_comms
        self.explicit_majors = explicit_majors
        self.interval = interval_seconds
        self._tracked: set[int] = set()
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
        """Make the next sync() scan procfs whatever the interval says."""
        self._last_sync = float("-inf")

    def sync(self, tracked_map, majors_map) -> None:
        now = time.monotonic()
        if now - self._last_sync < self.interval:
            return
        self._last_sync = now
        majors = self.majors()
        for slot in range(GPU_MAJOR_SLOTS):
            value = majors[slot] if slot < len(majors) else 0
            majors_map.update(struct.pack("<I", slot), struct.pack("<I", value))
        wanted = set(scan_tracked_processes(self.procfs, self.device_prefix, self.allow_comms))
        for tgid in self._tracked - wanted:
            tracked_map.delete(struct.pack("<I", tgid))
        kept = self._tracked & wanted
        room = max(0, tracked_map.max_entries - len(kept))
        added = set()
        for tgid in sorted(wanted - self._tracked)[:room]:
            try:
                tracked_map.update(struct.pack("<I", tgid), struct.pack("<I", 1))
            except Exception as exc:   # map full or closed: count it, keep the rest
                log.warning("cannot track process %d: %s", tgid, exc)
                continue
            added.add(tgid)
        self._tracked = kept | added
        untracked = len(wanted - self._tracked)
        if untracked and untracked != self.untracked:
            log.warning("%d processes of interest do not fit the tracked-process map (%d entries); "
                        "their syscalls count under comm=\"other\"", untracked, tracked_map.max_entries)
        self.untracked = untracked
