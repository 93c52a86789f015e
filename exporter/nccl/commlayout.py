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

The operation counter (docs/nccl.md, "Numbering") is found another way: its offset is not
read by any exported function. NCCL's headers of every release from 2.18 to 2.28 give it
(bench/nccl_counters.py compiles offsetof() against each tag; bench/results/
nccl_counters.md). The library says which release it is (ncclGetVersion stores the version
code as an immediate), and the table's rank offset for that release must equal the one the
accessors give: a build whose layout is not the released one has no counter.
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, replace

from ..bpf_loader import elfsym

ACCESSORS = ("ncclCommUserRank", "ncclCommCount", "ncclCommCuDevice")
VERSION_FUNCTION = "ncclGetVersion"
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
class Counter:
    """NCCL's count of the collectives it launched on a comm: `words` 64-bit counters summed,
    at `at` in struct ncclComm, or, when `via` is not 0, in the struct the pointer at `via`
    points to (comm->sharedRes)."""
    name: str
    via: int
    at: int
    words: int


# NCCL release -> (offset of ncclComm.rank, its counter): bench/results/nccl_counters.md.
# 2.26 on: seqNumber[5], every launched collective of the comm. 2.24-2.25: comm->collOpCount,
# 2.18-2.23: sharedRes->collOpCount (shared with splitShare children); both move only for
# launches with proxy (network) work. The kernel uses a counter only once it has seen it move
# by exactly the rank's own calls (nccl.bpf.c, count_from_nccl).
_SEQ, _COLL = "seqNumber", "collOpCount"
COUNTERS = {
    "2.18.1": (0x23d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.18.3": (0x23d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.18.5": (0x23d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.18.6": (0x24d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.19.1": (0x23d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.19.3": (0x24d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.19.4": (0x24d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.20.3": (0x28d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.20.5": (0x28d8, Counter("sharedRes->collOpCount", via=0x78, at=0x310, words=1)),
    "2.21.5": (0x34e0, Counter("sharedRes->collOpCount", via=0x80, at=0x310, words=1)),
    "2.22.3": (0x34250, Counter("sharedRes->collOpCount", via=0x80, at=0x310, words=1)),
    "2.23.4": (0x3c4a8, Counter("sharedRes->collOpCount", via=0x80, at=0x310, words=1)),
    "2.24.3": (0x3c4a8, Counter(_COLL, via=0, at=0x3c5b8, words=1)),
    "2.25.1": (0x784a8, Counter(_COLL, via=0, at=0x785b8, words=1)),
    "2.26.2": (0x784b8, Counter(_SEQ, via=0, at=0x7a510, words=5)),
    "2.26.3": (0x784b8, Counter(_SEQ, via=0, at=0x7a510, words=5)),
    "2.26.5": (0x784b8, Counter(_SEQ, via=0, at=0x7a510, words=5)),
    "2.26.6": (0x784b8, Counter(_SEQ, via=0, at=0x7a510, words=5)),
    "2.27.3": (0x1044b8, Counter(_SEQ, via=0, at=0x106550, words=5)),
    "2.27.5": (0x1044b8, Counter(_SEQ, via=0, at=0x106550, words=5)),
    "2.27.6": (0x1044b8, Counter(_SEQ, via=0, at=0x106550, words=5)),
    "2.27.7": (0x1044b8, Counter(_SEQ, via=0, at=0x106550, words=5)),
    "2.28.3": (0x1044c8, Counter(_SEQ, via=0, at=0x106a08, words=5)),
    "2.28.7": (0x1044d0, Counter(_SEQ, via=0, at=0x106a10, words=5)),
    "2.28.9": (0x1044d0, Counter(_SEQ, via=0, at=0x106a10, words=5)),
}


@dataclass(frozen=True)
class CommLayout:
    rank_at: int                 # offset of `int rank` in struct ncclComm
    counter: Counter | None = None
    counter_reason: str = ""     # why there is no counter (a metric label)
    version: str = ""

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


def version_from_code(code: bytes) -> str | None:
    """The release ncclGetVersion reports: `*version = NCCL_VERSION_CODE` is a mov of a
    32-bit immediate to [reg] (C7 /0, mod 00: C7 00-07, not 04/05, which take more bytes).
    X.Y.Z is coded X*10000 + Y*100 + Z from 2.9 on. None unless exactly one such store."""
    found = set()
    for at in range(len(code) - 5):
        if code[at] == 0xC7 and code[at + 1] in (0, 1, 2, 3, 6, 7):
            (value,) = struct.unpack_from("<i", code, at + 2)
            if 20900 <= value < 100000:
                found.add(f"{value // 10000}.{value // 100 % 100}.{value % 100}")
    return found.pop() if len(found) == 1 else None


def with_counter(layout: CommLayout, version: str | None) -> CommLayout:
    """`layout` with its release's counter, or the reason it has none."""
    if version is None:
        return replace(layout, counter_reason="version_unknown")
    known = COUNTERS.get(version)
    if known is None:
        return replace(layout, counter_reason="release_not_tabled", version=version)
    rank_at, counter = known
    if rank_at != layout.rank_at:
        # Not the released build's layout (patched, rebuilt with other options): its counter
        # may sit anywhere.
        return replace(layout, counter_reason="layout_not_release", version=version)
    return replace(layout, counter=counter, version=version)


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
        code = elfsym.function_code(path, {*ACCESSORS, VERSION_FUNCTION})
    except (OSError, elfsym.ElfError) as exc:
        return LayoutUnknown("library_unreadable", f"{path}: {exc}")
    missing = [name for name in ACCESSORS if name not in code]
    if missing:
        return LayoutUnknown("no_accessors", f"{path} does not export {', '.join(missing)}")
    try:
        layout = layout_from_code(*(code[name] for name in ACCESSORS))
    except LayoutUnknown as exc:
        return LayoutUnknown(exc.reason, f"{path}: {exc}")
    version = version_from_code(code[VERSION_FUNCTION]) if VERSION_FUNCTION in code else None
    if version is None:
        version = version_from_banner(path)
    return with_counter(layout, version)


_BANNER = re.compile(rb"NCCL version (\d+)\.(\d+)\.(\d+)[+\x00]")


def version_from_banner(path: str) -> str | None:
    """The release in the banner NCCL prints at init ("NCCL version 2.28.9+cuda12.9"), when
    ncclGetVersion's code does not say: None unless the file holds exactly one."""
    try:
        with open(path, "rb") as f:
            found = {".".join(m.decode() for m in match.groups()) for match in _BANNER.finditer(f.read())}
    except OSError:
        return None
    return found.pop() if len(found) == 1 else None
