"""Kernel log records in the /dev/kmsg format, and their classification.

A record (Documentation/ABI/testing/dev-kmsg) is

    <prefix>,<sequence>,<timestamp_usec>,<flags>[,<more fields>];<message>\\n
    [ <KEY>=<value>\\n]...

where prefix is the syslog priority (facility << 3 | level), bytes outside printable
ASCII and the backslash itself are escaped as \\xNN, and the optional lines that start
with a space are dictionary entries (SUBSYSTEM=, DEVICE=). One read() of /dev/kmsg
returns exactly one record; a file of records holds one record per line, followed by
its continuation lines.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..kmsg_patterns import PATTERNS, XID_REGEX, XID_REQUIRES, xid_label, xid_severity

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


class KmsgFormatError(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason      # not_utf8 | no_separator | bad_prefix | empty


@dataclass(frozen=True)
class KmsgRecord:
    priority: int                 # syslog priority: facility << 3 | level
    sequence: int
    timestamp_usec: int           # monotonic microseconds since boot
    flags: str                    # "-", or "c" for a continuation fragment
    message: str
    dictionary: dict[str, str] = field(default_factory=dict)

    @property
    def level(self) -> int:
        return self.priority & 7

    @property
    def facility(self) -> int:
        return self.priority >> 3


def unescape(raw: bytes) -> bytes:
    return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw)


def parse_record(raw: bytes) -> KmsgRecord:
    """One record (its first line plus any continuation lines); raises KmsgFormatError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KmsgFormatError("not_utf8", f"byte {exc.start}") from None
    first, *continuation = text.rstrip("\n").split("\n")
    if not first:
        raise KmsgFormatError("empty", "empty record")
    header, separator, message = first.partition(";")
    if not separator:
        raise KmsgFormatError("no_separator", f"no ';' in {first[:60]!r}")
    fields = header.split(",")
    if len(fields) < 4:
        raise KmsgFormatError("bad_prefix", f"{len(fields)} header fields in {header[:60]!r}")
    try:
        priority, sequence, timestamp = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        raise KmsgFormatError("bad_prefix", f"non-numeric header {header[:60]!r}") from None
    if priority < 0 or sequence < 0 or timestamp < 0:
        raise KmsgFormatError("bad_prefix", f"negative header field in {header[:60]!r}")
    dictionary = {}
    for line in continuation:
        if line.startswith(" "):
            key, _, value = line[1:].partition("=")
            dictionary[key] = _decode(value)
    return KmsgRecord(priority, sequence, timestamp, fields[3], _decode(message), dictionary)


def _decode(text: str) -> str:
    if "\\x" not in text:
        return text
    return unescape(text.encode("utf-8")).decode("utf-8", "replace")


@dataclass(frozen=True)
class Match:
    kind: str           # "pattern" or "xid"
    source: str         # mlx5_core | netdev | nvrm
    name: str           # pattern name, or the xid label ("79", "other")
    severity: str       # fatal | non_fatal


class Classifier:
    """Maps a message to the first matching pattern row, or an NVRM Xid, or None."""

    def __init__(self) -> None:
        self._xid = re.compile(XID_REGEX)
        # Rows grouped by the literal they require, in table order. Each group also gets
        # one joined regex, so a line that has the literal but matches no row (ordinary
        # mlx5_core chatter) costs one search, not one per row.
        groups: dict[str, list] = {}
        for index, row in enumerate(PATTERNS):
            groups.setdefault(row.requires, []).append((index, row, re.compile(row.regex)))
        self._groups = [(literal, re.compile("|".join(f"(?:{row.regex})" for _, row, _ in members)), members)
                        for literal, members in groups.items()]

    def classify(self, message: str) -> Match | None:
        if XID_REQUIRES in message:
            found = self._xid.search(message)
            if found:
                digits = found.group(1)
                # A garbled line can carry thousands of digits; int() of those is slow
                # (and refused past 4300). No real Xid has more than a few.
                code = int(digits) if len(digits) <= 9 else -1
                return Match("xid", "nvrm", xid_label(code), xid_severity(code))
        best = None
        for literal, joined, members in self._groups:
            if literal not in message or not joined.search(message):
                continue
            # Some row of this group matches: the first in table order wins.
            for index, row, regex in members:
                if best is not None and index > best[0]:
                    break
                if regex.search(message):
                    best = (index, row)
                    break
        if best is None:
            return None
        row = best[1]
        return Match("pattern", row.source, row.name, row.severity)
