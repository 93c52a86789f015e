"""The sidecar's Flask application: `create_app(config=None)`.

Every request passes, in this order: authentication (auth.py: 401/403) → audit (one
structured line per request, whatever its outcome, written as the response leaves) →
rate limit per key (429) → the handler. Errors anywhere are JSON with a stable code
(errors.py). The body size limit (413) applies to chunked bodies too
(_enforce_body_limit).
"""
from __future__ import annotations

import io
import time
from typing import Any, Mapping

from apiflask import APIFlask
from flask import g, request

from fabricscope.httpserver import read_body

from . import alerts, chaos_api, errors, housekeeping, probes, seedviews
from .audit import audit_record, make_audit_logger
from .auth import OPEN, SECURITY_SCHEMES, authenticate, endpoint_scope
from .config import SidecarConfig, load_config
from .context import EXTENSION, Sidecar
from .errors import ApiError
from .jsonbody import StrictJSONProvider
from .keys import KeyStore
from .metrics import SidecarMetrics
from .prom import PrometheusClient, PrometheusError
from .ratelimit import RateLimiter
from .storage import StorageError, open_storage

from .cluster import api as cluster_api
from .query import api as query_api
from .tracing import api as tracing_api

# Every area of the sidecar, in one place: its blueprint and the setup that gives the
# Sidecar its service, capabilities and background workers (None: routes only).
AREAS = [
    (probes.bp, None),
    (housekeeping.bp, housekeeping.setup),
    (tracing_api.bp, tracing_api.setup),
    (cluster_api.bp, cluster_api.setup),
    (seedviews.bp, seedviews.setup),
    (alerts.bp, alerts.setup),
    (query_api.bp, query_api.setup),
    (chaos_api.bp, chaos_api.setup),
]

OPENAPI_PATH = "/api/v1/openapi.json"


def create_app(config: SidecarConfig | Mapping[str, Any] | None = None) -> APIFlask:
    """The app for `config` (a SidecarConfig, a mapping of settings, or None for the
    environment). Opens storage (migrations, lock) and fails here, before serving, on any
    problem. Background workers are not started: call
    `app.extensions["fabricscope"].start_background()` (the server does, once it listens)."""
    if config is None:
        config = load_config()
    elif not isinstance(config, SidecarConfig):
        config = load_config(dict(config), environ={})
    app = APIFlask("fabricscope.queryapi", title="fabricscope sidecar", version=_api_version(),
                   spec_path=OPENAPI_PATH, docs_path="/api/v1/docs")
    app.config.update(
        MAX_CONTENT_LENGTH=config.max_body_bytes,
        OPENAPI_VERSION="3.1.0",
        SECURITY_SCHEMES=SECURITY_SCHEMES,
        # Validation errors are 422 with the field paths in detail.
        VALIDATION_ERROR_STATUS_CODE=422,
        JSON_SORT_KEYS=False,
    )
    metrics = SidecarMetrics()
    state = Sidecar(
        config=config,
        storage=open_storage(config.database),
        prom=PrometheusClient(config.prometheus_url, config.prometheus_timeout_seconds, metrics=metrics),
        metrics=metrics,
        keys=KeyStore(config.keys_file),
        limiter=RateLimiter(),
        audit=make_audit_logger(config.audit_log),
    )
    app.extensions[EXTENSION] = state
    app.json = StrictJSONProvider(app)
    errors.install(app)
    _install_pipeline(app, state)
    _install_error_mappings(app)
    for blueprint, setup in AREAS:
        app.register_blueprint(blueprint)
        if setup is not None:
            setup(app, state)
    return app


def _api_version() -> str:
    from .probes import full_version
    return full_version()


