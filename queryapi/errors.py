"""JSON errors with stable codes.

Every error the sidecar returns has the body
`{"error": {"code": "<stable_code>", "message": "<human text>", "detail": {...}}}`.
Clients branch on `code`, never on the message, so a reworded message cannot turn one
kind of failure into another (the seed's sentinel-error lesson). Raise `ApiError` (or a
subclass) from any handler; werkzeug's own HTTP errors map to the same shape.
"""
from __future__ import annotations

import json
from typing import Any

from apiflask import HTTPError

from fabricscope.httpconnection import capped

# Default code per status when the raiser gives none.
DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_failed",
    429: "rate_limited",
    500: "internal_error",
    502: "upstream_error",
    503: "unavailable",
    504: "upstream_timeout",
}


class ApiError(HTTPError):
    """An error response: `ApiError(404, "no such trace", code="trace_not_found")`."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 detail: Any = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, detail=detail or {}, headers=headers,
                         extra_data={"code": code or DEFAULT_CODES.get(status, "error")})


def error_body(error: HTTPError) -> dict[str, Any]:
    code = (error.extra_data or {}).get("code") or DEFAULT_CODES.get(error.status_code, "error")
    detail = error.detail
    # Capped: a message that quotes a client's value never sends a whole one back.
    return {"error": {"code": code, "message": capped(str(error.message)), "detail": detail or {}}}


def server_error_body(status: int, message: str) -> tuple[str, bytes]:
    """The HTTP server's own refusals (a body too large or too slow, malformed framing, no
    worker free) in the same shape as the app's errors."""
    body = {"error": {"code": DEFAULT_CODES.get(status, "error"), "message": message, "detail": {}}}
    return "application/json", json.dumps(body).encode()


def install(app) -> None:
    @app.error_processor
    def _process(error: HTTPError):
        return error_body(error), error.status_code, error.headers
