"""Kernel log (mlx5_core, NETDEV WATCHDOG, PCIe AER, NVRM Xid) from /dev/kmsg or a file of records.

Each scrape reads only records that are new since the persisted cursor (boot ID + last
sequence number in <state_dir>/kmsg.json), so an exporter restart neither recounts the
ring buffer nor loses events; a new boot ID starts the cursor over. Totals are persisted
with the cursor so counters stay monotonic across restarts.
"""
from __future__ import annotations

import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from prometheus_client.core import CounterMetricFamily, Metric

from ..framework import Collector, SampleCache, register
from ..kmsg_patterns import KNOWN_XIDS, PATTERNS, xid_label, xid_severity
from ..parsers.files import ReadProblem, reason_for
from ..parsers.held import RACY_NS, HeldDirectory
from ..parsers.kmsg import Classifier, KmsgFormatError, parse_record
from ..statefile import StateFile, state_metrics

log = logging.getLogger("fabricscope.exporter.kmsg")

# Bounds per scrape so a huge backlog costs several scrapes, not one very long one.
MAX_FILE_BYTES_PER_SCRAPE = 32 * 1024 * 1024
MAX_DEVICE_RECORDS_PER_SCRAPE = 200_000
# The kernel caps one formatted record at 8 KiB (CONSOLE_EXT_LOG_MAX); a smaller read
# buffer makes read() fail with EINVAL.
DEVICE_READ_SIZE = 16 * 1024
# Enough of a file's start to notice it was replaced by one that grew past our offset.
HEAD_BYTES = 64


class EventKey(NamedTuple):
    """What a matched kernel log line counts under; "source|pattern|severity" only in the
    state file."""
    source: str
    pattern: str
    severity: str


class XidKey(NamedTuple):
    """An Xid count's key; "xid|severity" only in the state file."""
    xid: str
    severity: str


@dataclass
class KmsgState:
    boot_id: str = ""
    last_sequence: int = -1
    file_identity: list[int] | None = None    # [st_dev, st_ino] of the file source
    file_offset: int = 0
    file_head: str = ""                       # first HEAD_BYTES of the file, latin-1
    lines: int = 0
    events: dict[EventKey, int] = field(default_factory=dict)
    xids: dict[XidKey, int] = field(default_factory=dict)
    source_read: bool = False                 # the log source has been read at least once

    def cursor(self) -> tuple:
        """Everything that moves when records are read; events only change with lines."""
        return (self.boot_id, self.last_sequence, self.file_identity, self.file_offset, self.file_head,
                self.lines, self.source_read)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, version=1, events={"|".join(k): v for k, v in self.events.items()},
                    xids={"|".join(k): v for k, v in self.xids.items()})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "KmsgState":
        """Raises ValueError when stored state has the wrong shape (treated as corrupt)."""
        if not data:
            return cls()
        state = cls()
        for name, expected in (("boot_id", str), ("last_sequence", int), ("file_offset", int), ("file_head", str),
                               ("lines", int), ("events", dict), ("xids", dict), ("source_read", bool)):
            value = data.get(name, getattr(state, name))
            if not isinstance(value, expected):
                raise ValueError(f"{name} is {type(value).__name__}, expected {expected.__name__}")
            setattr(state, name, value)
        identity = data.get("file_identity")
        if identity is not None and not (isinstance(identity, list) and len(identity) == 2
                                         and all(isinstance(v, int) for v in identity)):
            raise ValueError("file_identity is not [device, inode]")
        state.file_identity = identity
        if state.lines < 0 or state.last_sequence < -1 or state.file_offset < 0:
            raise ValueError("negative line count, sequence or offset")
        for table in (state.events, state.xids):
            if not all(isinstance(v, int) and v >= 0 for v in table.values()):
                raise ValueError("event counts must be non-negative integers")
        # Keys become label values: keep only those the current tables can produce. A row
        # renamed or removed since the state was written is dropped, not an error.
        state.events = {_EVENT_KEYS[k]: v for k, v in state.events.items() if k in _EVENT_KEYS}
        state.xids = {_XID_KEYS[k]: v for k, v in state.xids.items() if k in _XID_KEYS}
        return state


# Every key the pattern tables can produce, by its state-file text.
_EVENT_KEYS = {"|".join(key): key for key in (EventKey(row.source, row.name, row.severity) for row in PATTERNS)}
_XID_KEYS = {"|".join(key): key for key in (XidKey(xid_label(code), xid_severity(code))
                                             for code in [*KNOWN_XIDS, -1])}


