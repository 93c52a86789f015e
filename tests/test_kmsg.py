"""Kernel log: record parsing, classification, incremental reads, cursor persistence."""
from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.collectors.kmsg import KmsgCollector
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import ScrapeCollector
from fabricscope.exporter.kmsg_patterns import FATAL_XIDS, KNOWN_XIDS, PATTERNS
from fabricscope.exporter.parsers.kmsg import Classifier, KmsgFormatError, parse_record

FIXTURE = Path(__file__).parent / "fixtures" / "node"
FIXTURE_RECORDS = 31
FIXTURE_LAST_SEQUENCE = 22301
BOOT_A = "6f0c3b8e-2a41-4d7e-9c55-0e1d2b3a4f51"
BOOT_B = "0b5e9d11-7c3a-4f08-8e2d-41a7c9e6d3b2"


# --- record parsing ------------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    (b"6,42,1234567,-;hello world\n", (6, 42, 1234567, "-", "hello world", {})),
    (b"3,7,99,c;fragment", (3, 7, 99, "c", "fragment", {})),
    (b"12,8,100,-,caller=T12;with extra header field\n", (12, 8, 100, "-", "with extra header field", {})),
    (b"6,9,1,-;a;b;c\n", (6, 9, 1, "-", "a;b;c", {})),
    (b"6,10,2,-;pci 0000:b3:00.0: probe\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b3:00.0\n",
     (6, 10, 2, "-", "pci 0000:b3:00.0: probe", {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:b3:00.0"})),
    (b"6,11,3,-;tab\\x09and\\x5cslash \\xe2\\x84\\xa2\n", (6, 11, 3, "-", "tab\tand\\slash \u2122", {})),
    (b"6,12,4,-;\n", (6, 12, 4, "-", "", {})),
])
def test_parse_record_table(raw, expected):
    record = parse_record(raw)
    assert (record.priority, record.sequence, record.timestamp_usec, record.flags, record.message,
            record.dictionary) == expected


@pytest.mark.parametrize("raw, reason", [
    (b"", "empty"),
    (b"\n", "empty"),
    (b"no separator here\n", "no_separator"),
    (b"6,1;too few header fields\n", "bad_prefix"),
    (b"six,1,2,-;non-numeric priority\n", "bad_prefix"),
    (b"6,-1,2,-;negative sequence\n", "bad_prefix"),
    (b"6,1,2,-;caf\xe9 latin-1 byte\n", "not_utf8"),
    (b"\xff\xfe,1,2,-;binary junk\n", "not_utf8"),
])
def test_parse_record_rejects_malformed(raw, reason):
    with pytest.raises(KmsgFormatError) as caught:
        parse_record(raw)
    assert caught.value.reason == reason


def test_record_level_and_facility():
    record = parse_record(b"30,1,0,-;systemd[1]: started\n")    # daemon.info
    assert (record.facility, record.level) == (3, 6)


# --- classification ------------------------------------------------------------------

@pytest.mark.parametrize("message, expected", [
    ("mlx5_core 0000:b3:00.0: wait_func:1172:(pid 2213): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource",
     ("pattern", "mlx5_core", "command_timeout", "fatal")),
    ("mlx5_core 0000:b3:00.0: cmd_exec timeout", ("pattern", "mlx5_core", "command_timeout", "fatal")),
    ("mlx5_core 0000:b3:00.0: poll_health:806:(pid 0): device's health compromised - reached miss count",
     ("pattern", "mlx5_core", "health_compromised", "fatal")),
    ("mlx5_core 0000:b3:00.0: health poll failed", ("pattern", "mlx5_core", "health_compromised", "fatal")),
    ("mlx5_core 0000:b3:00.0: CRIT: Unrecoverable hardware error", ("pattern", "mlx5_core", "unrecoverable_error", "fatal")),
    ("mlx5_core 0000:b3:00.0: Detected insufficient power on the PCIe slot (27W).",
     ("pattern", "mlx5_core", "insufficient_power", "non_fatal")),
    ("mlx5_core 0000:b3:00.0: Port module event[error]: module 0, Cable error, High Temperature",
     ("pattern", "mlx5_core", "module_high_temperature", "non_fatal")),
    ("mlx5_core 0000:b3:00.0 eth2: Link down, module absent", ("pattern", "mlx5_core", "module_absent", "non_fatal")),
    ("mlx5_core 0000:b3:00.0: Port module event: module 0, Cable unplugged",
     ("pattern", "mlx5_core", "cable_unplugged", "non_fatal")),
    ("mlx5_core 0000:b3:00.0: mlx5_cmd_out_err:838:(pid 1543): ACCESS_REG(0x805) op_mod(0x1) failed, status bad parameter(0x3)",
     ("pattern", "mlx5_core", "access_reg_failed", "non_fatal")),
    ("NETDEV WATCHDOG: eth2 (mlx5_core): transmit queue 5 timed out 5136 ms",
     ("pattern", "netdev", "transmit_timeout", "non_fatal")),
    ("mlx5_core 0000:b3:00.0: mlx5_health_try_recover:327:(pid 1870): health recovery flow aborted, PCI reads still not working",
     ("pattern", "mlx5_core", "unrecoverable_error", "fatal")),
    ("mlx5_core 0000:b3:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)",
     ("pattern", "pcie", "pcie_uncorrected_fatal", "fatal")),
    ("nvidia 0000:18:00.0: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
     ("pattern", "pcie", "pcie_uncorrected_non_fatal", "non_fatal")),
    ("mlx5_core 0000:b3:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
     ("pattern", "pcie", "pcie_corrected", "non_fatal")),
    ("pcieport 0000:00:03.0: AER: Corrected error received: 0000:b3:00.0", None),   # same event as the line above
    ("NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=python3, GPU has fallen off the bus.", ("xid", "nvrm", "79", "fatal")),
    ("NVRM: Xid (PCI:0000:3b:00): 74, pid=1, NVLink: fatal error", ("xid", "nvrm", "74", "fatal")),
    ("NVRM: Xid (PCI:0000:3b:00): 13, pid=4411, Graphics Exception", ("xid", "nvrm", "13", "non_fatal")),
    ("NVRM: Xid (0000:3b:00): 31, pid=4411, MMU Fault", ("xid", "nvrm", "31", "non_fatal")),
    ("NVRM: Xid (PCI:0000:3b:00): 999, pid=0", ("xid", "nvrm", "other", "non_fatal")),
    ("NVRM: Xid (PCI:0000:3b:00): " + "9" * 5000 + ", garbled", ("xid", "nvrm", "other", "non_fatal")),
    # Not failures: the word alone outside mlx5_core, ordinary driver chatter, half an Xid line.
    ("ata1: unrecoverable read error", None),
    ("mlx5_core 0000:b3:00.0 eth2: Link up", None),
    ("NVRM: GPU at PCI:0000:18:00: GPU-5c1e8f0a", None),
    ("NVRM: Xid (PCI:0000:3b:00): pid=1", None),
    ("", None),
])
def test_classifier_table(message, expected):
    match = Classifier().classify(message)
    assert (None if match is None else (match.kind, match.source, match.name, match.severity)) == expected


def test_pattern_and_xid_tables_are_bounded_and_consistent():
    names = [row.name for row in PATTERNS]
    assert len(names) == len(set(names))
    assert all(row.severity in ("fatal", "non_fatal") for row in PATTERNS)
    assert FATAL_XIDS <= set(KNOWN_XIDS)
    assert {48, 63, 64, 74, 79, 92, 94, 95, 119, 120} == set(FATAL_XIDS)


# --- the collector over a file source -----------------------------------------------

@pytest.fixture
def node(tmp_path) -> Path:
    root = tmp_path / "node"
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    shutil.copy(FIXTURE / "proc" / "sys" / "kernel" / "random" / "boot_id", root / "proc" / "sys" / "kernel" / "random")
    shutil.copy(FIXTURE / "kmsg", root / "kmsg")
    return root


def context(root: Path, kmsg: Path | None = None) -> Context:
    return Context(procfs=root / "proc", kmsg=kmsg or root / "kmsg", state_dir=root / "state", node="")


class Scraper:
    """One collector instance (one exporter process lifetime) behind a private registry."""

    def __init__(self, ctx: Context) -> None:
        self.collector = KmsgCollector(ctx)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ScrapeCollector([self.collector]))

    def scrape(self) -> dict[tuple, float]:
        samples = {}
        for family in self.registry.collect():
            for sample in family.samples:
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return samples

    def close(self) -> None:
        self.collector.close()


