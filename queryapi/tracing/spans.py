"""The seed's span format, validated one span at a time: a bad span is rejected with its
index and reasons, the good spans of the same batch are kept."""
from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from ..storage import SpanRow

# 2100-01-01 in Unix ms: anything later is a unit mistake (ns or µs sent as ms).
MAX_TIME_MS = 4_102_444_800_000
MAX_PATH_HOPS = 64
MAX_BATCH_SPANS = 10_000
# Printable identifiers only: these end up in logs, labels and query parameters.
ID_PATTERN = r"^[A-Za-z0-9._:/-]+$"
NAME_PATTERN = r"^[^\x00-\x1f\x7f]+$"


class SpanIn(BaseModel):
    """One span as seed 000 §14.4 sends it."""
    model_config = ConfigDict(extra="forbid")
    trace_id: str = Field(min_length=1, max_length=128, pattern=ID_PATTERN)
    span_id: str = Field(min_length=1, max_length=64, pattern=ID_PATTERN)
    parent_span_id: str | None = Field(None, max_length=64, pattern=ID_PATTERN)
    service: str = Field(min_length=1, max_length=128, pattern=NAME_PATTERN)
    operation: str = Field(min_length=1, max_length=256, pattern=NAME_PATTERN)
    start_time_ms: int = Field(ge=0, le=MAX_TIME_MS)
    end_time_ms: int = Field(ge=0, le=MAX_TIME_MS)
    duration_ms: float | None = Field(None, ge=0, le=MAX_TIME_MS,
                                      description="defaults to end_time_ms - start_time_ms")
    network_path: list[str] = Field(default_factory=list, max_length=MAX_PATH_HOPS,
                                    description="devices the request crossed, e.g. [gpu-srv-01, ib-sw-01, gpu-srv-02]")
    attributes: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "SpanIn":
        if self.end_time_ms < self.start_time_ms:
            raise ValueError("end_time_ms is before start_time_ms")
        for hop in self.network_path:
            if not hop or len(hop) > 253 or any(ord(c) < 0x20 or ord(c) == 0x7f for c in hop):
                raise ValueError(f"network_path entry {hop[:40]!r} is not a device name (1-253 printable characters)")
        return self


class SpanBatchIn(BaseModel):
    """POST /tracing/spans body."""
    spans: list[SpanIn] = Field(max_length=MAX_BATCH_SPANS)


class Rejection(BaseModel):
    index: int
    errors: list[dict[str, str]]


class IngestOut(BaseModel):
    accepted: int = Field(description="spans that passed validation")
    stored: int = Field(description="accepted spans not stored before (a re-sent span is stored once)")
    violations: int = Field(description="accepted spans over their SLO")
    rejected: list[Rejection]


_SPAN_LIST = TypeAdapter(list[SpanIn])


def validate_batch(raw_spans: list[Any], slo_for, ingest_format: str,
                   max_future_seconds: float | None = None) -> tuple[list[SpanRow], list[Rejection]]:
    """Every span validated in one pass (pydantic's core walks the list); when some fail,
    their errors are grouped by index and the others are validated again without them.
    A span ending more than `max_future_seconds` past this clock is rejected: the "last
    hour" views sort by end time, and a span stamped in 2100 would top them for decades."""
    try:
        good = list(enumerate(_SPAN_LIST.validate_python(raw_spans)))
        by_index: dict[int, list[dict[str, str]]] = {}
    except ValidationError as exc:
        by_index = {}
        for error in exc.errors():
            index, *field = error["loc"]
            by_index.setdefault(int(index), []).append(
                {"field": ".".join(str(p) for p in field) or "span", "message": error["msg"]})
        keep = [i for i in range(len(raw_spans)) if i not in by_index]
        good = list(zip(keep, _SPAN_LIST.validate_python([raw_spans[i] for i in keep])))
    if max_future_seconds is not None:
        latest = int((time.time() + max_future_seconds) * 1000)
        for index, span in good:
            if span.end_time_ms > latest:
                by_index[index] = [{"field": "end_time_ms", "message": (
                    f"{span.end_time_ms} is {(span.end_time_ms - latest) / 1000 + max_future_seconds:.0f} s after "
                    f"this sidecar's clock; at most {max_future_seconds:g} s of clock skew is accepted "
                    "(span_max_future_skew_seconds)")}]
        good = [(index, span) for index, span in good if index not in by_index]
    rejected = [Rejection(index=i, errors=errors) for i, errors in sorted(by_index.items())]
    rows = [to_row(span, slo_for(span.service, span.operation), ingest_format) for _, span in good]
    return rows, rejected


def to_row(span: SpanIn, slo_ms: float, ingest_format: str) -> SpanRow:
    duration = span.duration_ms if span.duration_ms is not None else float(span.end_time_ms - span.start_time_ms)
    return SpanRow(trace_id=span.trace_id, span_id=span.span_id, service=span.service, operation=span.operation,
                   start_ms=span.start_time_ms, end_ms=span.end_time_ms, duration_ms=duration,
                   network_path=list(span.network_path), attributes=dict(span.attributes), slo_ms=slo_ms,
                   ingest_format=ingest_format)
