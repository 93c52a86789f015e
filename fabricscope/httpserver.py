"""One small HTTP server for every fabricscope process that serves HTTP: the exporter,
the sidecar and the webhook receiver run their WSGI applications on it.

Requests are read by an asyncio event loop (fabricscope/httpconnection.py, h11 for the
protocol): the TLS handshake, the request head and the whole body are taken in on the
loop, under deadlines and a minimum body rate, and only a complete request goes to a
worker thread. A slow, silent or half-sent client costs a buffer, not a thread, as a
goroutine per connection does in Go's net/http. Admission is fair per source address
(fabricscope/httpadmission.py, as nginx's `limit_conn`): each address may hold only its
share of the connections and of the requests in progress, and workers go round-robin
to the addresses waiting, so one client cannot lock the others out. The total is set in
thousands (a silent socket costs a buffer and a descriptor, so the process's descriptor
limit is raised to fit), and when it is reached the oldest connection that has not yet
sent a whole request is dropped for the new one: a crowd from many addresses cannot hold
the server either. Configured scrapers (`trusted_sources`) have slots of their own.

Workers come in pools: one by default; an application that has handlers waiting on a
slow backend passes `pools` and `route`, so those handlers queue only behind each other
(bulkheads), each key at most `per_key` at a time.

Why not an established ASGI server with the app adapted: uvicorn (through a2wsgi) starts
the WSGI application as soon as the head is in and streams the body to it, so a trickled
body holds a worker; hypercorn's WSGI wrapper reads the body first but has no per-address
admission, no total deadline on a head and no minimum body rate. The protocol itself is
h11's, the parser both of them use.
"""
from __future__ import annotations

import asyncio
import asyncio.sslproto
import logging
import resource
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .httpadmission import FairPool, Slot, SourceConnections, SourceRequests, TrustedSources
from .httpconnection import Connection, Deadlines, ErrorBody, plain_error_body
from .httpwsgi import WsgiAnswer, WsgiApp, run_wsgi

log = logging.getLogger("fabricscope.http")

# Open connections in all, by default. A silent socket costs the event loop a buffer and
# a descriptor, not a thread: thousands fit, as in Go's net/http (measured on the exporter:
# 8 KB a plaintext connection, 60 KB a TLS one past its handshake, with TLS_READ_BUFFER).
MAX_CONNECTIONS = 4096
# asyncio's TLS protocol allocates its socket read buffer (256 KB) when the connection is
# wrapped, before the ClientHello: 1,000 silent TLS sockets took 280 MB. A TLS record is at
# most 16 KB of ciphertext plus overhead, so a smaller buffer reads as much per record. A
# class attribute (loop.start_tls takes no buffer size); the only asyncio TLS in these
# processes is this server's.
TLS_READ_BUFFER = 32 * 1024
# Descriptors kept for everything else the process opens (files, database, Prometheus).
SPARE_DESCRIPTORS = 256


