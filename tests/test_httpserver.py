"""The shared HTTP server (fabricscope/httpserver.py: the exporter, the webhook receiver, the
sidecar) against request bodies sent slowly and framed badly, over real sockets: a body
slower than the minimum rate gets a 408 and its connection is closed; one that keeps the
rate is taken even when it takes longer than the grace period; malformed chunked framing
is a 400 with nothing riding behind it."""
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
                chunk = sock.recv(65536)
                assert chunk, reply                # the server closed before the answer
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 200")


# ---- chunked bodies: framing read strictly ----------------------------------------------------

def read_to_close(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    reply = b""
    try:
        while chunk := sock.recv(65536):
            reply += chunk
    except ConnectionResetError:
        pass
    return reply


def exchange(server, raw: bytes, timeout: float = 10) -> bytes:
    """Send `raw` on a new connection, then read until the server closes it."""
    sock = socket.create_connection((server.host, server.port), timeout=timeout)
    with sock:
        try:
            sock.sendall(raw)
        except OSError:
            pass                                   # refused part-way: the reply is still there
        return read_to_close(sock)


CHUNKED = b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_chunk_size_line_without_end_is_refused_after_the_header_limit(server):
    # 2 MB of hex digits and no line end: the size line is not buffered whole.
    reply = exchange(server, CHUNKED + b"1" * 2_000_000)
    assert reply.startswith(b"HTTP/1.1 400") and b"malformed request body" in reply, reply[:200]


@pytest.mark.parametrize("size", [b"-1", b"0x2", b"+2", b"1_0", b"zz", b""])
def test_a_chunk_size_that_is_not_hex_digits_is_a_400_and_nothing_rides_behind_it(server, size):
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n"
    reply = exchange(server, CHUNKED + size + b"\r\n{}\r\n0\r\n\r\n" + smuggled)
    assert reply.startswith(b"HTTP/1.1 400") and b"malformed request body" in reply, reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 1, reply


def test_chunked_bodies_with_trailers_leave_the_connection_ready_for_the_next_request(server):
    sock = socket.create_connection((server.host, server.port), timeout=15)
    with sock:
        for body, length in ((b"5\r\nhello\r\n0\r\n\r\n", b"5"), (b"3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n", b"3")):
            sock.sendall(CHUNKED + body)
            reply = b""
            while not reply.endswith(b"\r\n\r\n" + length + b"\n"):
                chunk = sock.recv(65536)
                assert chunk, reply
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 200"), reply
        started = time.monotonic()
        sock.sendall("POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nok".encode())
        reply = sock.recv(65536)
        # Answered at once on the same connection: no CRLF left over to be read as a request.
        assert reply.startswith(b"HTTP/1.1 200") and time.monotonic() - started < 2, reply


def test_a_chunked_body_over_the_limit_is_a_413(server):
    # A chunk of 8 MiB announced and sent: refused once the server's 4 MiB are exceeded.
    reply = exchange(server, CHUNKED + b"%x\r\n" % (8 << 20) + b"a" * (8 << 20))
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_a_stalled_tls_handshake_is_closed_at_the_header_deadline_without_a_reply(tmp_path):
    """A ClientHello cut short: there is no HTTP to answer in, so no 408 is written (writing
    it re-entered the handshake and held the worker another full timeout)."""
    import ssl

    from fabricscope.devcerts import ensure_dev_certs

    certs = ensure_dev_certs(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.cert, certs.key)
    with HttpServer(echo_length, threads=1, timeout=1.0, ssl_context=context) as tls:
        sock = socket.create_connection((tls.host, tls.port), timeout=10)
        with sock:
            sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")   # the first bytes of a ClientHello
            started = time.monotonic()
            received = read_to_close(sock)
            took = time.monotonic() - started
    assert received == b"" and took < 1.8, (received, took)


def test_worker_threads_hand_back_results_and_errors_and_stay_within_their_count():
    """The pool's threads: each call's outcome reaches the awaiting request (an exception
    as itself), no more threads run than the pool's size however many calls wait, and a
    shutdown ends them."""
    import asyncio
    import threading

    from fabricscope.httpadmission import WorkerThreads

    threads = WorkerThreads("test-pool", 2)
    running, most = [0], [0]
    lock = threading.Lock()

    def work(value):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        if value == "boom":
            raise ValueError("boom")
        return value * 2

    async def main():
        outcomes = await asyncio.gather(*(threads.run(work, n) for n in range(6)), threads.run(work, "boom"),
                                        return_exceptions=True)
        return outcomes

    outcomes = asyncio.run(main())
    assert outcomes[:6] == [0, 2, 4, 6, 8, 10]
    assert isinstance(outcomes[6], ValueError) and str(outcomes[6]) == "boom"
    assert most[0] == 2
    named = [t for t in threading.enumerate() if t.name.startswith("test-pool-")]
    assert len(named) == 2 and all(t.daemon for t in named)
    threads.shutdown()
    for thread in named:
        thread.join(5)
    assert not any(t.is_alive() for t in named)


# ---- a full server: the oldest idle connection goes first; trusted sources' slots ----------

def answer_ok(environ, start_response):
    return respond(start_response, 200, b"ok\n", "text/plain")


def get_from(server, source: str, keep: list | None = None) -> int | None:
    """One GET from `source` on a new connection (kept open in `keep` when given); its
    status, or None when the server closed the connection unanswered."""
    sock = socket.create_connection((server.host, server.port), timeout=5, source_address=(source, 0))
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        reply = b""
        while not reply.endswith(b"ok\n"):
            chunk = sock.recv(4096)
            if not chunk:
                return None
            reply += chunk
        return int(reply.split()[1])
    except (ConnectionResetError, socket.timeout):
        return None
    finally:
        if keep is None:
            sock.close()
        else:
            keep.append(sock)


def test_when_full_the_oldest_connection_without_a_request_is_dropped_for_a_new_one():
    from fabricscope.httpadmission import TrustedSources

    with HttpServer(answer_ok, threads=2, timeout=5, max_connections=40,
                    trusted_sources=TrustedSources(["127.0.0.3"])) as server:
        assert server.connections.total == 40 and server.connections.reserved == 2
        silent = []
        for i in range(60):                 # a crowd arriving (not one burst accepted at once)
            silent.append(socket.create_connection((server.host, server.port),
                                                   source_address=(f"127.0.0.{10 + i % 50}", 0)))
            time.sleep(0.01)
        try:
            time.sleep(0.5)
            assert get_from(server, "127.0.0.2") == 200
            assert server.connections.evicted >= 20
            # Silent ones were dropped, oldest first: the first socket is closed by now.
            silent[0].settimeout(2)
            assert silent[0].recv(1) == b""
        finally:
            for sock in silent:
                sock.close()


def test_trusted_sources_find_slots_that_connections_in_use_hold_everywhere_else():
    from fabricscope.httpadmission import TrustedSources

    with HttpServer(answer_ok, threads=2, timeout=5, max_connections=40,
                    trusted_sources=TrustedSources(["127.0.0.3"])) as server:
        in_use: list[socket.socket] = []
        try:
            # 38 kept-alive connections that each completed a request: none may be dropped.
            statuses = [get_from(server, f"127.0.0.{10 + i}", keep=in_use) for i in range(38)]
            assert statuses == [200] * 38
            assert get_from(server, "127.0.0.2") is None          # the untrusted share is full
            assert get_from(server, "127.0.0.3") == 200           # the scraper's slot
        finally:
            for sock in in_use:
                sock.close()
