"""The shared HTTP server (fabricscope/httpserver.py: the exporter, the webhook receiver, the
sidecar) against request bodies sent slowly, over real sockets: a body slower than the
minimum rate gets a 408 and its connection is closed; one that keeps the rate is taken
even when it takes longer than the grace period."""
from __future__ import annotations

import socket
import time

import pytest

from fabricscope.httpserver import HttpServer, read_body, respond

GRACE = 1.0          # body_timeout
MIN_RATE = 1000      # bytes a second, each one more second


def echo_length(environ, start_response):
    body = read_body(environ, 1 << 20)
    if body is None:
        return respond(start_response, 413, b"too large\n", "text/plain")
    return respond(start_response, 200, f"{len(body)}\n".encode(), "text/plain")


@pytest.fixture(scope="module")
def server():
    with HttpServer(echo_length, threads=2, timeout=5, body_timeout=GRACE, body_min_rate=MIN_RATE) as running:
        yield running


def post(server, length: int, parts: list[bytes], pause: float) -> tuple[bytes, float]:
    """Send the headers, then `parts` of the body `pause` s apart; the reply and how long
    until it was complete: a 200 with its body, anything else once the server closed
    the connection (a socket timeout fails the test)."""
    sock = socket.create_connection((server.host, server.port), timeout=15)
    with sock:
        sock.sendall(f"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n".encode())
        started = time.monotonic()
        try:
            for part in parts:
                sock.sendall(part)
                time.sleep(pause)
        except OSError:
            pass                                   # the server gave up and closed
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
            if reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\n") and b"\r\n\r\n" in reply:
                break
        return reply, time.monotonic() - started


def test_a_body_slower_than_the_minimum_rate_gets_a_408(server):
    # 10 bytes every 0.25 s: 40 bytes a second, each read far inside the 5 s read timeout.
    reply, took = post(server, 100_000, [b"x" * 10] * 40, 0.25)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert took < GRACE + 3                        # answered, and the connection closed


def test_a_body_that_keeps_the_rate_is_taken_though_it_outlasts_the_grace_period(server):
    # 1,500 bytes every 0.5 s: 3,000 bytes a second, twice the minimum, over 2 s.
    reply, took = post(server, 6000, [b"y" * 1500] * 4, 0.5)
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n6000\n"), reply
    assert took > GRACE


def test_a_fast_body_and_the_next_request_on_the_connection(server):
    sock = socket.create_connection((server.host, server.port), timeout=15)
    with sock:
        for size in (200_000, 10):
            sock.sendall(f"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: {size}\r\n\r\n".encode() + b"z" * size)
            reply = b""
            while not reply.endswith(f"{size}\n".encode()):
                reply += sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200")
