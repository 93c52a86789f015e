"""tcp collector: /proc/net/snmp + /proc/net/netstat header/value pairs."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from fabricscope.exporter.collectors.tcp import FIELDS
from fabricscope.exporter.context import Context
from fabricscope.exporter.framework import ScrapeCollector, build_collectors, load_collector_modules
from fabricscope.exporter.parsers.snmp import parse_snmp

FIXTURE = Path(__file__).parent / "fixtures" / "node"


def scrape(procfs: Path) -> CollectorRegistry:
    load_collector_modules()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ScrapeCollector(build_collectors(Context(procfs=procfs, node=""), ["tcp"])))
    return registry


@pytest.fixture
def procfs(tmp_path) -> Path:
    shutil.copytree(FIXTURE / "proc" / "net", tmp_path / "net")
    return tmp_path


@pytest.mark.parametrize("text, sections, problems", [
    ("Tcp: A B\nTcp: 1 -2\n", {"Tcp": {"A": 1, "B": -2}}, []),
    ("Tcp: A B C\nTcp: 1 2\nUdp: X\nUdp: 5\n", {"Udp": {"X": 5}}, [("Tcp", "length_mismatch", "3 names but 2 values")]),
    ("Tcp: A B\nTcp: 1 2 3\n", {}, [("Tcp", "length_mismatch", "2 names but 3 values")]),
    ("Tcp: A B\nUdp: X\nUdp: 7\n", {"Udp": {"X": 7}}, [("Tcp", "prefix_mismatch", "followed by 'Udp'")]),
    ("Udp: X\nUdp: 7\nTcp: A B\n", {"Udp": {"X": 7}}, [("Tcp", "unpaired_line", "no value line")]),
    ("Tcp: A B\nTcp: 1 x\n", {}, [("Tcp", "not_a_number", "'x'")]),
    ("nonsense without colon\nTcp: A\nTcp: 4\n", {"Tcp": {"A": 4}}, [("?", "no_prefix", "line 1")]),
    ("Tcp: A\nTcp: 1\nTcp: A\nTcp: 2\n", {"Tcp": {"A": 1}}, [("Tcp", "duplicate_section", "first kept")]),
    ("", {}, []),
    ("\n\nTcp: A\n\nTcp: 9\n", {"Tcp": {"A": 9}}, []),
])
def test_parse_snmp_table(text, sections, problems):
    parsed = parse_snmp(text)
    assert parsed.sections == sections
    assert [(p.section, p.reason) for p in parsed.problems] == [(s, r) for s, r, _ in problems]
    for problem, (_, _, detail) in zip(parsed.problems, problems):
        assert detail in str(problem)


def test_fixture_counters():
    registry = scrape(FIXTURE / "proc")
    get = registry.get_sample_value
    assert get("fabric_scrape_collector_success", {"collector": "tcp"}) == 1
    assert get("fabric_tcp_retransmitted_segments_total") == 123457
    assert get("fabric_tcp_out_segments_total") == 876543210
    assert get("fabric_tcp_in_segments_total") == 987654321
    assert get("fabric_tcp_in_errors_total") == 12
    assert get("fabric_tcp_out_resets_total") == 4567
    assert get("fabric_tcp_active_opens_total") == 48213
    assert get("fabric_tcp_passive_opens_total") == 15022
    assert get("fabric_tcp_attempt_fails_total") == 311
    assert get("fabric_tcp_established_resets_total") == 902
    assert get("fabric_tcp_established") == 187
    assert get("fabric_tcp_timeouts_total") == 2345
    assert get("fabric_tcp_syn_retransmits_total") == 77
    assert get("fabric_tcp_lost_retransmits_total") == 19
    assert get("fabric_tcp_fast_retransmits_total") == 8800
    assert get("fabric_tcp_slow_start_retransmits_total") == 150
    assert get("fabric_tcp_listen_overflows_total") == 6
    assert get("fabric_tcp_listen_drops_total") == 9
    assert get("fabric_tcp_aborts_on_timeout_total") == 4
    assert get("fabric_tcp_receive_queue_drops_total") == 1
    assert get("fabric_tcp_backlog_drops_total") == 5
    assert get("fabric_tcp_out_of_order_queued_total") == 31337
    assert get("fabric_tcp_sack_recoveries_total") == 640
    assert get("fabric_udp_in_errors_total") == 41
    assert get("fabric_udp_receive_buffer_errors_total") == 39
    assert get("fabric_udp_send_buffer_errors_total") == 2
    assert get("fabric_tcp_procfs_read_errors", {"file": "snmp", "reason": "length_mismatch"}) is None


def test_missing_netstat_keeps_snmp_counters(procfs):
    (procfs / "net" / "netstat").unlink()
    registry = scrape(procfs)
    get = registry.get_sample_value
    assert get("fabric_tcp_procfs_read_errors", {"file": "netstat", "reason": "absent"}) == 1
    assert get("fabric_tcp_retransmitted_segments_total") == 123457
    assert get("fabric_tcp_timeouts_total") is None   # absent file: absent series, not 0


def test_broken_tcp_section_keeps_udp_and_tcpext(procfs):
    snmp = procfs / "net" / "snmp"
    lines = snmp.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith("Tcp:") and "RetransSegs" not in line)
    lines[index] += " 99"                                 # one value too many
    snmp.write_text("\n".join(lines) + "\n")
    registry = scrape(procfs)
    get = registry.get_sample_value
    assert get("fabric_tcp_procfs_read_errors", {"file": "snmp", "reason": "length_mismatch"}) == 1
    assert get("fabric_tcp_retransmitted_segments_total") is None
    assert get("fabric_udp_in_errors_total") == 41
    assert get("fabric_tcp_timeouts_total") == 2345


def test_older_kernel_without_a_field_has_no_series(procfs):
    netstat = procfs / "net" / "netstat"
    header, values, *rest = netstat.read_text().splitlines()
    names, numbers = header.split()[1:], values.split()[1:]
    drop = names.index("TCPRcvQDrop")
    del names[drop], numbers[drop]
    netstat.write_text("\n".join(["TcpExt: " + " ".join(names), "TcpExt: " + " ".join(numbers), *rest]) + "\n")
    registry = scrape(procfs)
    assert registry.get_sample_value("fabric_tcp_receive_queue_drops_total") is None
    assert registry.get_sample_value("fabric_tcp_backlog_drops_total") == 5


def test_real_procfs_parses_cleanly():
    snmp, netstat = Path("/proc/net/snmp"), Path("/proc/net/netstat")
    if not (snmp.exists() and netstat.exists()):
        pytest.skip("no /proc/net/snmp or /proc/net/netstat on this host")
    for path in (snmp, netstat):
        assert parse_snmp(path.read_text()).problems == []
    registry = scrape(Path("/proc"))
    assert registry.get_sample_value("fabric_tcp_established") is not None
    assert registry.get_sample_value("fabric_tcp_out_segments_total") >= 0


def test_field_table_metric_names_are_unique_and_well_formed():
    names = [field.metric for field in FIELDS]
    assert len(names) == len(set(names))
    assert all(name.startswith(("fabric_tcp_", "fabric_udp_")) and not name.endswith("_total") for name in names)


def test_only_the_wanted_sections_are_parsed():
    """The collector parses the sections its fields read (Tcp, Udp, TcpExt); another
    section, even a broken one, is paired up and skipped, neither converted nor reported."""
    text = ("Ip: Forwarding DefaultTTL\nIp: 1 x\n"
            "Tcp: MaxConn ActiveOpens\nTcp: -1 7\n"
            "IcmpMsg: InType3\nIcmpMsg: 5 6\n"
            "Udp: InDatagrams\nUdp: 9\n")
    everything = parse_snmp(text)
    assert sorted(p.section for p in everything.problems) == ["IcmpMsg", "Ip"]
    wanted = parse_snmp(text, frozenset({"Tcp", "Udp"}))
    assert wanted.sections == {"Tcp": {"MaxConn": -1, "ActiveOpens": 7}, "Udp": {"InDatagrams": 9}}
    assert wanted.problems == []
    broken_wanted = parse_snmp("Tcp: MaxConn ActiveOpens\nTcp: -1 x7\n", frozenset({"Tcp"}))
    assert [p.reason for p in broken_wanted.problems] == ["not_a_number"]
