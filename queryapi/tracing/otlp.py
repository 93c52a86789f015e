"""OTLP/HTTP trace requests (protobuf or JSON) decoded into seed-format span dicts, which
then pass the same per-span validation as POST /tracing/spans.

Mapping: service = resource attribute `service.name`; operation = span name; times from
the span's Unix nanoseconds; network_path = span attribute `network_path` (a string array,
or one comma-separated string); every other span attribute is kept in `attributes`.
OTLP/JSON writes trace and span ids as hex (not protobuf-JSON base64), so they are
converted before the standard protobuf JSON parser reads the request.
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Iterator

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from .. import jsonbody

NETWORK_PATH_ATTRIBUTE = "network_path"
SERVICE_NAME_ATTRIBUTE = "service.name"
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class OtlpError(ValueError):
    """The request is not an OTLP trace export (the message says why)."""


class TooManySpans(OtlpError):
    """More spans (or span containers) than the cap: found before anything is parsed."""

    def __init__(self, cap: int, what: str = "spans") -> None:
        super().__init__(f"a batch holds at most {cap} {what}; this one has more")
        self.cap = cap


# Field numbers on the wire: ExportTraceServiceRequest.resource_spans = 1,
# ResourceSpans.scope_spans = 2, ScopeSpans.spans = 2.
_RESOURCE_SPANS, _SCOPE_SPANS, _SPANS = 1, 2, 2


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise OtlpError("body is not an OTLP ExportTraceServiceRequest protobuf: truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: memoryview, wanted: int):
    """The payloads of length-delimited field `wanted` in one message, without decoding
    the rest (other fields are skipped by their wire type)."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, at = _varint(data, at)
        elif wire_type == 1:
            at += 8
        elif wire_type == 5:
            at += 4
        elif wire_type == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise OtlpError("body is not an OTLP ExportTraceServiceRequest protobuf: a field runs past the end")
            if number == wanted:
                yield data[at:at + length]
            at += length
        else:                               # groups (3, 4) are not in the OTLP messages
            raise OtlpError(f"body is not an OTLP ExportTraceServiceRequest protobuf: wire type {wire_type}")
        if at > len(data):
            raise OtlpError("body is not an OTLP ExportTraceServiceRequest protobuf: truncated")


def count_protobuf_spans(body: bytes, cap: int) -> int:
    """Spans in a protobuf export, counted from the wire format without building a message;
    TooManySpans as soon as they, or the resource and scope containers holding them, pass
    `cap`. Parsing builds an object per span: 4 million empty spans fit in 8 MiB (8 KB
    gzipped) and took 700 MB to parse, before the count could refuse them."""
    data = memoryview(body)
    spans = containers = 0
    for resource_spans in _fields(data, _RESOURCE_SPANS):
        containers += 1
        for scope_spans in _fields(resource_spans, _SCOPE_SPANS):
            containers += 1
            for _ in _fields(scope_spans, _SPANS):
                spans += 1
                if spans > cap:
                    raise TooManySpans(cap)
        if containers > cap:
            raise TooManySpans(cap, "resource and scope span groups")
    return spans


def json_may_hold_too_many(body: bytes, cap: int) -> bool:
    """Whether a JSON body has more objects and arrays than `cap` spans could need, counted
    in the raw bytes (a brace inside a string counts too, so this errs towards refusing
    only far past any real batch). Every object becomes a dict when parsed: 2.8 million
    empty spans fit in 8 MiB of JSON."""
    return body.count(b"{") + body.count(b"[") > cap * JSON_CONTAINERS_PER_SPAN


# Objects and arrays a span may carry in OTLP/JSON (its attributes' key-value objects,
# events, links): 64 each on average, far above what the demo and tests send.
JSON_CONTAINERS_PER_SPAN = 64


def parse_protobuf(body: bytes) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError) as exc:
        raise OtlpError(f"body is not an OTLP ExportTraceServiceRequest protobuf: {exc}") from None
    return request


def parse_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        data = jsonbody.loads(body)
    except ValueError as exc:
        raise OtlpError(f"body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise OtlpError("OTLP/JSON body must be an object with resourceSpans")
    try:
        _hex_ids_to_base64(data)
        return json_format.ParseDict(data, ExportTraceServiceRequest())
    except (json_format.ParseError, OtlpError, TypeError, ValueError) as exc:
        raise OtlpError(f"body is not an OTLP/JSON trace export: {exc}") from None


def _hex_ids_to_base64(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise OtlpError(f"{key} {value[:40]!r} is not hex") from None
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return binascii.hexlify(value.bytes_value).decode()
    return getattr(value, kind)


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope_spans.spans) for resource_spans in request.resource_spans
               for scope_spans in resource_spans.scope_spans)


def seed_spans(request: ExportTraceServiceRequest) -> Iterator[dict[str, Any]]:
    """Each span of the request as a seed-format dict, in request order."""
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        service = resource.get(SERVICE_NAME_ATTRIBUTE) or "unknown_service"
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = {kv.key: any_value(kv.value) for kv in span.attributes}
                path = attributes.pop(NETWORK_PATH_ATTRIBUTE, [])
                if isinstance(path, str):
                    path = [hop.strip() for hop in path.split(",") if hop.strip()]
                out = {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "service": str(service),
                    "operation": span.name,
                    "start_time_ms": span.start_time_unix_nano // 1_000_000,
                    "end_time_ms": span.end_time_unix_nano // 1_000_000,
                    "duration_ms": max(0, span.end_time_unix_nano - span.start_time_unix_nano) / 1e6,
                    "network_path": path,
                    "attributes": attributes,
                }
                if span.parent_span_id:
                    out["parent_span_id"] = span.parent_span_id.hex()
                yield out


def response_bytes(rejected: int, message: str, as_json: bool) -> bytes:
    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if as_json:
        return json.dumps(json_format.MessageToDict(response)).encode()
    return response.SerializeToString()
