"""Tracing endpoints: span ingest (seed format and OTLP/HTTP), SLO violations, correlations."""
from __future__ import annotations

import time
import zlib
from typing import Any

from apiflask import APIBlueprint
from flask import Response, request
from pydantic import BaseModel, Field, model_validator

from .. import jsonbody
from ..auth import current_key, require_scope
from ..context import sidecar
from ..docs import documented_body
from ..errors import ApiError
from ..storage import SpanRow
from ..workers import PeriodicWorker
from . import otlp
from .correlate import Correlator
from .spans import ID_PATTERN, MAX_BATCH_SPANS, NAME_PATTERN, IngestOut, SpanBatchIn, validate_batch

bp = APIBlueprint("tracing", __name__, tag="Tracing")

PROTOBUF = "application/x-protobuf"


def setup(app, state) -> None:
    correlator = Correlator(state.storage, state.prom, state.metrics)
    worker = PeriodicWorker("correlator", state.config.correlation_interval_seconds, correlator.run_once)
    correlator.stopping = worker.stopping
    state.workers.append(worker)
    state.correlator, state.correlation_worker = correlator, worker
    state.capabilities.update({"tracing", "otlp_http"})


def _store(rows: list[SpanRow], ingest_format: str) -> tuple[int, int]:
    state = sidecar()
    stored = state.storage.insert_spans(rows)
    metrics = state.metrics
    # Counted per (service, operation) first: one counter update per pair, not per span.
    evaluated: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        counts = evaluated.setdefault((row.service, row.operation), [0, 0])
        counts[0] += 1
        counts[1] += row.violated
    for (service, operation), (total, violated) in evaluated.items():
        pair = metrics.slo_pair(service, operation)
        metrics.spans_evaluated.labels(*pair).inc(total)
        if violated:
            metrics.slo_violations.labels(*pair).inc(violated)
    violations = sum(violated for _, violated in evaluated.values())
    metrics.spans_received.labels(ingest_format).inc(len(rows))
    if violations:
        state.correlation_worker.wake()
    return stored, violations


def _spend_spans(count: int) -> None:
    """429 when the key's span budget (spans_per_second, span_burst) has no room for
    `count` more spans."""
    state = sidecar()
    key = current_key()
    if key is None or not count:
        return
    config = state.config
    allowed, retry_after = state.limiter.allow(f"spans:{key.id}", config.spans_per_second, config.span_burst, count)
    if not allowed:
        state.metrics.rate_limited.inc()
        raise ApiError(429, f"span rate of {config.spans_per_second:g}/s (burst {config.span_burst}) exceeded for "
                            f"this key; {count} spans did not fit", code="rate_limited",
                       headers={"Retry-After": str(max(1, round(retry_after)))})


def _body() -> bytes:
    """The request body, gunzipped when Content-Encoding says so (bounded: a small gzip
    must not inflate past the body limit)."""
    data = request.get_data(cache=False)
    encoding = request.headers.get("Content-Encoding", "identity").lower()
    if encoding in ("", "identity"):
        return data
    if encoding != "gzip":
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported; use gzip or none",
                       code="unsupported_encoding")
    limit = sidecar().config.max_body_bytes
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ApiError(400, f"body is not valid gzip: {exc}", code="bad_gzip") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise ApiError(413, f"decompressed body exceeds the {limit}-byte limit", code="payload_too_large")
    return out


def _refuse_json_past_cap(body: bytes) -> None:
    """422 for a JSON body with more objects and arrays than a full batch could need,
    before it is parsed into that many dicts and lists."""
    if otlp.json_may_hold_too_many(body, MAX_BATCH_SPANS):
        raise ApiError(422, f"a batch holds at most {MAX_BATCH_SPANS} spans, and this body has more JSON objects "
                            f"and arrays than {otlp.JSON_CONTAINERS_PER_SPAN} per span of that", code="batch_too_large")


@bp.post("/tracing/spans")
@require_scope("write")
@documented_body(SpanBatchIn)
@bp.output(IngestOut)
@bp.doc(summary="Ingest a batch of spans (seed format); bad spans are rejected by index, good ones kept",
        responses={422: "no span of the batch was valid, or the body is not a batch"})
