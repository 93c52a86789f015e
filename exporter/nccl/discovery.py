"""Find the NCCL library each process maps, and the functions a library exports.

Pure readers over an injected procfs root. A process that exits while we read it, or
whose maps we may not read, is skipped, never an error.

ProcessWatch decides *which* processes to read: uprobes attach per library file, so only
a process that may have just mapped a new library file needs a look, and it can only
have done so by exec or dlopen (exporter/bpf/procwatch.bpf.c reports both). Reading
every process's maps every few seconds cost more than the rest of the exporter together
on a node of a few hundred processes (docs/cost.md).
"""
from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from ..bpf_loader.elfsym import SHT_DYNSYM, open_elf

# libnccl.so, libnccl.so.2, libnccl.so.2.21.5
NCCL_LIBRARY = re.compile(r"/libnccl\.so(\.\d+)*$")
# PyTorch builds that link NCCL statically carry it inside libtorch_cuda.so.
STATIC_FALLBACK = re.compile(r"/libtorch_cuda\.so$")
PROBE_SYMBOL = "ncclAllReduce"


# The initial PID namespace's inode number (the kernel's PROC_PID_INIT_INO).
INITIAL_PIDNS_INUM = 0xEFFFFFFC


def pid_namespace(procfs: Path) -> int:
    """Inode number of the PID namespace `procfs` shows (that of its pid 1), 0 for the
    initial namespace or when it cannot be read: the BPF programs then see every process
    with its global ids. Otherwise they see, with the ids this procfs uses, only the
    processes it shows, as a pod's containers sharing its PID namespace see its own
    (exporter/bpf/fabric.h, scoped_pid_tgid)."""
    try:
        inum = os.stat(Path(procfs) / "1" / "ns" / "pid").st_ino
    except OSError:
        return 0
    return 0 if inum == INITIAL_PIDNS_INUM else inum


@dataclass(frozen=True)
class LibraryRef:
    path: str          # as the process sees it (its mount namespace)
    host_path: str     # reachable from here: <procfs>/<pid>/root/<path>
    dev: int
    inode: int


def mapped_files(maps_text: str) -> list[str]:
    """Paths of the file-backed mappings in a /proc/<pid>/maps text, in order, unique."""
    seen: dict[str, None] = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.startswith("/") and not path.endswith(" (deleted)"):
            seen.setdefault(path, None)
    return list(seen)


# Substrings a maps text must contain to be worth parsing: most processes map neither,
# and parsing 30-40 KB of maps per process dominated the Python side of a scan.
_WORTH_PARSING = ("libnccl.so", "libtorch_cuda.so")


def may_map_nccl(maps_text: str) -> bool:
    return any(needle in maps_text for needle in _WORTH_PARSING)


def nccl_candidates(paths: list[str]) -> tuple[list[str], list[str]]:
    """(libnccl paths, static-fallback paths) among a process's mapped files."""
    return ([p for p in paths if NCCL_LIBRARY.search(p)], [p for p in paths if STATIC_FALLBACK.search(p)])


def process_ids(procfs: Path) -> list[int]:
    try:
        return sorted(int(entry.name) for entry in os.scandir(procfs) if entry.name.isdigit())
    except OSError:
        return []


def read_maps(procfs: Path, pid: int) -> str | None:
    try:
        return (procfs / str(pid) / "maps").read_text(errors="replace")
    except OSError:          # exited, or not ours to read
        return None


def resolve(procfs: Path, pid: int, path: str) -> LibraryRef | None:
    host_path = str(procfs / str(pid) / "root" / path.lstrip("/"))
    try:
        st = os.stat(host_path)
    except OSError:
        return None
    return LibraryRef(path=path, host_path=host_path, dev=st.st_dev, inode=st.st_ino)


_symbol_cache: dict[tuple[int, int, int], frozenset[str]] = {}