def event(samples, pattern, severity, source="mlx5_core"):
    return samples.get(("fabric_kernel_log_events_total",
                        (("pattern", pattern), ("severity", severity), ("source", source))))


def xid(samples, code, severity):
    return samples.get(("fabric_kernel_log_xid_events_total", (("severity", severity), ("xid", code))))


def plain(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)


def test_fixture_counts_every_pattern_and_xid(node):
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_scrape_collector_success", collector="kmsg") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS
    for row in PATTERNS:
        assert event(samples, row.name, row.severity, row.source) == 1, row.name
    assert xid(samples, "13", "non_fatal") == 2
    assert xid(samples, "74", "fatal") == 1
    assert xid(samples, "79", "fatal") == 1
    assert xid(samples, "other", "non_fatal") == 1
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="missing") == 1
    assert plain(samples, "fabric_node_boot_id_changes_total", collector="kmsg") == 0
    stored = json.loads((node / "state" / "kmsg.json").read_text())
    assert stored["boot_id"] == BOOT_A and stored["last_sequence"] == FIXTURE_LAST_SEQUENCE
    # Typed keys in memory, "a|b" texts on disk (what earlier versions wrote and read back).
    assert stored["xids"]["79|fatal"] == 1 and stored["xids"]["other|non_fatal"] == 1


