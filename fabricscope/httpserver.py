"""One small HTTP server for every fabricscope process that serves HTTP.

It runs a WSGI application on cheroot (CherryPy's pure-Python server): request framing
(chunked bodies, conflicting Content-Length, the unread body of a refused request) is
handled by a parser many deployments rely on, worker threads are capped, and idle
keep-alive connections wait in a selector instead of holding a thread each.

TLS: the handshake runs on the worker thread that serves the connection, under the
connection timeout, never on the thread that accepts connections - one client that
connects and sends nothing cannot stop the others from being served.
"""
from __future__ import annotations

import logging
import ssl
import threading
from typing import Any, Callable

from cheroot import wsgi
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


class _Server(wsgi.Server):
    def error_log(self, msg="", level=logging.INFO, traceback=False):
        # cheroot reports client misbehaviour (resets, plain HTTP on a TLS port) here;
        # it is the client's problem, so it goes to debug, tracebacks included.
        log.log(logging.DEBUG if level < logging.ERROR else logging.WARNING, "%s", msg,
                exc_info=traceback)


class HttpServer:
    """A WSGI app served in a background thread: start(), url, port, stop()."""

    def __init__(self, app: WsgiApp, host: str = "127.0.0.1", port: int = 0, *, name: str = "http",
                 threads: int = 4, max_queued_connections: int = 64, timeout: float = 10.0,
                 max_header_bytes: int = 64 * 1024, max_body_bytes: int = 4 * 1024 * 1024,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.name = name
        self.server = _Server((host, port), app, numthreads=threads, max=threads, server_name="fabricscope",
                              timeout=timeout, shutdown_timeout=2,
                              # Beyond this many connections waiting for a worker, new
                              # ones are answered 503 and closed instead of piling up.
                              accepted_queue_size=max_queued_connections, accepted_queue_timeout=1)
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
