"""Authentication and scopes for every endpoint.

An endpoint declares what it needs with a decorator (put it directly under the route
decorator):

    @bp.get("/tracing/correlations")
    @require_scope("read")          # read | write | admin; admin includes write includes read
    def correlations(): ...

    @bp.get("/api/versions")
    @open_endpoint                  # probes and the query catalog only
    def versions(): ...

An endpoint with neither needs `read`: forgetting the decorator never opens an endpoint.
Credentials are `Authorization: Bearer <key>` or `X-API-Key: <key>`. The matched key is
`current_key()` inside a handler (None on an open endpoint called without a key).
"""
from __future__ import annotations

from typing import Callable

from flask import current_app, g, request

from apiflask.scaffold import _annotate

from .errors import ApiError
from .keys import SCOPES, KeyEntry

SCOPE_ATTR = "_fabricscope_scope"
OPEN = "open"
DEFAULT_SCOPE = "read"
# OpenAPI names of the two ways to send a key (app.py registers the schemes).
SECURITY = ["ApiKeyHeader", "BearerAuth"]
SECURITY_SCHEMES = {
    "ApiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
    "BearerAuth": {"type": "http", "scheme": "bearer"},
}


def require_scope(scope: str) -> Callable:
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; known: {SCOPES}")

    def decorator(view: Callable) -> Callable:
        setattr(view, SCOPE_ATTR, scope)
        _annotate(view, security=list(SECURITY))
        return view
    return decorator


def open_endpoint(view: Callable) -> Callable:
    setattr(view, SCOPE_ATTR, OPEN)
    return view


def endpoint_scope(endpoint: str | None) -> str:
    view = current_app.view_functions.get(endpoint) if endpoint else None
    return getattr(view, SCOPE_ATTR, DEFAULT_SCOPE)


def presented_credentials() -> str | None:
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "Authorization header must be 'Bearer <key>'", code="bad_credentials",
                           headers={"WWW-Authenticate": "Bearer"})
        return token.strip()
    key = request.headers.get("X-API-Key")
    return key.strip() if key is not None else None


def authenticate(store, scope: str) -> KeyEntry | None:
    """The key for this request, or an ApiError: 401 without a valid key, 403 when the
    key lacks `scope`. Open endpoints accept no key, but a key given must be valid."""
    token = presented_credentials()
    entry = store.lookup(token) if token else None
    g.api_key = entry
    if token and entry is None:
        raise ApiError(401, "unknown API key", code="bad_credentials", headers={"WWW-Authenticate": "Bearer"})
    if scope == OPEN:
        return entry
    if entry is None:
        raise ApiError(401, "this endpoint needs an API key (Authorization: Bearer <key> or X-API-Key)",
                       code="unauthenticated", headers={"WWW-Authenticate": "Bearer"})
    if not entry.grants(scope):
        raise ApiError(403, f"key {entry.id!r} lacks the {scope!r} scope this endpoint needs",
                       code="forbidden", detail={"needs": scope, "has": entry.scopes})
    return entry


def current_key() -> KeyEntry | None:
    return g.get("api_key")
