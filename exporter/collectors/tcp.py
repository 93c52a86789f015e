"""TCP and UDP counters from <procfs>/net/snmp and <procfs>/net/netstat.

Readable unprivileged on every kernel, so this is the TCP signal that remains when eBPF
is unavailable. A field the kernel does not have is an absent series. A file or section
that cannot be parsed is reported in fabric_tcp_procfs_read_errors{file,reason} and the
rest is still exported.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..framework import Collector, SampleCache, register
from ..parsers.files import ReadProblem, read_text
from ..parsers.snmp import SnmpFile, parse_snmp


class Field(NamedTuple):
    file: str           # "snmp" or "netstat"
    section: str        # header prefix in that file
    name: str           # field name in that section
    metric: str         # exported name
    gauge: bool
    help: str


def _counter(file, section, name, metric, help_):
    return Field(file, section, name, metric, False, f"{help_} ({section} {name}).")


FIELDS: tuple[Field, ...] = (
    _counter("snmp", "Tcp", "ActiveOpens", "fabric_tcp_active_opens", "Connections opened by this host (SYN sent)"),
    _counter("snmp", "Tcp", "PassiveOpens", "fabric_tcp_passive_opens", "Connections accepted by this host"),
    _counter("snmp", "Tcp", "AttemptFails", "fabric_tcp_attempt_fails", "Connection attempts that failed"),
    _counter("snmp", "Tcp", "EstabResets", "fabric_tcp_established_resets", "Established connections reset"),
    Field("snmp", "Tcp", "CurrEstab", "fabric_tcp_established", True,
          "Connections currently ESTABLISHED or CLOSE-WAIT (Tcp CurrEstab)."),
    _counter("snmp", "Tcp", "InSegs", "fabric_tcp_in_segments", "Segments received"),
    _counter("snmp", "Tcp", "OutSegs", "fabric_tcp_out_segments", "Segments sent, excluding retransmissions"),
    _counter("snmp", "Tcp", "RetransSegs", "fabric_tcp_retransmitted_segments", "Segments retransmitted"),
    _counter("snmp", "Tcp", "InErrs", "fabric_tcp_in_errors", "Segments received in error"),
    _counter("snmp", "Tcp", "OutRsts", "fabric_tcp_out_resets", "Segments sent with RST"),
    _counter("snmp", "Tcp", "InCsumErrors", "fabric_tcp_in_checksum_errors", "Segments received with a bad checksum"),
    _counter("netstat", "TcpExt", "TCPTimeouts", "fabric_tcp_timeouts", "Retransmission timeouts (RTO fired)"),
    _counter("netstat", "TcpExt", "TCPSynRetrans", "fabric_tcp_syn_retransmits", "SYN and SYN-ACK retransmissions"),
    _counter("netstat", "TcpExt", "TCPLostRetransmit", "fabric_tcp_lost_retransmits", "Retransmissions that were lost again"),
    _counter("netstat", "TcpExt", "TCPFastRetrans", "fabric_tcp_fast_retransmits", "Fast retransmissions"),
    _counter("netstat", "TcpExt", "TCPSlowStartRetrans", "fabric_tcp_slow_start_retransmits",
             "Retransmissions in slow start"),
    _counter("netstat", "TcpExt", "TCPSpuriousRTOs", "fabric_tcp_spurious_rtos", "RTOs later found spurious"),
    _counter("netstat", "TcpExt", "TCPLossProbes", "fabric_tcp_loss_probes", "Tail loss probes sent"),
    _counter("netstat", "TcpExt", "TCPRetransFail", "fabric_tcp_retransmit_failures",
             "Retransmissions the stack failed to send"),
    _counter("netstat", "TcpExt", "TCPSackRecovery", "fabric_tcp_sack_recoveries", "SACK-based loss recoveries"),
    _counter("netstat", "TcpExt", "ListenOverflows", "fabric_tcp_listen_overflows", "Accept queue overflows"),
    _counter("netstat", "TcpExt", "ListenDrops", "fabric_tcp_listen_drops", "SYNs dropped at a listening socket"),
    _counter("netstat", "TcpExt", "TCPReqQFullDrop", "fabric_tcp_syn_queue_full_drops", "SYNs dropped, SYN queue full"),
    _counter("netstat", "TcpExt", "TCPAbortOnTimeout", "fabric_tcp_aborts_on_timeout",
             "Connections aborted after too many retransmission timeouts"),
    _counter("netstat", "TcpExt", "TCPAbortOnData", "fabric_tcp_aborts_on_data",
             "Connections reset because data arrived after close"),
    _counter("netstat", "TcpExt", "TCPAbortOnMemory", "fabric_tcp_aborts_on_memory",
             "Connections aborted under memory pressure"),
    _counter("netstat", "TcpExt", "TCPRcvQDrop", "fabric_tcp_receive_queue_drops",
             "Segments dropped because the receive queue was full"),
    _counter("netstat", "TcpExt", "TCPBacklogDrop", "fabric_tcp_backlog_drops",
             "Segments dropped because the socket backlog was full"),
    _counter("netstat", "TcpExt", "TCPZeroWindowDrop", "fabric_tcp_zero_window_drops",
             "Segments dropped because the receive window was zero"),
    _counter("netstat", "TcpExt", "TCPOFOQueue", "fabric_tcp_out_of_order_queued", "Segments queued out of order"),
    _counter("netstat", "TcpExt", "TCPOFODrop", "fabric_tcp_out_of_order_drops",
             "Out-of-order segments dropped for lack of memory"),
    _counter("netstat", "TcpExt", "TCPMemoryPressures", "fabric_tcp_memory_pressures",
             "Times the stack entered memory pressure"),
    _counter("netstat", "TcpExt", "PruneCalled", "fabric_tcp_prune_called",
             "Receive queues pruned for lack of memory"),
    _counter("snmp", "Udp", "InDatagrams", "fabric_udp_in_datagrams", "Datagrams delivered"),
    _counter("snmp", "Udp", "OutDatagrams", "fabric_udp_out_datagrams", "Datagrams sent"),
    _counter("snmp", "Udp", "NoPorts", "fabric_udp_no_ports", "Datagrams to a port nobody listens on"),
    _counter("snmp", "Udp", "InErrors", "fabric_udp_in_errors", "Datagrams that could not be delivered"),
    _counter("snmp", "Udp", "RcvbufErrors", "fabric_udp_receive_buffer_errors",
             "Datagrams dropped, receive buffer full"),
    _counter("snmp", "Udp", "SndbufErrors", "fabric_udp_send_buffer_errors", "Datagrams dropped, send buffer full"),
    _counter("snmp", "Udp", "InCsumErrors", "fabric_udp_in_checksum_errors", "Datagrams with a bad checksum"),
)

FILES = ("snmp", "netstat")
# The sections FIELDS reads, per file: only those are parsed.
SECTIONS = {file: frozenset(field.section for field in FIELDS if field.file == file) for file in FILES}


@register
class TcpCollector(Collector):
    name = "tcp"
    description = "TCP/UDP counters from /proc/net/snmp and /proc/net/netstat."
    serves_unchanged_samples = True   # expose() through its own SampleCache

    def __init__(self, ctx) -> None:
        super().__init__(ctx)
        self.samples = SampleCache()
        self.paths = {file: ctx.procfs / "net" / file for file in FILES}

    def collect(self) -> Iterable[Metric]:
        self.samples.next_scrape()
        parsed: dict[str, SnmpFile] = {}
        errors = []
        for file in FILES:
            text = read_text(self.paths[file])
            if isinstance(text, ReadProblem):
                errors.append(((file, text.reason), 1))
                continue
            parsed[file] = parse_snmp(text, SECTIONS[file])
            for reason, count in sorted(Counter(problem.reason for problem in parsed[file].problems).items()):
                errors.append(((file, reason), count))
        yield from expose(parsed, self.samples)
        yield self.samples.family(GaugeMetricFamily, "fabric_tcp_procfs_read_errors",
                                  "Problems reading /proc/net/snmp or /proc/net/netstat on this scrape.",
                                  ("file", "reason"), errors)


def expose(parsed: dict[str, SnmpFile], cache: SampleCache) -> Iterable[Metric]:
    for field in FIELDS:
        source = parsed.get(field.file)
        value = source.get(field.section, field.name) if source is not None else None
        if value is None:
            continue
        yield cache.family(GaugeMetricFamily if field.gauge else CounterMetricFamily, field.metric, field.help,
                           (), (((), value),))