def connection_limit(wanted: int) -> int:
    """`wanted`, or what the descriptor limit allows: the soft limit is raised to the hard
    one first (as Go's runtime does at start), since 1,024 is a common default."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = wanted + SPARE_DESCRIPTORS if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))
            soft = max(soft, target)
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - SPARE_DESCRIPTORS))

# Which pool a request runs in, and the key it counts against there (None: no key).
Route = Callable[[dict[str, Any]], "tuple[str, str | None]"]


@dataclass(frozen=True)
class PoolSize:
    workers: int
    per_key: int | None = None        # requests of one key running at once in this pool


class HttpServer:
    """A WSGI app served by an event loop in a background thread: start(), url, port, stop()."""

    def __init__(self, app: WsgiApp, host: str = "127.0.0.1", port: int = 0, *, name: str = "http",
                 threads: int = 4, timeout: float = 10.0,
                 header_timeout: float | None = None, body_timeout: float | None = None,
                 body_min_rate: float = 32 * 1024,
                 max_header_bytes: int = 64 * 1024, max_body_bytes: int = 4 * 1024 * 1024,
                 ssl_context: ssl.SSLContext | None = None,
                 max_connections: int = MAX_CONNECTIONS, max_connections_per_source: int = 64,
                 max_requests_per_source: int | None = None, trusted_sources: TrustedSources | None = None,
                 pools: dict[str, PoolSize] | None = None, route: Route | None = None,
                 error_body: ErrorBody = plain_error_body) -> None:
        self.app, self.name = app, name
        self.bind_addr: tuple[str, int] = (host, port)
        self.ssl_context = ssl_context
        self.scheme = "https" if ssl_context is not None else "http"
        if ssl_context is not None:
            asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
        self.deadlines = Deadlines(timeout=timeout,
                                   header_timeout=timeout if header_timeout is None else header_timeout,
                                   body_timeout=timeout if body_timeout is None else body_timeout,
                                   body_min_rate=body_min_rate)
        self.max_header_bytes, self.max_body_bytes = max_header_bytes, max_body_bytes
        self.error_body = error_body
        self.connections = SourceConnections(connection_limit(max_connections), max_connections_per_source,
                                             trusted_sources)
        # By default an address may have half the default pool's workers busy (at least
        # two requests): the rest stay for everyone else.
        per_source = max_requests_per_source or max(2, threads // 2)
        self.source_requests = SourceRequests(per_source, max_wait=timeout)
        sizes = {"default": PoolSize(threads), **(pools or {})}
        self.pools = {pool: FairPool(pool, size.workers, per_source=min(per_source, size.workers),
                                     per_key=size.per_key, max_wait=timeout)
                      for pool, size in sizes.items()}
        self.route = route
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def host(self) -> str:
        return self.bind_addr[0]

    @property
    def port(self) -> int:
        return self.bind_addr[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> "HttpServer":
        """Bind (an OSError here means the port is taken) and serve in a daemon thread."""
        host, port = self.bind_addr
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            # A burst of connects beyond the backlog waits for SYN retransmits, 1 s and more.
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.bind_addr = sock.getsockname()[:2]
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run_loop, args=(sock, ready), name=self.name, daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def _run_loop(self, sock: socket.socket, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve(sock, ready))
        finally:
            self._loop.close()

    async def _serve(self, sock: socket.socket, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        self._loop.add_reader(sock.fileno(), self._accept, sock)
        ready.set()
        await self._stopping.wait()
        self._loop.remove_reader(sock.fileno())
        sock.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=0.5)

    def _accept(self, sock: socket.socket) -> None:
        """Accept what is waiting. A connection over its address's share (or the total) is
        closed here, before asyncio builds a transport, a protocol and a task for it: an
        address re-opening refused connections in a loop costs an accept() and a close()
        each, not a coroutine."""
        for _ in range(128):
            try:
                conn, peer = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:                # out of descriptors: retry on the next event
                log.warning("%s: accept failed: %s", self.name, exc)
                return
            slot = self.connections.admit(peer[0])
            if slot is None:
                conn.close()
                continue
            conn.setblocking(False)
            task = self._loop.create_task(self._adopt(conn, slot))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _adopt(self, conn: socket.socket, slot: Slot) -> None:
        # As asyncio.start_server does for each connection: a stream protocol whose
        # connected callback serves it (the callback's writer is the one start_tls keeps).
        reader = asyncio.StreamReader(limit=self.max_header_bytes)
        protocol = asyncio.StreamReaderProtocol(reader, lambda r, w: self._on_connection(r, w, slot))
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, sock=conn)
        except OSError:
            conn.close()
            self.connections.release(slot)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slot: Slot) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        # Dropped for a newer connection (the total reached): cancelled, and aborted below.
        slot.evict = task.cancel
        try:
            await Connection(self, reader, writer, slot).serve()
        except asyncio.CancelledError:
            writer.transport.abort()
        except Exception:
            log.exception("%s: serving a connection from %s failed", self.name, slot.source)
            writer.transport.abort()
        finally:
            slot.evict = None
            self._tasks.discard(task)
            self.connections.release(slot)

    async def dispatch(self, environ: dict[str, Any], source: str) -> WsgiAnswer:
        """Run the application for a complete request in its pool, in this source's turn."""
        pool, key = self.route(environ) if self.route is not None else ("default", None)
        return await self.pools[pool].run(source, key, self._call_app, environ)

    def _call_app(self, environ: dict[str, Any]) -> WsgiAnswer:
        try:
            return run_wsgi(self.app, environ)
        except Exception:
            log.exception("%s: %s %s failed", self.name, environ["REQUEST_METHOD"], environ["PATH_INFO"])
            content_type, body = self.error_body(500, "internal error")
            return WsgiAnswer(500, "Internal Server Error", [("Content-Type", content_type)], body)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(5)
        for pool in self.pools.values():
            pool.shutdown()

    def __enter__(self) -> "HttpServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def respond(start_response: Callable[..., Any], status: int, body: bytes, content_type: str,
            headers: dict[str, str] | None = None) -> list[bytes]:
    """Send a complete response with its length; the WSGI return value."""
    from http import HTTPStatus

    start_response(f"{status} {HTTPStatus(status).phrase}",
                   [("Content-Type", content_type), ("Content-Length", str(len(body))),
                    *(headers or {}).items()])
    return [body]


def read_body(environ: dict[str, Any], limit: int) -> bytes | None:
    """The whole request body, or None when it is larger than `limit` (answer 413). The
    server has read it already (de-chunked, framing checked, within its own limit)."""
    body = environ["wsgi.input"].read(limit + 1)
    return body if len(body) <= limit else None
