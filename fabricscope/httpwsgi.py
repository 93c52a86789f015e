"""The WSGI side of the HTTP server: a complete request (head parsed by h11, body read
whole) becomes a PEP 3333 environ, and the application's answer is collected whole on
the worker thread, so the worker is free again before a slow client has read a byte of
it (the event loop writes it out)."""
from __future__ import annotations

import io
import logging
import sys
from typing import Any, Callable
from urllib.parse import unquote_to_bytes

import h11

log = logging.getLogger("fabricscope.http")

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Any]


class WsgiAnswer:
    """What the application returned: status line, headers, whole body."""

    __slots__ = ("status", "reason", "headers", "body")

    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status, self.reason, self.headers, self.body = status, reason, headers, body


def build_environ(request: h11.Request, body: bytes, *, scheme: str, server: tuple[str, int],
                  peer: tuple[str, int]) -> dict[str, Any]:
    target = request.target
    if not target.startswith(b"/"):
        # absolute-form ("http://host/path"): only the path and query matter here.
        target = b"/" + target.split(b"://", 1)[-1].partition(b"/")[2] if b"://" in target else b"/"
    path, _, query = target.partition(b"?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": request.method.decode("ascii"),
        "SCRIPT_NAME": "",
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query.decode("latin-1"),
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": "HTTP/" + request.http_version.decode("ascii"),
        "REMOTE_ADDR": peer[0],
        "REMOTE_PORT": str(peer[1]),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if scheme == "https":
        environ["HTTPS"] = "on"
    for raw_name, value in request.headers.raw_items():
        # X_Forwarded and X-Forwarded would both become HTTP_X_FORWARDED: the underscore
        # spelling is dropped (as cheroot and nginx do).
        if b"_" in raw_name:
            continue
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        if name in ("CONTENT_LENGTH", "TRANSFER_ENCODING"):
            continue                                # the body is handed over whole, below
        key = name if name == "CONTENT_TYPE" else "HTTP_" + name
        text = value.decode("latin-1")
        environ[key] = f"{environ[key]},{text}" if key in environ else text
    if body or request.method not in (b"GET", b"HEAD"):
        environ["CONTENT_LENGTH"] = str(len(body))
    return environ


def run_wsgi(app: WsgiApp, environ: dict[str, Any]) -> WsgiAnswer:
    """Call the application on this (worker) thread and collect its whole answer."""
    started: list = []
    written: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
        if exc_info and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [status, headers]
        return written.append

    result = app(environ, start_response)
    try:
        written.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("the application returned without calling start_response")
    status, headers = started
    code, _, reason = status.partition(" ")
    return WsgiAnswer(int(code), reason, list(headers), b"".join(written))
