"""Map keys -> label values. Each decoder consumes a fixed number of key bytes.

Labels must stay bounded: peer addresses become a configured cluster host name or
"other"; process names are only ever those the kernel program was told to track, with the
all-zero key meaning "other".
"""
from __future__ import annotations

import ipaddress
import string
import struct
from dataclasses import dataclass
from typing import Callable

OTHER = "other"
MMAP_OPS = {0: "mmap", 1: "munmap", 2: "mremap"}
# tcp.bpf.c's RTT sample kinds (the index it counts them at): an ACK of several segments; an
# ACK of one segment riding on the server's reply (a client's sample), on the client's next
# request (a server's), or on no data at all (possibly held by a delayed-ACK timer).
RTT_SAMPLE_KINDS = {0: "several_segments", 1: "reply", 2: "next_request", 3: "delayed_ack"}
_PRINTABLE = set(string.printable) - set("\t\n\r\x0b\x0c")


@dataclass(frozen=True)
class Decoder:
    size: int                          # key bytes consumed
    decode: Callable[[bytes], str]


def decode_comm(raw: bytes) -> str:
    """A task comm (char[16], NUL-padded); all zero means an untracked process."""
    name = raw.split(b"\0", 1)[0]
    if not name:
        return OTHER
    text = name.decode("utf-8", "replace")
    # comm is set by the process (prctl): keep the label printable.
    return "".join(ch if ch in _PRINTABLE else "?" for ch in text)


def decode_mmap_op(raw: bytes) -> str:
    (op,) = struct.unpack("<I", raw)
    return MMAP_OPS.get(op, "unknown")


def decode_rtt_sample_kind(raw: bytes) -> str:
    (index,) = struct.unpack("<I", raw)
    return RTT_SAMPLE_KINDS.get(index, "unknown")


def decode_address(raw: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """16 bytes of IPv6, with IPv4 carried v4-mapped (::ffff:a.b.c.d)."""
    addr = ipaddress.IPv6Address(raw)
    return addr.ipv4_mapped or addr


def peer_decoder(peers: dict[str, str]) -> Decoder:
    """Decoder of a peer address to its cluster host name (from the ebpf.peers config)."""
    table: dict[ipaddress._BaseAddress, str] = {}
    for ip, host in (peers or {}).items():
        try:
            addr = ipaddress.ip_address(str(ip).strip())
        except ValueError as exc:
            raise ValueError(f"ebpf.peers: {ip!r} is not an IP address") from exc
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
            addr = addr.ipv4_mapped
        table[addr] = str(host)

    def decode(raw: bytes) -> str:
        return table.get(decode_address(raw), OTHER)

    return Decoder(16, decode)


STATIC_DECODERS: dict[str, Decoder] = {
    "comm": Decoder(16, decode_comm),
    "mmap_op": Decoder(4, decode_mmap_op),
    "rtt_sample_kind": Decoder(4, decode_rtt_sample_kind),
}


def decode_key(key: bytes, decoders: list[Decoder]) -> tuple[str, ...]:
    """Split `key` across decoders in order; every byte of the key must be consumed."""
    need = sum(d.size for d in decoders)
    if len(key) != need:
        raise ValueError(f"map key is {len(key)} bytes, decoders expect {need}")
    labels, pos = [], 0
    for d in decoders:
        labels.append(d.decode(key[pos:pos + d.size]))
        pos += d.size
    return tuple(labels)
