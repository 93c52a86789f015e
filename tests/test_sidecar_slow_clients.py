"""`fabricscope sidecar` against slow and silent clients, over real sockets and real TLS:
connections that never send a byte (not even a TLS ClientHello), requests cut off halfway,
headers trickled a byte at a time and bodies sent slower than the minimum rate must not
stop a new client from being served; the server closes them itself. Also its shutdown on
SIGTERM and a port already taken."""
from __future__ import annotations

import signal
import socket
import ssl
import select
import subprocess
import time

import pytest
import requests

from fabricscope.demo.stack import free_port
from fabricscope.demo.stack.sidecar import sidecar_argv, start_sidecar
from tests.sidecar_helpers import make_keys

CLIENT_TIMEOUT = 2      # --client-timeout: the server gives up on a slow client after this
THREADS = 4
SILENT = 40
HALF_SENT = THREADS + 4  # more than the worker threads


@pytest.fixture(scope="module", params=["tls", "plain"])
def sidecar(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(f"slow-{request.param}")
    tokens = make_keys(workdir / "keys.yaml")
    process = start_sidecar(workdir, "127.0.0.1", free_port(), f"http://127.0.0.1:{free_port()}",
                            workdir / "keys.yaml", tls=request.param == "tls",
                            extra_args=["--threads", str(THREADS), "--client-timeout", str(CLIENT_TIMEOUT)])
    process.tokens = tokens
    yield process
    process.stop()


def port_of(sidecar) -> int:
    return int(sidecar.url.rsplit(":", 1)[1])


def versions_within(sidecar, seconds: float) -> None:
    started = time.monotonic()
    verify = str(sidecar.certs.ca) if sidecar.certs else True
    reply = requests.get(sidecar.url + "/api/versions", verify=verify, timeout=seconds)
    assert reply.status_code == 200 and "version" in reply.json()
    assert time.monotonic() - started < seconds


def open_connections(port: int, count: int, send: bytes = b"") -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        if send:
            sock.sendall(send)
        socks.append(sock)
    return socks


def closed_by_server(sock: socket.socket, within: float) -> bytes | None:
    """What the server sent before closing `sock` (None: still open after `within` s)."""
    sock.settimeout(within)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return received


def test_silent_and_half_sent_connections_do_not_stop_a_new_client(sidecar):
    port = port_of(sidecar)
    held = open_connections(port, SILENT)
    try:
        versions_within(sidecar, 15)
        # Half a request on more connections than there are worker threads: for TLS this
        # is not even a ClientHello, for plain HTTP it holds a worker until the deadline.
        held += open_connections(port, HALF_SENT, b"GET /api/v1/health HTTP/1.1\r\nHo")
        versions_within(sidecar, 15)
    finally:
        for sock in held:
            sock.close()


def test_the_server_closes_connections_that_stay_silent(sidecar):
    silent = open_connections(port_of(sidecar), 3)
    try:
        for sock in silent:
            assert closed_by_server(sock, 5 * CLIENT_TIMEOUT + 5) is not None
    finally:
        for sock in silent:
            sock.close()


def test_headers_trickled_a_byte_at_a_time_get_a_408(sidecar):
    with connect(sidecar) as sock:
        sock.sendall(b"GET /api/versions HTTP/1.1\r\n")
        started = time.monotonic()
        try:
            # Each byte well inside the per-read timeout; the headers never end.
            while time.monotonic() - started < 6 * CLIENT_TIMEOUT:
                sock.sendall(b"X")
                time.sleep(CLIENT_TIMEOUT / 4)
        except OSError:
            pass                                            # the server closed it
        reply = closed_by_server(sock, 5)
    assert time.monotonic() - started < 6 * CLIENT_TIMEOUT
    assert reply is not None and reply.startswith(b"HTTP/1.1 408"), reply


def connect(sidecar) -> socket.socket:
    raw = socket.create_connection(("127.0.0.1", port_of(sidecar)), timeout=30)
    if sidecar.certs:
        raw = ssl.create_default_context(cafile=str(sidecar.certs.ca)).wrap_socket(raw, server_hostname="127.0.0.1")
    return raw


def test_a_body_sent_slower_than_the_minimum_rate_gets_a_408_and_the_connection_closes(sidecar):
    with connect(sidecar) as sock:
        sock.sendall(b"POST /tracing/spans HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + sidecar.tokens["writer"].encode() + b"\r\n"
                     b"Content-Length: 100000\r\n\r\n[")
        started = time.monotonic()
        # 10 bytes every half second: each read well inside the per-read timeout, the body far
        # below the minimum rate (32 KiB/s after the grace period). One thread: a TLS socket
        # is not to be read and written from two at once. Stop sending once a reply is there,
        # as HTTP clients do when the server answers before the body is complete.
        # poll, not select: a pytest worker that ran other files may hold descriptors past
        # select()'s 1,024.
        readable = select.poll()
        readable.register(sock, select.POLLIN)
        while time.monotonic() - started < 6 * CLIENT_TIMEOUT and not readable.poll(0):
            sock.sendall(b" " * 10)
            time.sleep(CLIENT_TIMEOUT / 4)
        reply = closed_by_server(sock, 5)
    assert time.monotonic() - started < 6 * CLIENT_TIMEOUT
    assert reply is not None and reply.startswith(b"HTTP/1.1 408"), reply
    assert b'"code":"request_timeout"' in reply.replace(b" ", b"")
    versions_within(sidecar, 15)


@pytest.mark.parametrize("body, status, says", [
    (b"zz\r\n{}\r\n0\r\n\r\n", b"400", b"malformed request body"),         # not hex digits
    (b"1" * 200_000, b"400", b"malformed request body"),                        # a size line with no end
    (b"%x\r\n" % (9 << 20) + b"[" * (9 << 20), b"413", b"payload_too_large"),  # over the 8 MiB body limit
    (b"%x\r\n" % 300_001 + b"[" * 150_000 + b"1" + b"]" * 150_000 + b"\r\n0\r\n\r\n", b"400", b"nested too deeply"),
])
def test_hostile_chunked_and_json_bodies_get_a_4xx_not_a_500(sidecar, body, status, says):
    with connect(sidecar) as sock:
        try:
            sock.sendall(b"POST /tracing/spans HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
                         b"Authorization: Bearer " + sidecar.tokens["writer"].encode() + b"\r\n"
                         b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        except OSError:
            pass                                     # refused part-way: the reply is still there
        reply = closed_by_server(sock, 15)
    assert reply is not None and reply.startswith(b"HTTP/1.1 " + status) and says in reply, reply[:300]
    versions_within(sidecar, 15)


def test_sigterm_stops_the_sidecar_cleanly_and_closes_its_database(tmp_path):
    make_keys(tmp_path / "keys.yaml")
    sidecar = start_sidecar(tmp_path, "127.0.0.1", free_port(), f"http://127.0.0.1:{free_port()}",
                            tmp_path / "keys.yaml", tls=False)
    try:
        # A second one on the same port: a one-line error, no traceback.
        taken = subprocess.run(sidecar_argv("--insecure-no-tls", "--database", str(tmp_path / "other.db"),
                                            "--port", str(port_of(sidecar))),
                               capture_output=True, text=True, timeout=60)
        assert taken.returncode == 2 and "Traceback" not in taken.stderr
        assert taken.stderr.strip().splitlines()[-1].startswith("fabricscope sidecar: cannot listen on 127.0.0.1:")
        sidecar.process.process.send_signal(signal.SIGTERM)
        assert sidecar.process.process.wait(20) == 0
    finally:
        sidecar.stop()
    assert "Traceback" not in (tmp_path / "sidecar.log").read_text()
    # SQLite removes the write-ahead log when the last connection closes cleanly, and
    # the sidecar's exclusive lock is gone: a new sidecar opens the same file.
    assert not (tmp_path / "sidecar.db-wal").exists()
    again = start_sidecar(tmp_path, "127.0.0.1", free_port(), f"http://127.0.0.1:{free_port()}",
                          tmp_path / "keys.yaml", tls=False)
    again.stop()
