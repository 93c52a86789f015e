"""The exporter's HTTP server: landing page, /metrics, and routes collectors contribute."""
from __future__ import annotations

import html
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from typing import Callable

from .exposition import CONTENT_TYPE
from .framework import RouteHandler
from .webconfig import WebConfig

log = logging.getLogger("fabricscope.exporter.web")

MAX_BODY_BYTES = 4 * 1024 * 1024

LANDING_PAGE = """<!doctype html>
<html><head><title>fabricscope exporter</title></head>
<body><h1>fabricscope exporter</h1>
<p>Node: {node}</p>
<ul><li><a href="/metrics">Metrics</a></li>{extra}</ul>
</body></html>
"""


def make_handler(render_metrics: Callable[[], bytes], web: WebConfig, routes: dict[tuple[str, str], RouteHandler], node: str):
    # Prometheus scrapes are synchronous; serialise them so two overlapping scrapes never
    # interleave reads of the same stateful collector (e.g. counter-delta tracking).
    scrape_lock = threading.Lock()
    extra_links = "".join(f'<li><a href="{path}">{path}</a></li>' for (method, path) in sorted(routes) if method == "GET")
    landing = LANDING_PAGE.format(node=html.escape(node), extra=extra_links).encode()

    class Handler(BaseHTTPRequestHandler):
        server_version = "fabricscope"
        protocol_version = "HTTP/1.1"
        # A client that stops sending mid-request (or idles on keep-alive) frees its
        # thread after this long instead of holding it forever.
        timeout = 60

        def log_message(self, fmt, *args):  # route access logs through logging, at debug
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, content_type: str, body: bytes, extra: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in {**web.headers, **(extra or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _dispatch(self, method: str) -> None:
            if not web.authorized(self.headers.get("Authorization")):
                self._send(401, "text/plain; charset=utf-8", b"Unauthorized\n",
                           {"WWW-Authenticate": 'Basic realm="fabricscope"'})
                return
            url = urlsplit(self.path)
            raw_length = (self.headers.get("Content-Length") or "0").strip()
            if not raw_length.isdigit():
                # A negative or garbage length would make the read below wait for EOF.
                self.close_connection = True
                self._send(400, "text/plain; charset=utf-8", b"Content-Length must be a non-negative integer\n")
                return
            length = int(raw_length)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413, "text/plain; charset=utf-8", f"body larger than {MAX_BODY_BYTES} bytes\n".encode())
                return
            body = self.rfile.read(length) if length else b""
            if method in ("GET", "HEAD") and url.path == "/metrics":
                with scrape_lock:
                    output = render_metrics()
                self._send(200, CONTENT_TYPE, output)
            elif method in ("GET", "HEAD") and url.path == "/":
                self._send(200, "text/html; charset=utf-8", landing)
            elif (handler := routes.get(("GET" if method == "HEAD" else method, url.path))) is not None:
                try:
                    status, content_type, payload = handler(body, parse_qs(url.query))
                except Exception:
                    log.exception("handler for %s %s failed", method, url.path)
                    status, content_type, payload = 500, "application/json", b'{"error":"internal error"}\n'
                self._send(status, content_type, payload)
            elif any(path == url.path for (_, path) in routes) or url.path in ("/", "/metrics"):
                self._send(405, "text/plain; charset=utf-8", b"Method Not Allowed\n")
            else:
                self._send(404, "text/plain; charset=utf-8", b"Not Found\n")

        def do_GET(self):
            self._dispatch("GET")

        def do_HEAD(self):
            self._dispatch("HEAD")

        def do_POST(self):
            self._dispatch("POST")

    return Handler


def serve(address: str, render_metrics: Callable[[], bytes], web: WebConfig,
          routes: dict[tuple[str, str], RouteHandler], node: str) -> ThreadingHTTPServer:
    """Bind and start serving in a daemon thread; returns the server (call shutdown())."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    server = ThreadingHTTPServer((host, int(port)), make_handler(render_metrics, web, routes, node))
    server.daemon_threads = True
    if web.ssl_context is not None:
        server.socket = web.ssl_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name=f"http-{address}", daemon=True)
    thread.start()
    return server
