"""The exporter's HTTP server: landing page, /metrics, and routes collectors contribute.

A WSGI application served by fabricscope.httpserver: reading requests off the worker
threads, request framing, body and header limits, deadlines and fair admission per client
address are the server's; this module decides what each request gets.
"""
from __future__ import annotations

import html
import logging
import threading
from typing import Any, Callable
from urllib.parse import parse_qs

from fabricscope.httpserver import HttpServer, read_body, respond

from .exposition import CONTENT_TYPE
from .framework import RouteHandler
from .webconfig import Auth, WebConfig

log = logging.getLogger("fabricscope.exporter.web")

MAX_BODY_BYTES = 4 * 1024 * 1024
# Prometheus scrapes one target at a time; a few more threads serve the ingest API and
# people. One client address may keep at most half of them busy, so a scrape always
# finds one.
WORKER_THREADS = 8
# A client that stops sending mid-request is answered 408 after this long, and an idle
# keep-alive connection is closed after it; a request that finds no worker within it
# gets a 503.
CLIENT_TIMEOUT_SECONDS = 3

LANDING_PAGE = """<!doctype html>
<html><head><title>fabricscope exporter</title></head>
<body><h1>fabricscope exporter</h1>
<p>Node: {node}</p>
<ul><li><a href="/metrics">Metrics</a></li>{extra}</ul>
</body></html>
"""
TEXT = "text/plain; charset=utf-8"


def make_app(render_metrics: Callable[[], bytes], web: WebConfig, routes: dict[tuple[str, str], RouteHandler],
             node: str):
    # Prometheus scrapes are synchronous; serialise them so two overlapping scrapes never
    # interleave reads of the same stateful collector (e.g. counter-delta tracking).
    scrape_lock = threading.Lock()
    extra_links = "".join(f'<li><a href="{path}">{path}</a></li>' for (method, path) in sorted(routes) if method == "GET")
    landing = LANDING_PAGE.format(node=html.escape(node), extra=extra_links).encode()
    known_paths = {path for (_, path) in routes} | {"/", "/metrics"}

    def app(environ: dict[str, Any], start_response) -> list[bytes]:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")

        def send(status: int, content_type: str, body: bytes, extra: dict | None = None) -> list[bytes]:
            sent = respond(start_response, status, body, content_type, {**web.headers, **(extra or {})})
            return [] if method == "HEAD" else sent

        verdict = web.authenticate(environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR", ""))
        if verdict is Auth.THROTTLED:
            return send(429, TEXT, b"Too many failed logins; retry later\n", {"Retry-After": "1"})
        if verdict is not Auth.OK:
            return send(401, TEXT, b"Unauthorized\n", {"WWW-Authenticate": 'Basic realm="fabricscope"'})
        if method in ("GET", "HEAD") and path == "/metrics":
            with scrape_lock:
                output = render_metrics()
            return send(200, CONTENT_TYPE, output)
        if method in ("GET", "HEAD") and path == "/":
            return send(200, "text/html; charset=utf-8", landing)
        handler = routes.get(("GET" if method == "HEAD" else method, path))
        if handler is not None:
            body = read_body(environ, MAX_BODY_BYTES)
            if body is None:
                return send(413, TEXT, f"body larger than {MAX_BODY_BYTES} bytes\n".encode(), {"Connection": "close"})
            try:
                status, content_type, payload = handler(body, parse_qs(environ.get("QUERY_STRING", "")))
            except Exception:
                log.exception("handler for %s %s failed", method, path)
                status, content_type, payload = 500, "application/json", b'{"error":"internal error"}\n'
            return send(status, content_type, payload)
        if path in known_paths:
            return send(405, TEXT, b"Method Not Allowed\n")
        return send(404, TEXT, b"Not Found\n")

    return app


def serve(address: str, render_metrics: Callable[[], bytes], web: WebConfig,
          routes: dict[tuple[str, str], RouteHandler], node: str) -> HttpServer:
    """Bind and start serving in a background thread; returns the server (call stop())."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return HttpServer(make_app(render_metrics, web, routes, node), host, int(port), name=f"http-{address}",
                      threads=WORKER_THREADS, timeout=CLIENT_TIMEOUT_SECONDS,
                      max_body_bytes=MAX_BODY_BYTES, ssl_context=web.ssl_context,
                      trusted_sources=web.trusted).start()