def test_incremental_reads_and_partial_line(node):
    scraper = Scraper(context(node))
    scraper.scrape()
    append(node / "kmsg", "4,23000,700000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n"
                          "4,23001,700000001,-;NETDEV WATCHDOG: eth2 (mlx5_core): transmit queue 1 timed")
    samples = scraper.scrape()
    assert xid(samples, "79", "fatal") == 2
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS + 1
    assert event(samples, "transmit_timeout", "non_fatal", "netdev") == 1   # half a line is not read yet
    append(node / "kmsg", " out 5000 ms\n")
    samples = scraper.scrape()
    assert event(samples, "transmit_timeout", "non_fatal", "netdev") == 2
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS + 2
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="no_separator") is None


def test_restart_does_not_recount(node):
    first = Scraper(context(node))
    first.scrape()
    first.close()
    second = Scraper(context(node))
    samples = second.scrape()
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS
    assert xid(samples, "79", "fatal") == 1
    assert event(samples, "command_timeout", "fatal") == 1
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="missing") == 0
    # Even when the stored file offset is lost, the sequence cursor prevents recounting.
    state_path = node / "state" / "kmsg.json"
    stored = json.loads(state_path.read_text())
    stored["file_offset"], stored["file_identity"] = 0, None
    state_path.write_text(json.dumps(stored))
    append(node / "kmsg", "3,23010,800000000,-;mlx5_core 0000:b3:00.0: cmd_exec timeout\n")
    samples = Scraper(context(node)).scrape()
    assert event(samples, "command_timeout", "fatal") == 2
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS + 1


def test_boot_id_change_resets_cursor(node):
    scraper = Scraper(context(node))
    scraper.scrape()
    (node / "proc" / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_B + "\n")
    # The new boot numbers records from 0 again; they are appended to the same file.
    append(node / "kmsg", "5,0,0,-;Linux version 6.8.0-49-generic\n"
                          "4,5,1000,-;NVRM: Xid (PCI:0000:18:00): 48, pid=0, DBE (double bit error)\n")
    samples = scraper.scrape()
    assert plain(samples, "fabric_node_boot_id_changes_total", collector="kmsg") == 1
    assert xid(samples, "48", "fatal") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS + 2
    stored = json.loads((node / "state" / "kmsg.json").read_text())
    assert (stored["boot_id"], stored["last_sequence"]) == (BOOT_B, 5)
    # After a restart in the same boot nothing is counted twice.
    samples = Scraper(context(node)).scrape()
    assert xid(samples, "48", "fatal") == 1
    assert plain(samples, "fabric_node_boot_id_changes_total", collector="kmsg") == 0


