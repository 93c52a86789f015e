"""Bulkheads: which worker pool of the HTTP server runs each sidecar endpoint.

Handlers that wait on Prometheus run in their own pool, handlers that wait on the
database in theirs, and everything else (probes, catalogs, the OpenAPI document) in the
default pool: a paused Prometheus or a locked database fills only its own pool, and a
request that needs neither is never queued behind them. Inside the backend pools one key
may run only PER_KEY requests at once, so one key's slow queries leave room for the
others. The key is the credential as sent (hashed), counted before it is verified: a
client that sends a different made-up key each time is still held to its address's
share by the server.
"""
from __future__ import annotations

import hashlib
from typing import Any

from werkzeug.exceptions import HTTPException

from fabricscope.httpserver import PoolSize

PROMETHEUS, DATABASE, DEFAULT = "prometheus", "database", "default"
PER_KEY = 2

# Endpoints by blueprint, then the exceptions by endpoint name.
_BY_BLUEPRINT = {
    "seed": PROMETHEUS,
    "cluster": PROMETHEUS,
    "tracing": DATABASE,
    "alerts": DATABASE,
    "housekeeping": DATABASE,
    "chaos": DATABASE,
}
_BY_ENDPOINT = {
    "query.conversation": PROMETHEUS,
    "query.meshql": PROMETHEUS,
    "query.tools_call": PROMETHEUS,
    "query.mcp": PROMETHEUS,
    "chaos.topology": DEFAULT,            # the in-memory graph
    "chaos.devices": DEFAULT,
}


def pool_sizes(threads: int) -> dict[str, PoolSize]:
    """The backend pools, each half the request threads (at least two)."""
    size = max(2, threads // 2)
    return {PROMETHEUS: PoolSize(size, per_key=PER_KEY), DATABASE: PoolSize(size, per_key=PER_KEY)}


def make_route(app):
    """The server's `route`: (pool, key) for a request, from its URL and credential."""
    url_map = app.url_map

    def route(environ: dict[str, Any]) -> tuple[str, str | None]:
        try:
            endpoint, _ = url_map.bind_to_environ(environ).match()
        except HTTPException:
            return DEFAULT, None                  # 404/405 and redirects: answered at once
        pool = _BY_ENDPOINT.get(endpoint) or _BY_BLUEPRINT.get(endpoint.partition(".")[0], DEFAULT)
        if endpoint == "probes.health" and environ.get("HTTP_AUTHORIZATION"):
            pool = PROMETHEUS                     # with a key it checks Prometheus too
        credential = environ.get("HTTP_AUTHORIZATION") or environ.get("HTTP_X_API_KEY")
        key = hashlib.sha256(credential.encode("latin-1")).hexdigest()[:16] if credential else None
        return pool, key

    return route
