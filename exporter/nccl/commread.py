"""A running communicator's identity, read from its ncclComm in the rank's memory.

The uprobes hand over every collective's ncclComm_t; with the library's layout
(commlayout.py) the hash, rank, size and CUDA device are 20 bytes at a known offset from
it, read through <procfs>/<pid>/mem (root, or CAP_SYS_PTRACE in a container). The job
is neither stopped nor changed: a read of another process's memory does neither.

The values are checked before they name anything: a stale pointer (a comm destroyed
between the call and the read) or a layout that does not fit shows as a hash of 0 or a
rank outside its size, and is refused with a reason, never exported.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .commlayout import CommLayout

# NCCL's own bound on a communicator's size is far below this; anything above is not a size.
MAX_RANKS = 1 << 22
MAX_CUDA_DEVICES = 1024


class CommUnreadable(ValueError):
    """No identity from this comm; `reason` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CommFields:
    comm_hash: int
    rank: int
    nranks: int
    cuda_dev: int
    # Where the library keeps the comm's operation counter (commlayout.Counter), or why not.
    counter: object = None
    counter_reason: str = ""


def decode_comm_fields(raw: bytes) -> CommFields:
    """commHash, rank, nRanks, cudaDev as laid out in struct ncclComm; refused unless they
    can be a communicator's."""
    if len(raw) < CommLayout.SPAN.size:
        raise CommUnreadable("short_read", f"{len(raw)} bytes of ncclComm, expected {CommLayout.SPAN.size}")
    fields = CommFields(*CommLayout.SPAN.unpack_from(raw))
    if fields.comm_hash == 0:
        raise CommUnreadable("implausible_fields", "commHash is 0: not an initialised communicator")
    if not 0 < fields.nranks <= MAX_RANKS or not 0 <= fields.rank < fields.nranks:
        raise CommUnreadable("implausible_fields", f"rank {fields.rank} of {fields.nranks} is not a rank")
    if not 0 <= fields.cuda_dev < MAX_CUDA_DEVICES:
        raise CommUnreadable("implausible_fields", f"cudaDev {fields.cuda_dev} is not a device")
    return fields


def read_comm(procfs: Path, pid: int, pointer: int, layout: CommLayout) -> CommFields:
    """The fields of the ncclComm at `pointer` in process `pid`."""
    if pointer <= 0:
        raise CommUnreadable("implausible_fields", f"comm pointer {pointer:#x}")
    try:
        fd = os.open(f"{procfs}/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        raise CommUnreadable("memory_unreadable", f"pid {pid}: {exc}") from None
    try:
        raw = os.pread(fd, CommLayout.SPAN.size, pointer + layout.hash_at)
    except OSError as exc:           # EIO: the address is not mapped (a stale pointer)
        raise CommUnreadable("memory_unreadable", f"pid {pid} at {pointer:#x}: {exc}") from None
    finally:
        os.close(fd)
    return decode_comm_fields(raw)