def ingest_spans():
    raw = _body()
    _refuse_json_past_cap(raw)
    try:
        body = jsonbody.loads(raw)
    except ValueError as exc:
        raise ApiError(400, f"body is not JSON: {exc}", code="bad_json") from None
    if not isinstance(body, dict) or not isinstance(body.get("spans"), list):
        raise ApiError(422, "body must be an object with a 'spans' list", code="not_a_span_batch")
    if len(body["spans"]) > MAX_BATCH_SPANS:
        raise ApiError(422, f"a batch holds at most {MAX_BATCH_SPANS} spans, got {len(body['spans'])}",
                       code="batch_too_large")
    _spend_spans(len(body["spans"]))
    state = sidecar()
    rows, rejected = validate_batch(body["spans"], state.config.slo_for, "seed",
                                    state.config.span_max_future_skew_seconds)
    state.metrics.spans_rejected.labels("seed").inc(len(rejected))
    if rejected and not rows:
        raise ApiError(422, f"all {len(rejected)} span(s) were rejected", code="all_spans_rejected",
                       detail={"rejected": [r.model_dump() for r in rejected]})
    stored, violations = _store(rows, "seed")
    return {"accepted": len(rows), "stored": stored, "violations": violations, "rejected": rejected}


class OtlpTracesJson(BaseModel):
    """OTLP/JSON ExportTraceServiceRequest (see the OpenTelemetry protocol specification)."""
    resourceSpans: list[dict[str, Any]] = Field(default_factory=list)


@bp.post("/v1/traces")
@require_scope("write")
@documented_body(OtlpTracesJson, ["application/json", PROTOBUF])
@bp.doc(summary="OTLP/HTTP trace export (protobuf or JSON); network_path from the span attribute "
                "'network_path'", responses={200: "ExportTraceServiceResponse (partial_success lists rejections)"})
def otlp_traces():
    as_json = request.mimetype == "application/json"
    body = _body()
    # The seed format's cap, counted before anything is parsed: 4 million empty spans fit
    # in 8 KB of gzip, and parsing them took 700 MB before the count could refuse them.
    # The key's span budget is spent before the parse too.
    try:
        if as_json:
            _refuse_json_past_cap(body)
        else:
            _spend_spans(otlp.count_protobuf_spans(body, MAX_BATCH_SPANS))
        message = otlp.parse_json(body) if as_json else otlp.parse_protobuf(body)
    except otlp.TooManySpans as exc:
        raise ApiError(422, str(exc), code="batch_too_large") from None
    except otlp.OtlpError as exc:
        raise ApiError(400, str(exc), code="bad_otlp") from None
    if as_json:
        count = otlp.span_count(message)
        if count > MAX_BATCH_SPANS:
            raise ApiError(422, f"a batch holds at most {MAX_BATCH_SPANS} spans, got {count}",
                           code="batch_too_large")
        _spend_spans(count)
    spans = list(otlp.seed_spans(message))
    state = sidecar()
    rows, rejected = validate_batch(spans, state.config.slo_for, "otlp",
                                    state.config.span_max_future_skew_seconds)
    state.metrics.spans_rejected.labels("otlp").inc(len(rejected))
    _store(rows, "otlp")
    message_text = "; ".join(f"span {r.index}: {r.errors[0]['field']}: {r.errors[0]['message']}"
                             for r in rejected[:5])
    payload = otlp.response_bytes(len(rejected), message_text, as_json)
    return Response(payload, status=200, mimetype="application/json" if as_json else PROTOBUF)


CURSOR_PATTERN = r"^[0-9]{1,15}:[0-9]{1,18}$"     # "<end_ms>:<pk>" of a page's last span


# A dashboard's time range (Grafana's ${__from} and ${__to}, epoch milliseconds): a table
# for 05:55-06:10 lists what ended in it, not what ended since.
EPOCH_MS_MAX = 10 ** 14