class DeviceSource:
    """/dev/kmsg: one record per read(); EPIPE means the ring buffer overwrote records."""

    def __init__(self, path: Path) -> None:
        # Start at the oldest record still in the ring buffer (not SEEK_DATA, which skips
        # what `dmesg -c` cleared): the sequence cursor already prevents double counting,
        # and a cleared buffer must not hide an Xid logged at boot.
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.failed = False

    def read(self, errors: dict[str, int]) -> list[bytes]:
        records = []
        while len(records) < MAX_DEVICE_RECORDS_PER_SCRAPE:
            try:
                data = os.read(self.fd, DEVICE_READ_SIZE)
            except BlockingIOError:
                break
            except BrokenPipeError:
                errors["records_overwritten"] = errors.get("records_overwritten", 0) + 1
                continue
            except InterruptedError:
                continue
            except OSError as exc:
                # Keep what was read; the collector reopens the device on the next scrape.
                reason = reason_for(exc)
                errors[reason] = errors.get(reason, 0) + 1
                self.failed = True
                break
            if not data:
                break
            records.append(data)
        return records

    def close(self) -> None:
        os.close(self.fd)


def _split_records(data: bytes) -> list[bytes]:
    """Complete lines of a kmsg file grouped into records; continuation lines (leading
    space) stay with the record before them and are dropped if it is not in this chunk."""
    records: list[bytes] = []
    for line in data.split(b"\n"):
        if not line:
            continue
        if line[:1] == b" ":
            if records:
                records[-1] += b"\n" + line
            continue
        records.append(line)
    return records


class FileSource:
    """A kmsg-format file (the demo's, a test's, a host's log copied out). It remembers the
    file as it was after the last read: while the same file keeps the same size and an
    mtime older than the filesystem clock's tick, nothing was appended or rewritten, and
    a scrape costs one stat() instead of open, fstat, a head read and a read to the end
    (about a third of the collector's time on a quiet log, bench/scrape_latency.py)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._unchanged: tuple[int, int, int, int] | None = None   # (dev, inode, size, mtime) then

    def read(self, info: os.stat_result, state: KmsgState, errors: dict[str, int]) -> list[bytes]:
        """New records, given the path's stat() of this scrape."""
        seen = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        if seen == self._unchanged and [info.st_dev, info.st_ino] == state.file_identity \
                and info.st_size == state.file_offset:
            return []
        records = read_file_records(self.path, state, errors)
        settled = time.time_ns() - info.st_mtime_ns > RACY_NS
        self._unchanged = seen if settled and info.st_size == state.file_offset else None
        return records


def read_file_records(path: Path, state: KmsgState, errors: dict[str, int]) -> list[bytes]:
    """New complete records appended to a kmsg-format file since state.file_offset.

    A different inode, a shorter file or a changed first line means the file was rotated
    or truncated: reading starts over at 0 and the sequence cursor drops what was seen.
    A trailing line without its newline is left for the next scrape.
    """
    with open(path, "rb") as handle:
        info = os.fstat(handle.fileno())
        head = handle.read(HEAD_BYTES).decode("latin-1")
        identity = [info.st_dev, info.st_ino]
        offset = state.file_offset
        if (identity != state.file_identity or info.st_size < offset
                or not head.startswith(state.file_head[:len(head)]) or len(head) < len(state.file_head)):
            if state.file_identity is not None:
                errors["file_rotated"] = errors.get("file_rotated", 0) + 1
            offset = 0
        handle.seek(offset)
        # Up to what fstat saw (and what grew since, up to the bound), not the bound
        # itself: read(n) allocates n bytes before reading.
        data = handle.read(min(MAX_FILE_BYTES_PER_SCRAPE, max(info.st_size - offset, 0) + DEVICE_READ_SIZE))
    end = data.rfind(b"\n")
    if end < 0:
        if len(data) >= MAX_FILE_BYTES_PER_SCRAPE:  # one absurd line: skip it rather than stall
            errors["line_too_long"] = errors.get("line_too_long", 0) + 1
            offset += len(data)
        data = b""
    else:
        data = data[:end + 1]
        offset += end + 1
    state.file_identity, state.file_offset, state.file_head = identity, offset, head
    return _split_records(data)


