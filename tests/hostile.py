"""Hostile clients against a real server, for tests/test_hostile_clients.py and
bench/hostile_clients.py: attackers connect from 127.0.0.1, the normal client from
127.0.0.2 (both loopback; Linux routes all of 127.0.0.0/8 there), so a server that
shares itself fairly per address keeps serving the normal client. A crowd (`Crowd`)
comes from the 241 addresses 127.0.0.10-250, as many clients behind a NAT or in a pod
network would.

Attack kinds, each connection re-opened half a second after the server closes it, until
stopped:
- one_byte: one byte (on a TLS port: the first byte of a ClientHello), then silence;
- header_trickle: a request line, then a header byte every half second;
- body_trickle: a complete head announcing 100,000 bytes of body, then 10 bytes every
  half second;
- silent: on a TLS port the handshake completed, then silence; on plaintext, connect
  and never send.
"""
from __future__ import annotations

import asyncio
import http.client
import re
import resource
import socket
import ssl
import threading
import time

ATTACKER = "127.0.0.1"
CLIENT = "127.0.0.2"
KINDS = ("one_byte", "header_trickle", "body_trickle", "silent")
CROWD_SOURCES = [f"127.0.0.{last}" for last in range(10, 251)]
CROWD_REOPEN_SECONDS = 0.2
TRICKLE_SECONDS = 0.5
REOPEN_SECONDS = 0.5


class _ClientsInThread:
    """Client coroutines on an event loop of their own thread, from `with` until its end:
    subclasses say which coroutines (_clients)."""

    def __init__(self, name: str) -> None:
        self.opened = 0                 # connections opened in all, re-openings included
        self.holding = 0                # open right now
        self.most_held = 0              # the most open at once
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()

    def __enter__(self):
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    def _clients(self) -> list:
        raise NotImplementedError

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        tasks = [asyncio.ensure_future(client) for client in self._clients()]
        self._started.set()
        await self._stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Attack(_ClientsInThread):
    """`counts[kind]` connections of each kind to host:port from ATTACKER, in a thread of
    their own; a context manager."""

    def __init__(self, host: str, port: int, counts: dict[str, int], tls: bool) -> None:
        super().__init__("attack")
        self.host, self.port, self.counts, self.tls = host, port, counts, tls
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE

    def _clients(self) -> list:
        return [self._connection(kind) for kind, count in self.counts.items() for _ in range(count)]

    async def _connection(self, kind: str) -> None:
        while not self._stop.is_set():
            writer = None
            try:
                handshake = self.tls and kind != "one_byte"
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    self.host, self.port, local_addr=(ATTACKER, 0), ssl=self.context if handshake else None,
                    server_hostname=self.host if handshake else None), 10)
                self.opened += 1
                self.holding += 1
                self.most_held = max(self.most_held, self.holding)
                try:
                    await self._hold(kind, reader, writer)
                finally:
                    self.holding -= 1
            except (OSError, ssl.SSLError, asyncio.TimeoutError, EOFError):
                pass
            finally:
                if writer is not None:
                    writer.transport.abort()
            # Then re-open, after a pause: re-opening at once would make this a connection
            # flood, which costs the machine the test and the server share (two cores)
            # more than the server, and is the firewall's to limit, not the server's.
            await asyncio.sleep(REOPEN_SECONDS)

    async def _hold(self, kind: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if kind == "one_byte":
            writer.write(b"\x16" if self.tls else b"G")
        elif kind == "header_trickle":
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        elif kind == "body_trickle":
            writer.write(b"POST /tracing/spans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n[")
        while not self._stop.is_set():
            if kind == "header_trickle":
                writer.write(b"X")
            elif kind == "body_trickle":
                writer.write(b" " * 10)
            await writer.drain()
            try:
                if not await asyncio.wait_for(reader.read(65536), TRICKLE_SECONDS):
                    return                       # closed by the server
            except asyncio.TimeoutError:
                pass


class Crowd(_ClientsInThread):
    """`count` connect-only sockets spread over CROWD_SOURCES, each re-opened 0.2 s after
    the server closes it, until stopped; in a thread of its own (a context manager)."""

    def __init__(self, host: str, port: int, count: int = 1000) -> None:
        super().__init__("crowd")
        self.host, self.port, self.count = host, port, count
        self.closed_by_server = 0
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < count + 512:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 4096), hard))

    def _clients(self) -> list:
        return [self._socket(CROWD_SOURCES[i % len(CROWD_SOURCES)]) for i in range(self.count)]

    async def _socket(self, source: str) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            sock = socket.socket()
            sock.setblocking(False)
            try:
                sock.bind((source, 0))
                await asyncio.wait_for(loop.sock_connect(sock, (self.host, self.port)), 10)
                self.opened += 1
                self.holding += 1
                self.most_held = max(self.most_held, self.holding)
                try:
                    while await loop.sock_recv(sock, 4096):
                        pass                      # (a refusal's answer: read until closed)
                    self.closed_by_server += 1
                finally:
                    self.holding -= 1
            except (OSError, asyncio.TimeoutError):
                pass
            finally:
                sock.close()
            await asyncio.sleep(CROWD_REOPEN_SECONDS)