class TimeRange(BaseModel):
    from_ms: int | None = Field(None, ge=0, le=EPOCH_MS_MAX,
                                description="only spans that ended at or after this time (epoch ms); "
                                            "replaces window_seconds")
    to_ms: int | None = Field(None, ge=0, le=EPOCH_MS_MAX,
                              description="only spans that ended at or before this time (epoch ms)")

    @model_validator(mode="after")
    def _ordered(self):
        if self.from_ms is not None and self.to_ms is not None and self.to_ms < self.from_ms:
            raise ValueError(f"to_ms ({self.to_ms}) is before from_ms ({self.from_ms})")
        return self

    def since(self, window_seconds: int | None) -> int | None:
        if self.from_ms is not None:
            return self.from_ms
        return int((time.time() - window_seconds) * 1000) if window_seconds else None


class ViolationsQuery(TimeRange):
    service: str | None = Field(None, max_length=128, pattern=NAME_PATTERN)
    operation: str | None = Field(None, max_length=256, pattern=NAME_PATTERN)
    window_seconds: int = Field(3600, ge=1, le=31 * 86400, description="trailing window (default 1 h)")
    limit: int = Field(500, ge=1, le=5000)
    cursor: str | None = Field(None, max_length=64, pattern=CURSOR_PATTERN,
                               description="next_cursor of the previous page")


class SpanOut(BaseModel):
    trace_id: str
    span_id: str
    service: str
    operation: str
    start_ms: int
    end_ms: int
    duration_ms: float
    slo_ms: float
    network_path: list[str]
    attributes: dict[str, Any]
    ingest_format: str


class ViolationsOut(BaseModel):
    window_seconds: int
    violations: list[SpanOut]
    next_cursor: str | None = Field(description="pass as cursor for the next (older) page; null on the last page")


@bp.get("/tracing/slo-violations")
@require_scope("read")
@bp.input(ViolationsQuery, location="query")
@bp.output(ViolationsOut)
@bp.doc(summary="Spans over their (service, operation) SLO in the trailing window, newest first, "
                "paginated: next_cursor leads to the next page")
def slo_violations(query_data: ViolationsQuery):
    since = query_data.since(query_data.window_seconds)
    before = tuple(int(part) for part in query_data.cursor.split(":")) if query_data.cursor else None
    # One row more than asked tells whether another page exists without a COUNT.
    rows = sidecar().storage.slo_violations(since, until_ms=query_data.to_ms, service=query_data.service,
                                            operation=query_data.operation, limit=query_data.limit + 1, before=before)
    page, more = rows[:query_data.limit], len(rows) > query_data.limit
    return {"window_seconds": query_data.window_seconds, "violations": page,
            "next_cursor": f"{page[-1]['end_ms']}:{page[-1]['pk']}" if more else None}


class CorrelationsQuery(TimeRange):
    trace_id: str | None = Field(None, max_length=128, pattern=ID_PATTERN)
    window_seconds: int | None = Field(None, ge=1, le=31 * 86400)
    limit: int = Field(500, ge=1, le=5000)


class CorrelationOut(BaseModel):
    trace_id: str
    span_id: str
    service: str
    operation: str
    span_end_ms: int
    duration_ms: float
    slo_ms: float
    matched_anomaly_count: int
    path_length: int
    confidence: float
    anomalies: list[dict[str, Any]]
    correlated_ms: int


class CorrelationsOut(BaseModel):
    correlations: list[CorrelationOut]
    pending: int = Field(description="violations (of the trace, when trace_id is given) not yet evaluated "
                                     "against Prometheus")


@bp.get("/tracing/correlations")
@require_scope("read")
@bp.input(CorrelationsQuery, location="query")
@bp.output(CorrelationsOut)
@bp.doc(summary="SLO violations correlated with network anomalies on their path (confidence >= 0.25)")
def correlations(query_data: CorrelationsQuery):
    storage = sidecar().storage
    rows = storage.correlations(trace_id=query_data.trace_id, since_ms=query_data.since(query_data.window_seconds),
                                until_ms=query_data.to_ms, limit=query_data.limit)
    return {"correlations": rows, "pending": storage.count_pending_violations(query_data.trace_id)}


class SlosOut(BaseModel):
    default_ms: float
    overrides: dict[str, float] = Field(description="TRACING_SLO_<service>_<operation> suffix -> ms")


@bp.get("/tracing/slos")
@require_scope("read")
@bp.output(SlosOut)
@bp.doc(summary="The SLO thresholds in force")
def slos():
    config = sidecar().config
    return {"default_ms": config.slo_default_ms, "overrides": config.slo_overrides}
