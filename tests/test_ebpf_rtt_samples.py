"""The tcp program's RTT samples on the real kernel: which side took them, what the excess
histogram keeps, and the network-namespace filter (root; netns, veth, tbf).

A request/response flow (64 bytes every 10 ms) with a few one-way 600-byte messages, then
two seconds of bulk, across a shaped link between two namespaces (tests/rtt_lab.py),
watched by an ebpf collector that counts only those namespaces. About 8 seconds.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tests.rtt_lab import BulkFlow, Lab
from tests.test_ebpf_kernel import EchoServer, collector, built, scrape  # noqa: F401  (fixtures)
from tests.conftest import require_tool

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists(),
                                reason="needs root and kernel BTF (/sys/kernel/btf/vmlinux)")

KINDS = ("several_segments", "reply", "next_request", "delayed_ack")


def _counts(c) -> dict[str, float]:
    reg = scrape(c)
    counts = {k: reg.get_sample_value("fabric_tcp_rtt_samples_total", {"kind": k}) or 0.0 for k in KINDS}
    counts["excess"] = reg.get_sample_value("fabric_tcp_rtt_excess_seconds_count") or 0.0
    counts["excess_under_2ms"] = reg.get_sample_value("fabric_tcp_rtt_excess_seconds_bucket", {"le": "0.002048"}) or 0.0
    counts["srtt"] = reg.get_sample_value("fabric_tcp_rtt_seconds_count") or 0.0
    counts["srtt_under_4ms"] = reg.get_sample_value("fabric_tcp_rtt_seconds_bucket", {"le": "0.004096"}) or 0.0
    return counts


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


@pytest.fixture
def lab(tmp_path):
    for tool in ("ip", "tc"):
        require_tool(tool, "iproute2")
    lab = Lab("samples", 200, tmp_path, bulk=[BulkFlow(0.5, 2.5, rate=6000, chunk=600), BulkFlow(3.5, 5.5)])
    lab.up()
    yield lab
    lab.down()


def test_request_response_server_samples_stay_out_of_the_excess_and_other_namespaces_are_not_counted(collector, lab):  # noqa: F811 - the fixture imported above
    c = collector({"tcp_rtt_network_namespaces": lab.namespaces})
    before = _counts(c)
    lab.start_traffic(time.time())
    time.sleep(3)
    quiet = _delta(_counts(c), before)     # request/response and the one-way messages
    time.sleep(3.5)
    lab.stop_traffic()
    d = _delta(_counts(c), before)
    exchanges = len(lab.app_rtts(0, 10))
    assert exchanges > 200
    # Every exchange gives one sample on each side, each an ACK of one lone 64-byte segment
    # riding on data: the client's on the reply, the server's on the next request.
    assert d["reply"] >= 0.9 * exchanges
    assert d["next_request"] >= 0.9 * exchanges
    # The one-way messages are acknowledged by pure ACKs, which a receiver may delay.
    assert quiet["delayed_ack"] >= 5
    # The bulk sender's ACKs cover several segments.
    assert d["several_segments"] > 100
    # The server's samples of the client's think time and the possibly delayed pure ACKs are
    # left out of the excess, nothing else.
    assert d["excess"] == d["several_segments"] + d["reply"]
    # Request/response alone: smoothed RTT carries the think time (10 ms), the excess does not.
    assert quiet["srtt_under_4ms"] < 0.9 * quiet["srtt"]
    assert quiet["excess_under_2ms"] >= 0.95 * quiet["excess"] > 100
    # The bulk flow fills the 80 ms queue: its samples' excess is the queue.
    burst = _delta(d, quiet)
    assert burst["excess"] - burst["excess_under_2ms"] > 0.5 * burst["several_segments"]

    # Loopback traffic in this (host) namespace is not counted.
    before = _counts(c)
    server = EchoServer()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            for _ in range(50):
                conn.sendall(b"x" * 64)
                conn.recv(64)
    finally:
        server.close()
    after = _counts(c)
    assert after == before


def test_a_missing_namespace_file_is_refused_with_its_path():
    from fabricscope.exporter.config import EbpfSection

    with pytest.raises(ValueError, match="/run/netns/no-such-namespace"):
        EbpfSection.model_validate({"tcp_rtt_network_namespaces": ["/run/netns/no-such-namespace"]})
