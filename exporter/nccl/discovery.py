"""Find the NCCL library each process maps, and the functions a library exports.

Pure readers over an injected procfs root. A process that exits while we read it, or
whose maps we may not read, is skipped, never an error.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..ebpf.elfsym import SHT_DYNSYM, open_elf

# libnccl.so, libnccl.so.2, libnccl.so.2.21.5
NCCL_LIBRARY = re.compile(r"/libnccl\.so(\.\d+)*$")
# PyTorch builds that link NCCL statically carry it inside libtorch_cuda.so.
STATIC_FALLBACK = re.compile(r"/libtorch_cuda\.so$")
PROBE_SYMBOL = "ncclAllReduce"


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
        return frozenset(name.decode(errors="replace") for name, _ in elf.defined_functions(SHT_DYNSYM))
