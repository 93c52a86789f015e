"""Sysfs attribute files kept open between scrapes and re-read with pread at offset 0.

Why: opening a counter file, checking it is a regular file, reading it and closing it is
four system calls and ~10 µs of Python per file per scrape, and an 8-HCA node has ~700
such files. sysfs regenerates an attribute's text on every read from offset 0, so one
pread on a descriptor opened once reads the current value.

Revalidation: each read lists the directory once (one getdents; the inode numbers come
with the names, no stat per file) and compares each entry's inode number with the one the
held descriptor was opened for. A file replaced under an open descriptor (a device removed
and re-added, a tree whose files are replaced by rename) has another inode and is opened
again; a file gone is closed and absent. The regular-file check of files.open_regular is
made on every descriptor when it is opened, so a FIFO or device node put in a file's place
is never read, held or not.

Descriptors held process-wide stay under half the open-file limit (RLIMIT_NOFILE): past
that, files are read the old way (open, read, close) rather than holding more.
"""
from __future__ import annotations

import errno
import os
import resource
import threading
from pathlib import Path

from .files import SMALL_FILE_BYTES, ReadProblem, as_text, open_regular, read_small_text, reason_for

# Held descriptors never use more than this share of the soft open-file limit: sockets,
# eBPF maps and the state file need the rest.
_LIMIT_SHARE = 0.5


class _Budget:
    """How many descriptors may still be held, process-wide."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = 0
        self._limit: int | None = None

    def take(self) -> bool:
        with self._lock:
            if self._limit is None:
                soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                self._limit = 1 << 16 if soft == resource.RLIM_INFINITY else int(soft * _LIMIT_SHARE)
            if self._held >= self._limit:
                return False
            self._held += 1
            return True

    def give_back(self, count: int = 1) -> None:
        with self._lock:
            self._held -= count

    @property
    def held(self) -> int:
        return self._held


BUDGET = _Budget()


class HeldDirectory:
    """The files of one sysfs directory (all of them, or the `names` given), held open.

    read() answers (name, text or ReadProblem) per file in name order, as
    files.read_small_texts does; a directory that cannot be listed (other than absent) is
    one ("", ReadProblem) entry for the directory itself. Not thread-safe: each owner reads
    under its own lock (collectors do)."""

    __slots__ = ("path", "names", "_held")

    def __init__(self, path: str, names: tuple[str, ...] | None = None) -> None:
        self.path = path
        self.names = names
        self._held: dict[str, tuple[int, int]] = {}     # name -> (descriptor, inode it was opened for)

    def read(self) -> list[tuple[str, str | ReadProblem]]:
        try:
            with os.scandir(self.path) as entries:
                listing = {entry.name: entry.inode() for entry in entries}
        except OSError as exc:
            self.close()
            if exc.errno != errno.ENOENT:
                return [("", ReadProblem(Path(self.path), reason_for(exc)))]
            listing = {}
        held = self._held
        for name in [name for name, (_, inode) in held.items() if listing.get(name) != inode]:
            os.close(held.pop(name)[0])       # gone or replaced: never read the stale file
            BUDGET.give_back()
        results: list[tuple[str, str | ReadProblem]] = []
        for name in self.names if self.names is not None else sorted(listing):
            entry = held.get(name)
            if entry is None:
                inode = listing.get(name)
                if inode is None:
                    results.append((name, ReadProblem(Path(self.path, name), "absent")))
                    continue
                entry = self._open(name, inode)
                if entry.__class__ is not tuple:          # a problem, or read without holding
                    results.append((name, entry))
                    continue
            try:
                raw = os.pread(entry[0], SMALL_FILE_BYTES + 1, 0)
                if len(raw) > SMALL_FILE_BYTES:
                    raw = "too_large"
            except OSError as exc:
                raw = reason_for(exc)
                os.close(held.pop(name)[0])    # opened again on the next read
                BUDGET.give_back()
            results.append((name, as_text(raw, name, self.path)))
        return results

    def _open(self, name: str, inode: int) -> tuple[int, int] | str | ReadProblem:
        path = os.path.join(self.path, name)
        if not BUDGET.take():
            return read_small_text(path)
        fd = open_regular(path)
        if fd.__class__ is str:
            BUDGET.give_back()
            return ReadProblem(Path(path), fd)
        self._held[name] = entry = (fd, inode)
        return entry

    def close(self) -> None:
        """Close every held descriptor (the directory's device is gone or replaced)."""
        for fd, _ in self._held.values():
            os.close(fd)
        BUDGET.give_back(len(self._held))
        self._held.clear()

    @property
    def held(self) -> int:
        return len(self._held)