@register
class KmsgCollector(Collector):
    name = "kmsg"
    description = "mlx5_core, NETDEV WATCHDOG and NVRM Xid events from the kernel log."
    serves_unchanged_samples = True   # _expose() through its own SampleCache

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.state_file = StateFile(ctx.state_dir / "kmsg.json")
        stored = self.state_file.load()
        self.load_problem = self.state_file.load_problem
        try:
            self.state = KmsgState.from_dict(stored)
        except (ValueError, TypeError, OverflowError) as exc:
            self.state_file.set_aside(f"invalid layout: {exc!r}")
            self.load_problem, self.state = self.state_file.load_problem, KmsgState()
        self.dirty = self.load_problem is not None   # rewrite a missing/corrupt file promptly
        self.classifier = Classifier()
        self.read_errors: dict[str, int] = {}
        self.boot_id_changes = 0
        self.device: DeviceSource | None = None
        self.file = FileSource(ctx.kmsg)
        # Held open and re-read in place (parsers/held.py), as sysfs counters are.
        self.boot_id_file = HeldDirectory(str(ctx.procfs / "sys" / "kernel" / "random"), ("boot_id",))
        self.lock = threading.Lock()
        self.samples = SampleCache()

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            self.samples.next_scrape()
            before = self.state.cursor()
            self._check_boot_id()
            self._read_new_records()
            self.dirty = self.dirty or self.state.cursor() != before
            if self.dirty and self.state_file.save(self.state.to_dict()):
                self.dirty = False
            return list(self._expose())

    def close(self) -> None:
        if self.device is not None:
            self.device.close()
            self.device = None
        self.boot_id_file.close()

    def _error(self, reason: str, count: int = 1) -> None:
        self.read_errors[reason] = self.read_errors.get(reason, 0) + count

    def _check_boot_id(self) -> None:
        [(_, boot_id)] = self.boot_id_file.read()
        if isinstance(boot_id, ReadProblem):
            self._error("boot_id_unreadable")
            return
        if self.state.boot_id and boot_id != self.state.boot_id:
            # A new boot numbers its records from 0 again: the old cursor would hide them.
            log.info("boot ID changed from %s to %s: kernel log cursor reset", self.state.boot_id, boot_id)
            self.boot_id_changes += 1
            self.state.last_sequence = -1
            self.close()
        self.state.boot_id = boot_id

    def _read_new_records(self) -> None:
        path = self.ctx.kmsg
        errors: dict[str, int] = {}
        try:
            if self.device is None:
                info = os.stat(path)
                if stat.S_ISCHR(info.st_mode):
                    self.device = DeviceSource(path)
                elif not stat.S_ISREG(info.st_mode):     # a FIFO would block the read
                    self._error("not_a_file")
                    return
            raw_records = self.device.read(errors) if self.device is not None else \
                self.file.read(info, self.state, errors)
        except OSError as exc:
            self._error(reason_for(exc))
            self.close()   # reopen on the next scrape
            return
        finally:
            for reason, count in errors.items():
                self._error(reason, count)
        if self.device is not None and self.device.failed:
            self.close()
        self.state.source_read = True
        self._count(raw_records)

    def _count(self, raw_records: list[bytes]) -> None:
        state, classify = self.state, self.classifier.classify
        for raw in raw_records:
            try:
                record = parse_record(raw)
            except KmsgFormatError as exc:
                self._error(exc.reason)
                continue
            if record.sequence <= state.last_sequence:
                continue   # counted before this restart or before the file was rotated
            state.last_sequence = record.sequence
            state.lines += 1
            match = classify(record.message)
            if match is None:
                continue
            if match.kind == "xid":
                xid = XidKey(match.name, match.severity)
                state.xids[xid] = state.xids.get(xid, 0) + 1
            else:
                event = EventKey(match.source, match.name, match.severity)
                state.events[event] = state.events.get(event, 0) + 1

    def _expose(self) -> Iterable[Metric]:
        family = self.samples.family
        if self.state.source_read:
            # Every known pattern from 0, so increase() sees the first event.
            counts = dict.fromkeys(_EVENT_KEYS.values(), 0) | self.state.events
            yield family(CounterMetricFamily, "fabric_kernel_log_events", "Kernel log lines matching a NIC failure "
                         "pattern.", ("source", "pattern", "severity"), sorted(counts.items()))
            yield family(CounterMetricFamily, "fabric_kernel_log_xid_events", "NVRM Xid errors by Xid code ('other' "
                         "when undocumented).", ("xid", "severity"), sorted(self.state.xids.items()))
            yield family(CounterMetricFamily, "fabric_kernel_log_lines", "Kernel log records read.", (),
                         (((), self.state.lines),))
        yield family(CounterMetricFamily, "fabric_kernel_log_read_errors", "Kernel log records or reads skipped, by "
                     "reason, since the exporter started.", ("reason",),
                     [((reason,), value) for reason, value in sorted(self.read_errors.items())])
        yield from state_metrics(self.name, self.load_problem, self.state_file.write_errors, self.boot_id_changes,
                                 self.samples)