def test_truncated_or_rotated_file_starts_over_without_recount(node):
    scraper = Scraper(context(node))
    scraper.scrape()
    log = node / "kmsg"
    # Rotation that keeps the tail: the old records are skipped by the cursor, the new one counts.
    tail = [line for line in log.read_text().splitlines() if line.startswith("4,22010,")]
    log.write_text(tail[0] + "\n4,24100,900000000,-;NVRM: Xid (PCI:0000:18:00): 95, pid=0, Uncontained ECC\n")
    samples = scraper.scrape()
    assert xid(samples, "79", "fatal") == 1
    assert xid(samples, "95", "fatal") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="file_rotated") == 1
    # Truncated to nothing, then written again.
    log.write_text("")
    scraper.scrape()
    append(log, "4,24200,900000100,-;mlx5_core 0000:b3:00.0: Port module event: module 0, Cable unplugged\n")
    samples = scraper.scrape()
    assert event(samples, "cable_unplugged", "non_fatal") == 2
    # Replaced by a file that is longer than the old offset: the changed head gives it away.
    log.write_text("4,24300,900000200,-;NVRM: Xid (PCI:0000:18:00): 94, pid=0, Contained ECC error\n" + "6,24301,1,-;x\n" * 50)
    samples = scraper.scrape()
    assert xid(samples, "94", "fatal") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="no_separator") is None


def test_malformed_and_non_utf8_lines_are_counted_and_skipped(node):
    with open(node / "kmsg", "ab") as handle:
        handle.write(b"4,23000,1,-;NVRM: Xid (PCI:0000:18:00): 79, caf\xe9\n"
                     b"garbage without separator\n"
                     b"x,y,z,-;bad header\n"
                     b"\x00\x01\x02\n"
                     b"4,23001,2,-;NVRM: Xid (PCI:0000:18:00): 119, pid=0, Timeout after 6s of waiting for RPC\n")
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_scrape_collector_success", collector="kmsg") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="not_utf8") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="no_separator") == 2
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="bad_prefix") == 1
    assert xid(samples, "79", "fatal") == 1
    assert xid(samples, "119", "fatal") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS + 1


def test_corrupt_state_file_is_reported_and_recovered(node):
    first = Scraper(context(node))
    first.scrape()
    first.close()
    state_path = node / "state" / "kmsg.json"
    state_path.write_text('{"boot_id": "6f0c3b8e", "last_seq')
    corrupt = Scraper(context(node))
    samples = corrupt.scrape()
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="corrupt") == 1
    assert plain(samples, "fabric_scrape_collector_success", collector="kmsg") == 1
    assert list((node / "state").glob("kmsg.json.corrupt-*"))   # kept for forensics
    # The log is read from the start again (the cursor was lost) and a valid state written.
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS
    assert json.loads(state_path.read_text())["last_sequence"] == FIXTURE_LAST_SEQUENCE
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="corrupt") == 0
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS


@pytest.mark.parametrize("stored", [
    {"last_sequence": "seven"},
    {"lines": -4},
    {"events": {"mlx5_core|command_timeout|fatal": -3}},
    {"file_identity": [1, 2, 3]},
    {"events": []},
])
def test_state_with_wrong_shape_counts_as_corrupt(node, stored):
    (node / "state").mkdir()
    (node / "state" / "kmsg.json").write_text(json.dumps(stored))
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="corrupt") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS


def test_stored_keys_outside_the_tables_are_dropped(node):
    (node / "state").mkdir()
    (node / "state" / "kmsg.json").write_text(json.dumps({
        "boot_id": BOOT_A, "last_sequence": 5, "lines": 5,
        "events": {"mlx5_core|command_timeout|fatal": 4, "mlx5_core|renamed_pattern|fatal": 2, "no separators": 1},
        "xids": {"79|fatal": 3, "123456|fatal": 1, "79|non_fatal": 1},
    }))
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="corrupt") == 0
    assert event(samples, "command_timeout", "fatal") == 4 + 1
    assert xid(samples, "79", "fatal") == 3 + 1
    assert xid(samples, "79", "non_fatal") is None
    assert not [key for key in samples if "renamed_pattern" in str(key) or "123456" in str(key)]


def test_state_write_failure_is_counted_not_fatal(node):
    (node / "state").write_text("a file where the state directory should be")
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_state_file_write_errors_total", collector="kmsg") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS


def test_absent_source_and_boot_id(tmp_path):
    samples = Scraper(Context(procfs=tmp_path, kmsg=tmp_path / "nope", state_dir=tmp_path / "s", node="")).scrape()
    assert plain(samples, "fabric_scrape_collector_success", collector="kmsg") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="absent") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="boot_id_unreadable") == 1
    # Never read: no event series pretending to be zero.
    assert plain(samples, "fabric_kernel_log_lines_total") is None
    assert event(samples, "command_timeout", "fatal") is None


def test_ten_thousand_line_scrape(node):
    lines = [f"6,{30000 + i},{i},-;eth2: rx queue {i % 64} refill done\n" for i in range(10_000)]
    lines[5000] = "3,35000,5000,-;mlx5_core 0000:b3:00.0: health poll failed\n"
    append(node / "kmsg", "".join(lines))
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS + 10_000
    assert event(samples, "health_compromised", "fatal") == 2