def exported_functions(path: str) -> frozenset[str]:
    """Names of the defined functions in the ELF's .dynsym (cached by file identity).
    Raises OSError, or ValueError when the file is not ELF64."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, int(st.st_mtime))
    if key not in _symbol_cache:
        if len(_symbol_cache) > 64:
            _symbol_cache.clear()
        _symbol_cache[key] = _read_dynsym(path)
    return _symbol_cache[key]


def _read_dynsym(path: str) -> frozenset[str]:
    with open_elf(path) as elf:
        return frozenset(name.decode(errors="replace") for name, _, _ in elf.defined_functions(SHT_DYNSYM))


# struct procwatch_event in exporter/bpf/procwatch.bpf.c
PROC_EVENT = struct.Struct("<II")
PROC_EXEC, PROC_DLOPEN = 1, 2


class ProcessWatch:
    """Exec and dlopen hints in, a bounded, coalesced list of processes to look at out.

    - exec: the new image's DT_NEEDED libraries are mapped by ld.so right after; look after
      `exec_delays` (twice: a loaded machine may start slowly);
    - dlopen: a Python import loads hundreds of extension modules in a burst; one look
      `dlopen_delay` after the burst, at most one per process every `min_gap` seconds;
    - a process first seen in NCCL events (a fork that never exec'd) is hinted by the caller.
    More than `max_pending` processes waiting means hints are being lost: `overflowed` asks
    the caller for a full rescan instead.
    """

    def __init__(self, exec_delays: tuple[float, ...] = (0.3, 3.0), dlopen_delay: float = 0.2,
                 min_gap: float = 1.0, max_pending: int = 4096, clock=time.monotonic) -> None:
        self.exec_delays = exec_delays
        self.dlopen_delay = dlopen_delay
        self.min_gap = min_gap
        self.max_pending = max_pending
        self.clock = clock
        self._due: dict[int, list[float]] = {}      # pid -> times a look is due
        self._last_look: dict[int, float] = {}
        self.overflowed = False
        self.hints = 0
        self.invalid = 0

    def handle_raw(self, raw: bytes) -> None:
        """Ring-buffer callback: one struct procwatch_event."""
        if len(raw) < PROC_EVENT.size:
            self.invalid += 1
            return
        pid, kind = PROC_EVENT.unpack_from(raw)
        self.hint(pid, kind)

    def hint(self, pid: int, kind: int) -> None:
        self.hints += 1
        now = self.clock()
        if kind == PROC_EXEC:
            self._last_look.pop(pid, None)            # a new image: nothing looked at holds
            self._schedule(pid, [now + delay for delay in self.exec_delays], replace=True)
        elif kind == PROC_DLOPEN:
            after = max(now + self.dlopen_delay, self._last_look.get(pid, float("-inf")) + self.min_gap)
            self._schedule(pid, [after], replace=False)
        else:
            self.invalid += 1

    def _schedule(self, pid: int, times: list[float], replace: bool) -> None:
        if pid not in self._due and len(self._due) >= self.max_pending:
            self.overflowed = True
            return
        pending = self._due.setdefault(pid, [])
        if replace:
            pending[:] = times
        elif not pending:                             # a look already pending covers this hint
            pending.extend(times)

    def due(self) -> list[int]:
        """Processes whose look is due now (each removed from the queue up to its next time)."""
        now = self.clock()
        out = []
        for pid, times in list(self._due.items()):
            if times and times[0] <= now:
                out.append(pid)
                while times and times[0] <= now:
                    times.pop(0)
                self._last_look[pid] = now
            if not times:
                del self._due[pid]
        if len(self._last_look) > 4 * self.max_pending:   # forget old processes; bounded memory
            cutoff = now - 10 * self.min_gap
            self._last_look = {pid: t for pid, t in self._last_look.items() if t >= cutoff}
        return sorted(out)

    def pending(self) -> int:
        return len(self._due)

    def reset(self) -> None:
        """After a full rescan: everything queued has just been looked at."""
        self._due.clear()
        self.overflowed = False


def libc_paths(procfs: Path, pid: int | str = "self") -> list[str]:
    """The C libraries (libc.so.6, and libdl.so.2 where dlopen still lives there) a process maps."""
    try:
        maps = (procfs / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        return []
    return [path for path in mapped_files(maps) if re.search(r"/lib(c|dl)\.so\.\d+$", path)]
