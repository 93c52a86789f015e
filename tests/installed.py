"""What the tests of the installed artefacts (the wheel, the image, the compose file)
share: reading a running exporter's /metrics, and loopback TCP traffic for its eBPF
programs to see."""
from __future__ import annotations

import os
import socket
import subprocess
import textwrap
import time
from typing import Callable

import requests
from prometheus_client.parser import text_string_to_metric_families


def samples(url: str) -> dict[tuple[str, frozenset], float]:
    """(name, labels) -> value, from one scrape of `url`."""
    found = {}
    for family in text_string_to_metric_families(requests.get(url, timeout=10).text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def label_values(found: dict, name: str, label: str) -> set[str]:
    return {dict(labels).get(label) for (sample, labels) in found if sample == name}


def loopback_traffic(connections: int = 20, round_trips: int = 5) -> None:
    """`connections` TCP connections on 127.0.0.1, each with `round_trips` echoed writes:
    every one gives the TCP programs a connect and RTT samples."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        for _ in range(connections):
            with socket.create_connection(server.getsockname()) as client, server.accept()[0] as peer:
                for _ in range(round_trips):
                    client.sendall(b"x" * 512)
                    peer.sendall(peer.recv(4096))
                    assert client.recv(4096)


def loopback_retransmits(retransmitted: Callable[[], bool], timeout: float = 5) -> bool:
    """Make TCP on 127.0.0.1 retransmit: a connection whose segments an nftables rule
    drops after a warm-up exchange. Polls `retransmitted` until it holds or `timeout`
    passes (the RTO is >= 200 ms); what it last returned. Needs root and `nft`."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        table = f"fabric_test_{os.getpid()}_{port}"
        with socket.create_connection(("127.0.0.1", port)) as client, server.accept()[0] as peer:
            client.sendall(b"warm-up")
            peer.sendall(peer.recv(100))
            client.recv(100)
            subprocess.run(["nft", "-f", "-"], check=True, text=True, input=textwrap.dedent(f"""
                table inet {table} {{
                    chain in {{
                        type filter hook input priority 0; policy accept;
                        tcp dport {port} drop
                    }}
                }}
            """))
            try:
                client.sendall(b"lost" * 100)
                deadline = time.monotonic() + timeout
                while not (done := retransmitted()) and time.monotonic() < deadline:
                    time.sleep(0.2)
                return done
            finally:
                subprocess.run(["nft", "delete", "table", "inet", table], check=False)
