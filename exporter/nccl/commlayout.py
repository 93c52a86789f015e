"""Where a libnccl build keeps a communicator's hash, rank, size and CUDA device.

An exporter that starts while a job runs never sees its ncclCommInitRank: the comm id,
rank and size have to come from the communicator itself. NCCL does not publish
struct ncclComm's layout and the wheels carry no DWARF, but every build exports three
accessors that read exactly these fields:
    ncclCommUserRank  *rank  = comm->rank
    ncclCommCount     *count = comm->nRanks
    ncclCommCuDevice  *devid = comm->cudaDev
and from 2.18 to 2.28 src/include/comm.h declares them together, after the hash NCCL
prints as the comm's id ("commId 0x...") and names every comm by:
    uint64_t commHash; int rank; int nRanks; int cudaDev;
So a field's offset is a 32-bit displacement in its accessor's code (the struct is tens of
KiB: no offset fits a disp8), and the rank's offset is the one value R for which R appears
in ncclCommUserRank, R+4 in ncclCommCount and R+8 in ncclCommCuDevice. Any other layout
(a future NCCL, a build without the accessors) finds no such R, or more than one, and
is refused with its reason: never a guess.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..bpf_loader import elfsym

ACCESSORS = ("ncclCommUserRank", "ncclCommCount", "ncclCommCuDevice")
# A displacement below this is a small constant, not one of these fields (commHash sits
# after the channel array: kilobytes in). Above the upper bound no struct of this kind
# lies (rank is 9 KiB in on 2.18, 1.0 MiB on 2.27: NCCL keeps ever larger arrays inline).
MIN_OFFSET, MAX_OFFSET = 64, 1 << 26


class LayoutUnknown(ValueError):
    """No layout for this library; `reason` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class CommLayout:
    rank_at: int                 # offset of `int rank` in struct ncclComm

    @property
    def hash_at(self) -> int:    # uint64_t commHash, just before rank
        return self.rank_at - 8

    # commHash, rank, nRanks, cudaDev: read in one piece
    SPAN = struct.Struct("<Qiii")


def displacements(code: bytes) -> set[int]:
    """Every little-endian 32-bit value at any byte of `code` that could be a field offset.
    Reading every position instead of decoding instructions costs nothing here (an
    accessor is a few hundred bytes) and cannot miss an encoding."""
    found = set()
    for at in range(len(code) - 3):
        (value,) = struct.unpack_from("<i", code, at)
        if MIN_OFFSET <= value < MAX_OFFSET:
            found.add(value)
    return found


def layout_from_code(user_rank: bytes, count: bytes, cu_device: bytes) -> CommLayout:
    ranks, sizes, devices = displacements(user_rank), displacements(count), displacements(cu_device)
    candidates = sorted(r for r in ranks if r + 4 in sizes and r + 8 in devices and r - 8 >= MIN_OFFSET)
    if len(candidates) != 1:
        raise LayoutUnknown("layout_ambiguous" if candidates else "layout_not_found",
                            f"{len(candidates)} candidate offsets of ncclComm.rank "
                            f"({', '.join(hex(c) for c in candidates[:4]) or 'none'}): not NCCL's 2.18-2.28 layout")
    return CommLayout(rank_at=candidates[0])


_cache: dict[tuple[int, int, int], CommLayout | LayoutUnknown] = {}


def library_layout(path: str) -> CommLayout:
    """The layout of the libnccl file at `path` (cached by file identity); LayoutUnknown
    with its reason when there is none to be had."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise LayoutUnknown("library_unreadable", f"{path}: {exc}") from None
    key = (st.st_dev, st.st_ino, int(st.st_mtime))
    if key not in _cache:
        if len(_cache) > 64:            # library files come and go with jobs' environments
            _cache.clear()
        _cache[key] = _find(path)
    found = _cache[key]
    if isinstance(found, LayoutUnknown):
        raise found
    return found


def _find(path: str) -> CommLayout | LayoutUnknown:
    try:
        code = elfsym.function_code(path, set(ACCESSORS))
    except (OSError, elfsym.ElfError) as exc:
        return LayoutUnknown("library_unreadable", f"{path}: {exc}")
    missing = [name for name in ACCESSORS if name not in code]
    if missing:
        return LayoutUnknown("no_accessors", f"{path} does not export {', '.join(missing)}")
    try:
        return layout_from_code(*(code[name] for name in ACCESSORS))
    except LayoutUnknown as exc:
        return LayoutUnknown(exc.reason, f"{path}: {exc}")
