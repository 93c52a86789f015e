"""What the tests of the installed artefacts (the wheel, the image, the compose file)
share: reading a running exporter's /metrics, and loopback TCP traffic for its eBPF
programs to see."""
from __future__ import annotations

import socket

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
