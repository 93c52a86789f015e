"""Caps glibc's malloc arenas for the exporter process.

glibc gives a thread its own malloc arena at its first allocation, up to 8 arenas per core
(512 on a 64-core GPU host). Every arena keeps the memory its threads freed for reuse, so
the exporter's threads (collectors' readers, one NVML sampler per GPU, the HTTP workers)
each pin a few hundred KB to a few MB of anonymous memory that grows with the host's core
count, not with the work. The threads mostly wait; two arenas serve them.

The cap must be set before the threads first allocate: `fabricscope exporter` calls
cap_malloc_arenas() first thing. MALLOC_ARENA_MAX in the environment (glibc reads it
itself) wins over the cap. Non-glibc C libraries (musl has no per-thread arenas) are left
alone.

return_free_heap() (malloc_trim) gives back to the kernel the heap pages that start-up
used and freed (parsing BTF and BPF objects, building collectors): glibc otherwise keeps
them for reuse, resident, for the life of the process.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger("fabricscope.exporter")

M_ARENA_MAX = -8            # malloc.h
DEFAULT_ARENAS = 2


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        # Only glibc has gnu_get_libc_version; elsewhere mallopt may not know M_ARENA_MAX.
        libc.gnu_get_libc_version
        return libc
    except (OSError, AttributeError):
        return None


def cap_malloc_arenas(limit: int = DEFAULT_ARENAS) -> bool:
    """mallopt(M_ARENA_MAX, limit) where the C library is glibc; True if it took effect."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False                               # the operator's setting stands
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = mallopt(M_ARENA_MAX, limit) == 1
    if not applied:
        log.debug("mallopt(M_ARENA_MAX, %d) refused", limit)
    return applied


def return_free_heap() -> bool:
    """malloc_trim(0) where the C library is glibc: free pages of every arena go back to
    the kernel. True if some memory was released."""
    libc = _glibc()
    if libc is None:
        return False
    malloc_trim = libc.malloc_trim
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return malloc_trim(0) == 1