# --- the real /dev/kmsg --------------------------------------------------------------

def _dev_kmsg_problem() -> str | None:
    path = "/dev/kmsg"
    try:
        if not stat.S_ISCHR(os.stat(path).st_mode):
            return "/dev/kmsg is not a character device"
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        return f"/dev/kmsg not readable: {exc.strerror}"
    return None


def test_real_dev_kmsg(tmp_path):
    problem = _dev_kmsg_problem()
    if problem:
        pytest.skip(problem)
    ctx = Context(procfs=Path("/proc"), kmsg=Path("/dev/kmsg"), state_dir=tmp_path / "state", node="")
    first = Scraper(ctx)
    samples = first.scrape()
    first.close()
    lines = plain(samples, "fabric_kernel_log_lines_total")
    assert lines is not None and lines >= 1
    errors = {labels: value for (name, labels), value in samples.items()
              if name == "fabric_kernel_log_read_errors_total" and value}
    # Overwritten records are the ring buffer's normal life, not a read error of ours.
    assert set(errors) <= {(("reason", "records_overwritten"),)}
    cursor = json.loads((tmp_path / "state" / "kmsg.json").read_text())["last_sequence"]
    assert cursor >= 0
    # A restart resumes after the cursor instead of re-reading the ring buffer.
    second = Scraper(ctx)
    again = plain(second.scrape(), "fabric_kernel_log_lines_total")
    second.close()
    assert lines <= again < 2 * lines or lines < 4


def test_unreadable_state_is_reported(node):
    (node / "state" / "kmsg.json").mkdir(parents=True)   # a directory cannot be read as a file
    samples = Scraper(context(node)).scrape()
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="unreadable") == 1
    assert plain(samples, "fabric_state_file_problem", collector="kmsg", problem="corrupt") == 0
    assert plain(samples, "fabric_state_file_write_errors_total", collector="kmsg") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") == FIXTURE_RECORDS


def _settle(path: Path, seconds_ago: float = 3600) -> None:
    """Give the file an mtime well past the filesystem clock's tick (as a quiet log has)."""
    old = time.time_ns() - int(seconds_ago * 1e9)
    os.utime(path, ns=(old, old))


def test_a_quiet_file_costs_a_stat_and_what_changes_it_is_still_read(node, monkeypatch):
    """FileSource: a settled file that neither grew nor changed is not opened again; an
    append, a same-size rewrite and a replacement are each read as before."""
    from fabricscope.exporter.collectors import kmsg as module

    log = node / "kmsg"
    _settle(log)
    scraper = Scraper(context(node))
    assert plain(scraper.scrape(), "fabric_kernel_log_lines_total") == FIXTURE_RECORDS
    opened = []
    real = module.read_file_records
    monkeypatch.setattr(module, "read_file_records", lambda *args: opened.append(1) or real(*args))
    for _ in range(3):
        assert plain(scraper.scrape(), "fabric_kernel_log_lines_total") == FIXTURE_RECORDS
    assert opened == []
    append(log, "4,23000,700000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n")
    _settle(log)
    samples = scraper.scrape()
    assert xid(samples, "79", "fatal") == 2 and opened == [1]
    # Rewritten in place to the same size: the mtime moved, so the head is checked.
    text = log.read_bytes()
    line = b"4,23001,700000001,-;NVRM: Xid (PCI:0000:18:00): 94, pid=0, Contained ECC error\n"
    log.write_bytes(line + text[len(line):])
    samples = scraper.scrape()
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="file_rotated") == 1
    assert xid(samples, "94", "fatal") == 1


def test_a_fifo_as_the_log_is_a_read_error_and_blocks_nothing(tmp_path):
    root = tmp_path / "node"
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True)
    shutil.copy(FIXTURE / "proc" / "sys" / "kernel" / "random" / "boot_id", root / "proc" / "sys" / "kernel" / "random")
    os.mkfifo(root / "kmsg")
    samples = Scraper(context(root)).scrape()
    assert plain(samples, "fabric_scrape_collector_success", collector="kmsg") == 1
    assert plain(samples, "fabric_kernel_log_read_errors_total", reason="not_a_file") == 1
    assert plain(samples, "fabric_kernel_log_lines_total") is None
