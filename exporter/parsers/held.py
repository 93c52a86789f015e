"""Sysfs attribute files kept open between scrapes and re-read with pread at offset 0.

Why: opening a counter file, checking it is a regular file, reading it and closing it is
four system calls and ~10 µs of Python per file per scrape, and an 8-HCA node has ~700
such files. sysfs regenerates an attribute's text on every read from offset 0, so one
pread on a descriptor opened once reads the current value.

Revalidation: a directory is listed (one getdents; the inode numbers come with the names,
no stat per file) whenever its mtime moved, and each entry's inode number is compared with
the one the held descriptor was opened for. A file replaced under an open descriptor (a
device removed and re-added, a tree whose files are replaced by rename) has another inode
and is opened again; a file gone is closed and absent. Otherwise a read costs one stat of
the directory and one pread per file. The regular-file check of files.open_regular is
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
import time
from pathlib import Path
from typing import Callable

from .files import SMALL_FILE_BYTES, ReadProblem, as_text, open_regular, read_small_text, reason_for

# Held descriptors never use more than this share of the soft open-file limit: sockets,
# eBPF maps and the state file need the rest.
_LIMIT_SHARE = 0.5
# A directory changed less than this long ago is listed on every read (see _list).
RACY_NS = 2_000_000_000


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


def raise_open_file_limit() -> None:
    """The soft open-file limit raised to the hard one, as every Go program (node_exporter
    included) does at start: a service's usual soft limit of 1,024 would hold only about
    half of an 8-HCA node's ~1,000 counter files open. Called once, before any is held."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, 1 << 20) if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass   # kept as it was: the budget follows whatever the limit is


