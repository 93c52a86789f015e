"""The comm ids the fake libnccl gives its communicators (fake_nccl.c), computed here
independently: what a test expects the exporter to read from a rank's memory."""
from __future__ import annotations

import struct

_MASK = (1 << 64) - 1


def nccl_get_hash(data: bytes) -> int:
    """NCCL 2.18's getHash: DJB2a over signed chars."""
    result = 5381
    for byte in data:
        signed = byte - 256 if byte > 127 else byte
        result = (((result << 5) + result) ^ (signed & _MASK)) & _MASK
    return result


def comm_hash(unique_id: bytes) -> int:
    """ncclCommInitRank's comm: commHash of the unique id."""
    return nccl_get_hash(unique_id)


def split_hash(parent: int, color: int) -> int:
    """ncclCommSplit's comm: from the parent's hash and the color."""
    return nccl_get_hash(struct.pack("<Qi", parent, color))
