"""One small HTTP server for every fabricscope process that serves HTTP.

It runs a WSGI application on cheroot (CherryPy's pure-Python server): chunked bodies,
body and header limits and HTTP/1.1 keep-alive come from a parser many deployments rely
on, worker threads are capped, connections waiting for one are capped (beyond that a 503),
and idle keep-alive connections wait in a selector instead of holding a thread each.

On top of cheroot, request framing is made unambiguous, because a proxy in front that
reads a request's end differently from us is how requests are smuggled: a repeated
Content-Length or Host, both Content-Length and Transfer-Encoding, or whitespace before a
header's colon is a 400; a chunk size is hex digits on a line of at most 4 KiB, and the
trailer section is read to its end (BadBody otherwise: a 400); and a connection whose
chunked body the application did not read to its end is closed after the response instead
of being parsed for another request.

TLS: the handshake runs on the worker thread that serves the connection, under the
connection timeout, never on the thread that accepts connections, and a connection
reaches a worker only once it has sent something - clients that connect and send nothing
cannot stop the others from being served. Once it has sent something, its request line
and headers (and the TLS handshake) must all arrive within `header_timeout` seconds in
total, else it gets a 408 and is closed: a client trickling a byte every few seconds,
each read well inside the per-read `timeout`, cannot hold a worker for long either (a TLS
handshake still unfinished then is closed without a reply: there is no HTTP to answer in). The
body then has `body_timeout` seconds, extended by one second for every `body_min_rate`
bytes received (as Apache's mod_reqtimeout does): a client that sends its body slower
than that gets a 408 and the connection is closed.
"""
from __future__ import annotations

import logging
import re
import socket
import ssl
import threading
import time
from typing import Any, Callable

from cheroot import errors as cheroot_errors
from cheroot import server as cheroot_server
from cheroot import wsgi
from cheroot.makefile import MakeFile, StreamReader
from cheroot.ssl.builtin import BuiltinSSLAdapter

log = logging.getLogger("fabricscope.http")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Any]


class _HandshakeInWorker(BuiltinSSLAdapter):
    """cheroot's own TLS adapter completes the handshake inside accept(); this one only
    wraps the socket. OpenSSL then performs the handshake on the first read, which the
    worker thread does with the connection's timeout."""

    def __init__(self, context: ssl.SSLContext) -> None:   # noqa: D107 (no cert files: a ready context)
        self.context = context
        self.certificate = self.private_key = self.certificate_chain = None

    def wrap(self, sock):
        return self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), \
            {"wsgi.url_scheme": "https", "HTTPS": "on"}

    def get_environ(self, sock):
        return {"wsgi.url_scheme": "https", "HTTPS": "on"}


class _OnceHeaders(dict):
    """Header dict that refuses a second value for the headers that frame a request."""

    ONCE = frozenset({b"Content-Length", b"Host"})

    def __setitem__(self, key, value):
        if key in self.ONCE and key in self:
            raise ValueError(f"duplicate {key.decode()} header")
        super().__setitem__(key, value)


class _StrictHeaderReader(cheroot_server.HeaderReader):
    def __call__(self, rfile, hdict=None):
        headers = super().__call__(rfile, _OnceHeaders())
        if b"Content-Length" in headers and b"Transfer-Encoding" in headers:
            raise ValueError("both Content-Length and Transfer-Encoding")
        length = headers.get(b"Content-Length")
        if length is not None and not (length.isdigit() and len(length) <= 18):
            # int() would take "-5" or " +5"; a negative length makes the body read wait.
            raise ValueError("Content-Length must be a non-negative integer")
        if hdict is None:
            return dict(headers)
        hdict.update(headers)
        return hdict

    def _transform_key(self, key_name):
        if key_name != key_name.strip() or not key_name:
            raise ValueError("whitespace in a header name")
        return super()._transform_key(key_name)

    def _allow_header(self, key_name):
        # As cheroot's WSGI server does: X_Forwarded and X-Forwarded would both become
        # HTTP_X_FORWARDED in the environ, so the underscore spelling is dropped.
        return b"_" not in key_name


class BadBody(ValueError):
    """A chunked request body whose framing is malformed: answer 400."""