def _install_pipeline(app: APIFlask, state: Sidecar) -> None:
    @app.before_request
    def _auth_then_rate_limit():
        g.started = time.perf_counter()
        g.scope = endpoint_scope(request.endpoint)
        key = authenticate(state.keys, g.scope)             # 1. auth (raises 401/403)
        # 2. audit: written by _audit below for every response, including this request's
        #    429 or the 401/403 above.
        if key is not None:                                  # 3. rate limit
            limit = key.rate_limit or state.config.rate_limit
            allowed, retry_after = state.limiter.allow(key.id, limit.per_second, limit.burst)
            if not allowed:
                state.metrics.rate_limited.inc()
                raise ApiError(429, f"rate limit of {limit.per_second:g}/s (burst {limit.burst}) exceeded "
                                    f"for key {key.id!r}", code="rate_limited",
                               headers={"Retry-After": str(max(1, round(retry_after)))})
        _enforce_body_limit(state.config.max_body_bytes)
        _check_media_type()

    @app.after_request
    def _audit(response):
        started = g.get("started", time.perf_counter())
        key = g.get("api_key")
        error_code = None
        if response.status_code >= 400 and response.is_json:
            body = response.get_json(silent=True) or {}
            error_code = (body.get("error") or {}).get("code") if isinstance(body, dict) else None
        state.audit.info(audit_record(
            method=request.method, path=request.path, status=response.status_code,
            key_id=key.id if key else None, scope=g.get("scope"), remote=request.remote_addr,
            started=started, error_code=error_code, request_bytes=request.content_length))
        endpoint = request.endpoint or "unmatched"
        state.metrics.requests.labels(endpoint, request.method, str(response.status_code)).inc()
        state.metrics.request_seconds.labels(endpoint).observe(time.perf_counter() - started)
        return response


def _enforce_body_limit(limit: int) -> None:
    """Read the request body whole, here, before any handler: 413 for a body over `limit`.

    A declared Content-Length over the limit is refused before any byte is read. A chunked
    body (no Content-Length) is read up to one byte past the limit: werkzeug's own limit
    stops reading at the limit and passes the truncated body on, which a JSON parser would
    report as a 400. The HTTP server has read the body already, under its deadlines and
    framing checks (fabricscope/httpconnection.py); this check serves any WSGI server."""
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, f"request body of {length} bytes exceeds the {limit}-byte limit",
                       code="payload_too_large")
    chunked = request.environ.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked"
    if not length and not chunked:
        return
    buffer = read_body(request.environ, limit)
    if buffer is None:
        raise ApiError(413, f"chunked request body exceeds the {limit}-byte limit", code="payload_too_large")
    request.environ["wsgi.input"] = io.BytesIO(buffer)
    request.environ["CONTENT_LENGTH"] = str(len(buffer))
    request.environ.pop("HTTP_TRANSFER_ENCODING", None)


def _check_media_type() -> None:
    """415 for a body in a media type the endpoint does not take (from its OpenAPI body)."""
    view = request.endpoint and _view_spec(request.endpoint)
    if not view or "body" not in view or request.method in ("GET", "HEAD", "OPTIONS", "DELETE"):
        return
    accepted = view.get("content_type") or "application/json"
    accepted = [accepted] if isinstance(accepted, str) else list(accepted)
    if request.mimetype not in accepted:
        raise ApiError(415, f"Content-Type {request.mimetype or '(none)'!r} is not accepted here; "
                            f"send {' or '.join(accepted)}", code="unsupported_media_type",
                       detail={"accepted": accepted})


def _view_spec(endpoint: str) -> dict | None:
    from flask import current_app
    view = current_app.view_functions.get(endpoint)
    return getattr(view, "_spec", None)


def _install_error_mappings(app: APIFlask) -> None:
    @app.errorhandler(PrometheusError)
    def _prometheus(exc: PrometheusError):
        status = 504 if exc.reason == "timeout" else 502 if exc.reason in ("bad_response", "query_error") else 503
        error = ApiError(status, exc.public_message, code=f"prometheus_{exc.reason}")
        return errors.error_body(error), status

    @app.errorhandler(StorageError)
    def _storage(exc: StorageError):
        error = ApiError(503, str(exc), code="storage_unavailable")
        return errors.error_body(error), 503


__all__ = ["create_app", "AREAS", "OPEN"]