def silent_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` connections from ATTACKER that never send (the server may close them)."""
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((ATTACKER, 0))
        sock.settimeout(5)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            continue
        socks.append(sock)
    return socks


def timed_get(host: str, port: int, path: str, context: ssl.SSLContext | None = None,
              headers: dict[str, str] | None = None, timeout: float = 10.0,
              source: str = CLIENT) -> tuple[int | None, float]:
    """(status, seconds) of one GET on a new connection from `source`; status None when
    it failed (refused, reset, timed out)."""
    started = time.perf_counter()
    if context is not None:
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=timeout, source_address=(source, 0))
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout, source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    except (OSError, http.client.HTTPException, ssl.SSLError):
        return None, time.perf_counter() - started
    finally:
        conn.close()


def worst(samples: list[tuple[int | None, float]]) -> float:
    """The slowest answer (the p99 of up to 100 samples); a failure counts as infinite."""
    return max(seconds if status is not None else float("inf") for status, seconds in samples)


def p90(samples: list[tuple[int | None, float]]) -> float:
    times = sorted(seconds if status is not None else float("inf") for status, seconds in samples)
    return times[max(0, -(-len(times) * 9 // 10) - 1)]


def otlp_empty_spans(spans: int) -> bytes:
    """A gzipped OTLP/protobuf export of `spans` empty spans, written on the wire directly
    (building 4 million messages here would cost what the server must not): one resource,
    one scope, and each span two bytes (field 2, length 0). 4,194,288 of them are 8 MiB,
    8 KB gzipped."""
    import gzip

    def field(number: int, payload: bytes) -> bytes:
        length, out = len(payload), bytearray([number << 3 | 2])
        while length >= 0x80:
            out.append(length & 0x7F | 0x80)
            length >>= 7
        out.append(length)
        return bytes(out) + payload

    scope_spans = b"\x12\x00" * spans
    return gzip.compress(field(1, field(2, scope_spans)))


def otlp_export(spans: int) -> bytes:
    """A gzipped OTLP/protobuf trace export of `spans` spans, as small as a span gets (no
    ids, no name): the count, not the size, is what the server must bound."""
    import gzip

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    now = time.time_ns()
    for _ in range(spans):
        span = scope.spans.add()
        span.start_time_unix_nano, span.end_time_unix_nano = now - 1_000_000, now
    return gzip.compress(request.SerializeToString())


def prometheus_scraping(port: int, tls: bool, basic_auth: dict[str, str] | None, interval: str) -> dict:
    """A Prometheus configuration scraping 127.0.0.1:`port`/metrics as job "target"."""
    job = {"job_name": "target", "scrape_interval": interval, "scrape_timeout": interval, "metrics_path": "/metrics",
           "scheme": "https" if tls else "http", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
    if tls:
        job["tls_config"] = {"insecure_skip_verify": True}
    if basic_auth:
        job["basic_auth"] = basic_auth
    return {"global": {"scrape_interval": interval}, "scrape_configs": [job]}


def scrapes(prometheus, since: float, until: float) -> tuple[int, int]:
    """(successful, all) scrapes of job "target" stored for [since, until]."""
    window = f"{max(1, round(until - since))}s"
    answer = prometheus.get("/api/v1/query", query=f'up{{job="target"}}[{window}]', time=f"{until:.3f}")
    values = [float(v) for _, v in answer["data"]["result"][0]["values"]] if answer["data"]["result"] else []
    return int(sum(values)), len(values)


# Each framing case: what follows the request line and Host (headers and body), and the
# status it gets. The request after it on the same connection must go unanswered.
FRAMING = {
    "repeated equal Content-Length": (b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", 400),
    "Content-Length list": (b"Content-Length: 2, 2\r\n\r\n{}", 400),
    "obs-fold": (b"X-Note: a\r\n b\r\nContent-Length: 2\r\n\r\n{}", 400),
    "folded Transfer-Encoding": (b"Transfer-Encoding:\r\n chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400),
    "bare LF": (b"Content-Length: 2\n\n{}", 400),
    "chunk size 2^64": (b"Transfer-Encoding: chunked\r\n\r\n10000000000000000\r\n{}", 413),
}


def framing_exchange(port: int, context: ssl.SSLContext | None, path: str, headers: dict[str, str],
                     case: str) -> list[int]:
    """The statuses answered on one connection (TLS where `context` is given) that carries
    FRAMING[case] (any other case: a well-framed GET) and then a well-framed GET."""
    auth = b"".join(f"{name}: {value}\r\n".encode() for name, value in headers.items())
    if case in FRAMING:
        eol = b"\n" if case == "bare LF" else b"\r\n"
        first = b"POST " + path.encode() + b" HTTP/1.1" + eol + b"Host: x" + eol + FRAMING[case][0]
    else:
        first = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    appended = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + auth + b"\r\n"
    sock = socket.create_connection(("127.0.0.1", port), timeout=3, source_address=(CLIENT, 0))
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    reply = b""
    with sock:
        sock.sendall(first + appended)
        try:
            while chunk := sock.recv(65536):
                reply += chunk
                if b"Connection: close" in reply and reply.endswith(b"\n"):
                    sock.shutdown(socket.SHUT_WR)        # the server's lingering close ends at once
        except (OSError, ssl.SSLError):
            pass
    # A status line may follow the previous answer's body directly (a body need not end in CRLF).
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", reply)]


# Bodies that take the query routes as far as Prometheus (an empty one is refused first).
ROUTE_BODIES = {"/queries/meshql": {"query": "SHOW SUMMARY"},
                "/ai/query/conversation": {"message": "which rank is causing the nccl hang?"},
                "/graph/chaos-simulate": {"device": "x", "failure_type": "device_failure"}}


def every_route(base: str, headers: dict[str, str]) -> list[tuple[str, str, int, str]]:
    """(method, path, status, body) of every route in the sidecar's OpenAPI document (path
    parameters "x"), every tool over HTTP and over MCP: what each answers to `headers`."""
    import requests

    spec = requests.get(base + "/api/v1/openapi.json", headers=headers, timeout=10).json()
    calls = [(method.upper(), re.sub(r"\{[^}]+\}", "x", path), ROUTE_BODIES.get(path, {}))
             for path, methods in spec["paths"].items() for method in methods
             if method in ("get", "post", "put", "delete")]
    tools = [tool["name"] for tool in requests.get(base + "/api/v1/tools/list", headers=headers,
                                                   timeout=10).json()["tools"]]
    calls += [("POST", f"/api/v1/tools/{name}", {}) for name in tools]
    calls += [("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                "params": {"name": name, "arguments": {}}}) for name in tools]
    answers = []
    for method, path, body in calls:
        reply = requests.request(method, base + path, headers=headers, timeout=30,
                                 json=None if method == "GET" else body)
        answers.append((method, path, reply.status_code, reply.text))
    return answers
