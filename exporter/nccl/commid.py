"""Communicator ids: splitmix64 folded over the full 128-byte ncclUniqueId.

The first 8 bytes of an ncclUniqueId are mostly the bootstrap socket family and port, so
ids of jobs on the same host collide there; folding every byte does not.
"""
from __future__ import annotations

import struct

UNIQUE_ID_BYTES = 128
_MASK = (1 << 64) - 1


def splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def fold_words(words) -> int:
    """h = splitmix64(h ^ word) over the words, starting from 0."""
    digest = 0
    for word in words:
        digest = splitmix64(digest ^ (word & _MASK))
    return digest


def unique_id_hash(unique_id: bytes) -> int:
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise ValueError(f"ncclUniqueId is {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    return fold_words(struct.unpack("<16Q", unique_id))


def comm_label(digest: int) -> str:
    """The `comm` label value: 16 lower-case hex digits."""
    return f"{digest & _MASK:016x}"
