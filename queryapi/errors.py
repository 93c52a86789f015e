"""JSON errors with stable codes.

Every error the sidecar returns has the body
`{"error": {"code": "<stable_code>", "message": "<human text>", "detail": {...}}}`.
Clients branch on `code`, never on the message, so a reworded message cannot turn one
kind of failure into another (the seed's sentinel-error lesson). Raise `ApiError` (or a
subclass) from any handler; werkzeug's own HTTP errors map to the same shape.
"""
from __future__ import annotations

import json
import re
from typing import Any

from apiflask import HTTPError

from fabricscope.httpconnection import capped

from .error_codes import DEFAULT_CODES, MEANINGS


class ApiError(HTTPError):
    """An error response: `ApiError(404, "no such trace", code="trace_not_found")`."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 detail: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, detail=detail or {}, headers=headers,
                         extra_data={"code": code or DEFAULT_CODES.get(status, "error")})


# An address inside a message: a URL, an IP address (with or without its port), or a
# host:port. The sidecar's backends (Prometheus, Alertmanager, PostgreSQL) are internal.
_ADDRESS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+|\b\d{1,3}(?:\.\d{1,3}){3}\b|\[[0-9A-Fa-f:.]+\]"
                      r"|\b[A-Za-z0-9][A-Za-z0-9.-]*:\d{2,5}\b")


def public_message(status: int, code: str, message: str) -> str:
    """What a client is told: a 5xx message that names an address is replaced by its
    code's public meaning (docs/sidecar.md's table). One place for every route and both
    tool transports, so a backend error worded anywhere cannot carry an internal URL out;
    the logs keep the full message."""
    if status < 500 or not _ADDRESS.search(message):
        return message
    return MEANINGS.get(code) or MEANINGS[DEFAULT_CODES.get(status, "internal_error")]


def error_body(error: HTTPError) -> dict[str, Any]:
    code = (error.extra_data or {}).get("code") or DEFAULT_CODES.get(error.status_code, "error")
    detail = error.detail
    message = public_message(error.status_code, code, str(error.message))
    # Capped: a message that quotes a client's value never sends a whole one back.
    return {"error": {"code": code, "message": capped(message), "detail": detail or {}}}


def server_error_body(status: int, message: str) -> tuple[str, bytes]:
    """The HTTP server's own refusals (a body too large or too slow, malformed framing, no
    worker free) in the same shape as the app's errors."""
    body = {"error": {"code": DEFAULT_CODES.get(status, "error"), "message": message, "detail": {}}}
    return "application/json", json.dumps(body).encode()


def install(app) -> None:
    @app.error_processor
    def _process(error: HTTPError):
        return error_body(error), error.status_code, error.headers