class _StrictChunkedRFile(cheroot_server.ChunkedRFile):
    """cheroot's chunked-body reader, framing made strict: a size line is read up to
    MAX_LINE bytes (cheroot read it whole, so a size line with no end grew memory without
    bound), a size is hex digits only (int(, 16) also takes "-1", "0x2", "+2" or "1_0",
    and a size <= 0 ended the body: the bytes after it were read as a second request), and
    the trailer section after the last chunk is read to its empty line (cheroot left its
    CRLF unread, where the connection's next request was looked for)."""

    MAX_LINE = 4096
    _SIZE = re.compile(rb"[0-9A-Fa-f]+")

    def _line(self) -> bytes:
        line = self.rfile.readline(self.MAX_LINE + 2)
        self.bytes_read += len(line)
        if self.maxlen and self.bytes_read > self.maxlen:
            raise cheroot_errors.MaxSizeExceeded("Request Entity Too Large", self.maxlen)
        if not line.endswith(b"\r\n"):
            raise BadBody(f"chunked body: a line of over {self.MAX_LINE} bytes, or without CRLF, or cut short")
        return line[:-2]

    def _fetch(self):
        if self.closed:
            return
        size = self._line().split(b";", 1)[0].strip(b" \t")
        if not self._SIZE.fullmatch(size):
            raise BadBody(f"chunked body: bad chunk size {size[:32]!r}")
        length = int(size, 16)
        if length == 0:
            while self._line():                     # trailer fields, up to the empty line
                pass
            self.closed = True
            return
        if self.maxlen and self.bytes_read + length > self.maxlen:
            raise cheroot_errors.MaxSizeExceeded("Request Entity Too Large", self.maxlen)
        chunk = self.rfile.read(length)
        self.bytes_read += len(chunk)
        self.buffer += chunk
        if len(chunk) != length or self.rfile.read(2) != b"\r\n":
            raise BadBody("chunked body: a chunk not followed by CRLF, or cut short")


class _DeadlineSocketIO(socket.SocketIO):
    """The raw socket reads under a connection's buffered reader. While `deadline` is set
    each read may wait only for what is left until it (the socket timeout alone bounds
    one read, and a trickling client keeps every read short); past it, a timeout. With
    `min_rate`, every `min_rate` bytes received since the deadline was set push it one
    second further."""

    deadline: float | None = None
    min_rate: float | None = None
    received = 0
    expired = False           # a read under a deadline timed out: the connection is done

    def set_deadline(self, deadline: float | None, min_rate: float | None = None) -> None:
        self.deadline, self.min_rate, self.received = deadline, min_rate, 0

    def readinto(self, buffer):
        if self.deadline is None:
            return super().readinto(buffer)
        deadline = self.deadline + (self.received / self.min_rate if self.min_rate else 0.0)
        left = deadline - time.monotonic()
        if left <= 0:
            self.expired = True
            raise socket.timeout("timed out")     # cheroot answers it with a 408
        self._sock.settimeout(min(left, self.read_timeout))
        try:
            count = super().readinto(buffer)
        except socket.timeout:
            self.expired = True                   # at the deadline, or one read's timeout
            raise
        finally:
            # The socket's timeout also bounds the response's writes, and Python checks
            # it before every send: a few milliseconds left here would time the reply out.
            self._sock.settimeout(self.read_timeout)
        self.received += count or 0
        return count


class _DeadlineReader(StreamReader):
    def __init__(self, sock, read_timeout: float, bufsize: int) -> None:  # noqa: D107
        raw = _DeadlineSocketIO(sock, "rb")
        raw.read_timeout = read_timeout
        super(StreamReader, self).__init__(raw, bufsize)      # as StreamReader, over this raw
        self.bytes_read = 0


class _Request(cheroot_server.HTTPRequest):
    header_reader = _StrictHeaderReader()

    def parse_request(self):
        raw = self.conn.rfile.raw
        raw.set_deadline(time.monotonic() + self.server.header_timeout)
        try:
            super().parse_request()
        finally:
            # The body (read by the application, if it reads it) at a minimum rate.
            raw.set_deadline(time.monotonic() + self.server.body_timeout, self.server.body_min_rate)

    def respond(self):
        if not self.chunked_read:
            super().respond()
            return
        # cheroot's respond() with the strict chunked reader in place of its own.
        self.rfile = _StrictChunkedRFile(self.conn.rfile, self.server.max_request_body_size)
        self.server.gateway(self).respond()
        self.ready and self.ensure_headers_sent()
        if self.chunked_write:
            self.conn.wfile.write(b"0\r\n\r\n")

    def read_request_headers(self):
        try:
            return super().read_request_headers()
        except cheroot_errors.MaxSizeExceeded:
            # cheroot answers 413 here; 431 says which part was too large (RFC 6585).
            self.close_connection = True
            self.simple_response("431 Request Header Fields Too Large",
                                 "The headers sent with the request exceed the maximum allowed bytes.")
            return False

    def send_headers(self):
        if self.chunked_read and not getattr(self.rfile, "closed", False):
            # Whatever is left of the body would be read as the next request.
            self.close_connection = True
        if self.conn.rfile.raw.expired:
            # The body came too slowly (the application answered its timeout, e.g. with a
            # 408): the rest of it is not waited for.
            self.close_connection = True
        super().send_headers()