class HeldDirectory:
    """The files of one sysfs directory (all of them, those `wanted` says yes to, or the
    `names` given), held open.

    read() answers (name, text or ReadProblem) per file in name order; a directory that
    cannot be listed (other than absent) is one ("", ReadProblem) entry for the directory
    itself. Not thread-safe: each owner reads
    under its own lock (collectors do)."""

    __slots__ = ("path", "names", "wanted", "absent", "unchanged", "_held", "_listing", "_stamp", "_parsed",
                 "_plan")

    def __init__(self, path: str, names: tuple[str, ...] | None = None,
                 wanted: Callable[[str], bool] | None = None) -> None:
        self.path = path
        self.names = names
        self.wanted = wanted
        self.absent = False           # the last read found no such directory
        # The last read listed the same files as the one before and read each the same
        # bytes: its owner may serve what it built from them then (infiniband's ports).
        self.unchanged = False
        self._held: dict[str, tuple[int, int]] = {}     # name -> (descriptor, inode it was opened for)
        self._listing: dict[str, int] = {}              # name -> inode, as last listed
        self._stamp: tuple[int, int] | None = None      # (inode, mtime) of the directory then
        self._parsed: dict[str, tuple[bytes, object]] = {}   # name -> (bytes read, what they parsed to)
        # While the listing stands and every file is held: per file, in order, [descriptor,
        # bytes last read, (name, answer)], so a read is a pread and a comparison per file
        # (the lookups by name were a third of reading a port's counters).
        self._plan: list[list] | None = None

    def read(self, parse: Callable[[str, str, str], object] | None = None) -> list[tuple[str, object]]:
        """With `parse`, each file's text is answered as parse(text, directory, name) (a value
        or a ReadProblem). Most counters do not move between scrapes: a file that reads the
        same bytes as last time gets last time's answer without being decoded or parsed."""
        listed_before = self._listing
        self.unchanged = False
        try:
            listing = self._list()
            self.absent = False
        except OSError as exc:
            self.close()
            self.absent = exc.errno == errno.ENOENT
            if not self.absent:
                return [("", ReadProblem(Path(self.path), reason_for(exc)))]
            listing = {}
        if listing is listed_before and self._plan is not None:
            results = self._read_planned(parse)
            if results is not None:
                return results
        self._plan = None
        held, parsed = self._held, self._parsed
        results: list[tuple[str, object]] = []
        same = listing is listed_before and bool(listing)
        plannable = bool(listing)
        for name in self.names if self.names is not None else listing:
            entry = held.get(name)
            if entry is None:
                same = False
                inode = listing.get(name)
                if inode is None:
                    plannable = False
                    results.append((name, ReadProblem(Path(self.path, name), "absent")))
                    continue
                entry = self._open(name, inode)
                if entry.__class__ is not tuple:          # a problem, or read without holding
                    plannable = False
                    if parse is not None and entry.__class__ is str:
                        entry = parse(entry, self.path, name)
                    results.append((name, entry))
                    continue
            try:
                raw = os.pread(entry[0], SMALL_FILE_BYTES + 1, 0)
            except OSError as exc:
                os.close(held.pop(name)[0])    # opened again on the next read
                BUDGET.give_back()
                results.append((name, ReadProblem(Path(self.path, name), reason_for(exc))))
                same = plannable = False
                continue
            memo = parsed.get(name)
            if memo is not None and memo[0] == raw:
                results.append((name, memo[1]))
                continue
            same = False
            answer = self._answer(name, raw, parse)
            results.append((name, answer))
        self.unchanged = same
        if plannable:
            self._plan = [[held[name][0], parsed[name][0], (name, answer)] for name, answer in results]
        return results

    def _read_planned(self, parse: Callable[[str, str, str], object] | None) -> list[tuple[str, object]] | None:
        """read() while the listing stands and every file is held; None when a read fails
        (read() then goes the long way, which reports it)."""
        results = []
        same = True
        pread, size = os.pread, SMALL_FILE_BYTES + 1
        for slot in self._plan:
            try:
                raw = pread(slot[0], size, 0)
            except OSError:
                return None
            if raw != slot[1]:
                same = False
                name = slot[2][0]
                slot[1], slot[2] = raw, (name, self._answer(name, raw, parse))
            results.append(slot[2])
        self.unchanged = same
        return results

    def _answer(self, name: str, raw: bytes, parse: Callable[[str, str, str], object] | None) -> object:
        """What bytes a file read anew say (its text, or parse's answer), remembered for
        the next read of the same bytes."""
        text = as_text(raw if len(raw) <= SMALL_FILE_BYTES else "too_large", name, self.path)
        answer = text if parse is None or text.__class__ is ReadProblem else parse(text, self.path, name)
        self._parsed[name] = (raw, answer)
        return answer

    def _list(self) -> dict[str, int]:
        """name -> inode of the directory's entries, listed again only when they may have
        changed: adding, removing or replacing an entry changes the directory's mtime. An
        mtime close to now is listed again on every read (as git treats a "racily clean"
        index entry): the filesystem clock is coarse, so a change in the same tick as the
        last listing would keep the mtime it had. sysfs directories keep the mtime of their
        creation, so there each read costs one stat."""
        stat = os.stat(self.path)
        stamp = (stat.st_ino, stat.st_mtime_ns)
        if stamp == self._stamp:
            return self._listing
        wanted = self.wanted
        with os.scandir(self.path) as entries:
            listing = {entry.name: entry.inode() for entry in entries if wanted is None or wanted(entry.name)}
        held = self._held
        for name in [name for name, (_, inode) in held.items() if listing.get(name) != inode]:
            os.close(held.pop(name)[0])       # gone or replaced: never read the stale file
            BUDGET.give_back()
        self._listing = dict(sorted(listing.items()))
        for name in [name for name in self._parsed if name not in listing]:
            del self._parsed[name]
        self._stamp = stamp if time.time_ns() - stat.st_mtime_ns > RACY_NS else None
        return self._listing

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

    def __del__(self) -> None:
        # Owners close what they hold; this is for one dropped without (as a file object
        # does). At interpreter exit the modules it needs may already be gone: nothing to do.
        try:
            if self._held:
                self.close()
        except Exception:  # noqa: BLE001 - a finaliser must never raise
            pass

    def close(self) -> None:
        """Close every held descriptor (the directory's device is gone or replaced)."""
        for fd, _ in self._held.values():
            os.close(fd)
        BUDGET.give_back(len(self._held))
        self._held.clear()
        self._listing, self._stamp = {}, None
        self._parsed.clear()
        self._plan = None

    @property
    def held(self) -> int:
        return len(self._held)
