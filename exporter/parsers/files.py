"""Safe reads of single-value sysfs/procfs files.

A value file can be absent (the kernel or firmware does not expose it: an absent series),
unreadable, empty, or hold text that is not a number ("N/A (no PMA)" from mlx5 ports
without a performance-management agent). Readers return either a value or a short,
bounded reason string that collectors export as a label, so a bad file is visible and
specific and never an exception that would cost the rest of the scrape.

Only regular files are read (sysfs attributes and procfs files are regular files): a
FIFO would block the reading thread until a writer appears. Files are opened
non-blocking and checked on the open descriptor, so whatever sits at the path, nothing
blocks and only a regular file is read. Files read on every scrape are held open between
scrapes instead (held.py), through the same check.
"""
from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

# Whole-file reads (procfs tables such as net/route) stop here: a bigger file is reported,
# not slurped into memory on every scrape.
MAX_FILE_BYTES = 8 * 1024 * 1024
# sysfs values fit in one page.
SMALL_FILE_BYTES = 4096
# Counters are unsigned 64-bit in the kernel; anything outside is not a counter reading.
COUNTER_LIMIT = 1 << 64

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# ASCII only: str.isdigit() and int() also accept "²" or "١٢٣", which no kernel writes.
_DECIMAL = re.compile(r"-?[0-9]+\Z", re.ASCII)
_HEX = re.compile(r"0x[0-9a-fA-F]+\Z", re.ASCII)
_MAX_DIGITS = 40   # beyond any 64-bit value; keeps int() of a hostile file cheap


@dataclass(frozen=True)
class ReadProblem:
    path: Path
    # absent | permission_denied | not_a_file | unsupported | io_error | too_large | empty
    # | no_pma | not_a_number | out_of_range | malformed
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def open_regular(path: str | Path) -> int | str:
    """A descriptor open on `path` if it is a regular file, else the reason label.

    Opened non-blocking (a FIFO opens at once instead of waiting for a writer) and then
    checked on the descriptor itself, so nothing swapped in can block the read."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return reason_for(exc)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        reason = "not_a_file"
    except OSError as exc:
        reason = reason_for(exc)
    os.close(fd)
    return reason


def _read_fd(fd: int, limit: int) -> bytes | str:
    """Up to `limit` bytes (then "too_large"), or the reason label of a failed read.
    Reads at most 64 KiB at a time: /proc/sys files refuse larger requests."""
    try:
        data = os.read(fd, min(limit + 1, 65536))
        if limit > SMALL_FILE_BYTES and data:
            # procfs tables come a page or so per read: keep reading to the end.
            chunks = [data]
            size = len(data)
            while data and size <= limit:
                data = os.read(fd, min(limit + 1 - size, 65536))
                chunks.append(data)
                size += len(data)
            data = b"".join(chunks)
        return data if len(data) <= limit else "too_large"
    except OSError as exc:
        return reason_for(exc)
    finally:
        os.close(fd)


def _read(path: str | Path, limit: int) -> str | ReadProblem:
    fd = open_regular(path)
    return as_text(fd if fd.__class__ is str else _read_fd(fd, limit), path)


def as_text(raw: bytes | str, name: str | Path, directory: str | None = None) -> str | ReadProblem:
    """What a read returned (bytes, or the reason label of a failure) as stripped text, or
    as the ReadProblem of `name` (in `directory`): an empty file is a problem too. The Path
    is built only for a problem."""
    if raw.__class__ is not str:
        text = raw.decode("utf-8", "replace").strip()
        if text:
            return text
        raw = "empty"
    return ReadProblem(Path(directory, name) if directory else Path(name), raw)


class UnreadableFile(OSError):
    """A file read_file_bytes would not read; `reason` is the bounded label."""

    def __init__(self, path: str | Path, reason: str, limit: int) -> None:
        # The operating system's own words where it has some (what open() would have said).
        text = {"absent": os.strerror(errno.ENOENT), "permission_denied": os.strerror(errno.EACCES),
                "not_a_file": "not a regular file (a FIFO, device or directory)",
                "too_large": f"larger than {limit} bytes"}.get(reason, reason)
        super().__init__(text)
        self.strerror, self.filename, self.reason = text, str(path), reason


def read_file_bytes(path: str | Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """The whole content of a regular file of at most `limit` bytes, else UnreadableFile.
    For files an operator names (configuration, keys, inventories): a plain open() of a
    FIFO waits for a writer forever, and a read of /dev/zero never ends."""
    fd = open_regular(path)
    raw = fd if fd.__class__ is str else _read_fd(fd, limit)
    if raw.__class__ is str:
        raise UnreadableFile(path, raw, limit)
    return raw


def read_text(path: Path) -> str | ReadProblem:
    """The file's content with surrounding whitespace stripped, or why it could not be read."""
    return _read(path, MAX_FILE_BYTES)


def parse_int(text: str, path: Path) -> int | ReadProblem:
    """A decimal (optionally negative) or 0x-hex integer as the kernel prints one."""
    if text.startswith("N/A"):
        return ReadProblem(path, "no_pma")
    if len(text) > _MAX_DIGITS:
        return ReadProblem(path, "out_of_range" if _DECIMAL.match(text) or _HEX.match(text) else "not_a_number")
    if _DECIMAL.match(text):
        return int(text)
    if _HEX.match(text):
        return int(text, 16)
    return ReadProblem(path, "not_a_number")


def parse_counter(text: str, path: Path | str, name: str | None = None) -> int | ReadProblem:
    """parse_int for kernel counters: unsigned 64-bit, so a negative value or one of 2^64
    or more is a malformed file, not a reading (exported, it would latch false breaches).
    With `name`, `path` is the file's directory: the Path is built only for a problem
    (building one per counter was 40% of a scrape's counter reading)."""
    if text.isascii() and text.isdigit() and len(text) < 20:   # the common case, cheaply
        return int(text)
    where = Path(path, name) if name is not None else Path(path)
    value = parse_int(text, where)
    if isinstance(value, int) and not 0 <= value < COUNTER_LIMIT:
        return ReadProblem(where, "out_of_range")
    return value


def read_int(path: Path) -> int | ReadProblem:
    text = read_text(path)
    return text if isinstance(text, ReadProblem) else parse_int(text, path)


def read_small_text(path: str) -> str | ReadProblem:
    """read_text for hot paths (hundreds of counter files per scrape): raw descriptors, no
    buffered-IO object per file, which is most of the cost of open().read() on a small
    sysfs attribute."""
    return _read(path, SMALL_FILE_BYTES)


def reason_for(exc: OSError) -> str:
    """The bounded reason label for a failed read of a sysfs/procfs path."""
    if exc.errno == errno.ENOENT:
        return "absent"
    if exc.errno in (errno.EISDIR, errno.ENOTDIR):   # a file where a directory belongs, or the reverse
        return "not_a_file"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission_denied"
    # EINVAL/EOPNOTSUPP are what some drivers return for counters the hardware lacks.
    if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
        return "unsupported"
    return "io_error"