class _Connection(cheroot_server.HTTPConnection):
    RequestHandlerClass = _Request
    # After a 408 for a body that came too slowly, how long the unread rest of it is
    # drained before the socket closes.
    LINGER_SECONDS = 1.0

    def close(self):
        raw = getattr(self.rfile, "raw", None)
        if getattr(raw, "expired", False) and not self._handshake_pending():
            self._linger()
        super().close()

    def _handshake_pending(self) -> bool:
        """A TLS connection whose handshake never completed (a stalled ClientHello)."""
        return isinstance(self.socket, ssl.SSLSocket) and self.socket.version() is None

    def _conditional_error(self, req, response):
        # Before TLS is up there is no HTTP to answer in: writing the 408 re-entered the
        # unfinished handshake and waited another full timeout holding the worker.
        if self._handshake_pending():
            return
        super()._conditional_error(req, response)

    def _linger(self) -> None:
        """Closing a socket with unread bytes in its receive buffer sends a reset, and a
        reset makes the client's kernel discard the response it has not read yet: the
        408 would never be seen. Send our end's FIN, then read and drop what the client
        is still sending, briefly (as web servers' lingering close does)."""
        try:
            self.socket.shutdown(socket.SHUT_WR)
            end = time.monotonic() + self.LINGER_SECONDS
            while (left := end - time.monotonic()) > 0:
                self.socket.settimeout(left)
                if not self.socket.recv(65536):
                    break
        except (OSError, ValueError):
            pass                                    # reset, timed out or already closed

    def __init__(self, server, sock, makefile=MakeFile):
        def files(sock, mode, bufsize):
            if "r" in mode:
                return _DeadlineReader(sock, server.timeout, bufsize)
            return makefile(sock, mode, bufsize)     # TLS or plain writer, as cheroot chose
        super().__init__(server, sock, files)


class _Server(wsgi.Server):
    ConnectionClass = _Connection
    # Connections that have not sent anything yet, parked without a thread; beyond this
    # many a new connection is closed at once. Each is closed after `timeout` idle.
    max_idle_connections = 512

    def process_conn(self, conn):
        # cheroot hands a new connection straight to a worker, which then waits for the
        # request (or the TLS ClientHello) for up to `timeout`: a handful of silent
        # connections would hold every worker. A new connection is parked in cheroot's
        # selector instead, and reaches a worker once it has something to read.
        if getattr(conn, "fabric_seen", False):
            super().process_conn(conn)
            return
        conn.fabric_seen = True
        if self._connections._num_connections >= self.max_idle_connections:
            conn.close()
            return
        self._connections.put(conn)

    def error_log(self, msg="", level=logging.INFO, traceback=False):
        # cheroot reports client misbehaviour (resets, plain HTTP on a TLS port) here;
        # it is the client's problem, so it goes to debug, tracebacks included.
        log.log(logging.DEBUG if level < logging.ERROR else logging.WARNING, "%s", msg,
                exc_info=traceback)


class HttpServer:
    """A WSGI app served in a background thread: start(), url, port, stop()."""

    def __init__(self, app: WsgiApp, host: str = "127.0.0.1", port: int = 0, *, name: str = "http",
                 threads: int = 4, max_queued_connections: int = 64, timeout: float = 10.0,
                 header_timeout: float | None = None, body_timeout: float | None = None,
                 body_min_rate: float = 32 * 1024,
                 max_header_bytes: int = 64 * 1024, max_body_bytes: int = 4 * 1024 * 1024,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.server = _Server((host, port), app, numthreads=threads, max=threads, server_name="fabricscope",
                              timeout=timeout, shutdown_timeout=2,
                              # The listen backlog (cheroot's default is 5): a burst of
                              # connects beyond it waits for SYN retransmits, 1 s and more.
                              request_queue_size=128,
                              # Beyond this many connections waiting for a worker, new
                              # ones are answered 503 and closed instead of piling up.
                              accepted_queue_size=max_queued_connections, accepted_queue_timeout=1)
        # Request line + headers (+ TLS handshake) in total; by default one `timeout`.
        self.server.header_timeout = timeout if header_timeout is None else header_timeout
        # The body: `body_timeout` (by default one `timeout`) plus a second per
        # `body_min_rate` bytes received.
        self.server.body_timeout = timeout if body_timeout is None else body_timeout
        self.server.body_min_rate = body_min_rate
        self.server.max_request_header_size = max_header_bytes
        self.server.max_request_body_size = max_body_bytes
        if ssl_context is not None:
            self.server.ssl_adapter = _HandshakeInWorker(ssl_context)
        self._thread: threading.Thread | None = None
        self.scheme = "https" if ssl_context is not None else "http"

    @property
    def host(self) -> str:
        return self.server.bind_addr[0]

    @property
    def port(self) -> int:
        return self.server.bind_addr[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def start(self) -> "HttpServer":
        """Bind (an OSError here means the port is taken) and serve in a daemon thread."""
        host, port = self.server.bind_addr[:2]
        if port:
            # cheroot reports a failed bind as a message without its errno; bind once
            # here so the caller gets the OSError itself ("Address already in use").
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        self.server.prepare()
        self._thread = threading.Thread(target=self.server.serve, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        if self._thread is not None:
            self._thread.join(5)

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
    """The whole request body, or None when it is larger than `limit` (answer 413 and the
    server closes the connection). Chunked bodies are de-chunked by the server and
    refused as soon as a chunk would cross its body limit. Raises BadBody for malformed
    chunked framing (answer 400) and TimeoutError for a body that came too slowly (408)."""
    try:
        body = environ["wsgi.input"].read(limit + 1)
    except cheroot_errors.MaxSizeExceeded:
        return None
    return body if len(body) <= limit else None
