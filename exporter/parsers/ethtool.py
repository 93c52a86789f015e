"""`ethtool -S`: a network driver's statistics, through the SIOCETHTOOL ioctl.

Three requests of the kernel's stable ethtool ABI (include/uapi/linux/ethtool.h): how many
statistics the driver has (ETHTOOL_GSSET_INFO), their names (ETHTOOL_GSTRINGS) and their
values (ETHTOOL_GSTATS). Written here rather than taken from pyroute2 because importing
pyroute2 loads all of it (NDB, IPDB, every netlink family): 14 MB of the exporter's RSS for
these three ioctls (docs/cost.md).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct

SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
# struct ifreq: the name, then a union whose ifr_data is the pointer to the request.
_IFREQ = struct.Struct(f"{IFNAMSIZ}sP{40 - IFNAMSIZ - struct.calcsize('P')}x")
# Answers meaning "this driver has no statistics", not a failure.
_NO_STATISTICS = {errno.EOPNOTSUPP, errno.ENOTSUP}


class EthtoolUnsupported(Exception):
    """The interface's driver has no statistics to give."""


def _request(sock: socket.socket, interface: bytes, buffer: ctypes.Array) -> None:
    ifreq = bytearray(_IFREQ.pack(interface, ctypes.addressof(buffer)))
    try:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
    except OSError as exc:
        if exc.errno in _NO_STATISTICS:
            raise EthtoolUnsupported(str(exc)) from None
        raise


def statistics(interface: str) -> list[tuple[str, int]]:
    """(name, value) of every driver statistic, in the driver's order. Raises
    EthtoolUnsupported when the driver has none, OSError when the ioctl fails (no such
    interface, a driver error) and ValueError for a name that cannot be an interface."""
    name = interface.encode()
    if not 0 < len(name) < IFNAMSIZ:
        raise ValueError(f"{interface!r} cannot be an interface name")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # struct ethtool_sset_info {cmd, reserved, sset_mask, data[1]}
        info = ctypes.create_string_buffer(struct.pack("<IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS, 0), 20)
        _request(sock, name, info)
        _, _, mask, count = struct.unpack("<IIQI", info.raw)
        if not mask & (1 << ETH_SS_STATS) or count == 0:
            raise EthtoolUnsupported("no statistics")
        # struct ethtool_gstrings {cmd, string_set, len, data[len * ETH_GSTRING_LEN]}
        strings = ctypes.create_string_buffer(12 + count * ETH_GSTRING_LEN)
        struct.pack_into("<III", strings, 0, ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        _request(sock, name, strings)
        # struct ethtool_stats {cmd, n_stats, data[n_stats] (u64)}
        stats = ctypes.create_string_buffer(8 + count * 8)
        struct.pack_into("<II", stats, 0, ETHTOOL_GSTATS, count)
        _request(sock, name, stats)
    named = struct.unpack_from("<III", strings.raw)[2]
    got = struct.unpack_from("<II", stats.raw)[1]
    if named != count or got != count:       # the driver changed its set between the requests
        raise OSError(errno.EAGAIN, f"{interface}: {count} statistics announced, {named} named, {got} read")
    raw = strings.raw
    names = [raw[12 + i * ETH_GSTRING_LEN: 12 + (i + 1) * ETH_GSTRING_LEN].split(b"\0", 1)[0].decode(errors="replace")
             for i in range(count)]
    return list(zip(names, struct.unpack_from(f"<{count}Q", stats.raw, 8)))
