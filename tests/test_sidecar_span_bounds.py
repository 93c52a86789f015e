"""Span times are bounded (a span from the future cannot top the "last hour" views) and
the violations list pages with a cursor instead of stopping silently at its limit."""
from __future__ import annotations

import time

import pytest

from fabricscope.queryapi.app import create_app
from fabricscope.demo.stack import free_port
from tests.sidecar_helpers import bearer, make_keys, seed_span


@pytest.fixture
def client(tmp_path):
    keys = make_keys(tmp_path / "keys.yaml")
    app = create_app({"insecure_no_tls": True, "database": str(tmp_path / "sidecar.db"),
                      "keys_file": str(tmp_path / "keys.yaml"), "prometheus_url": f"http://127.0.0.1:{free_port()}"})
    yield app.test_client(), keys
    app.extensions["fabricscope"].close()


def post(client, keys, spans):
    return client.post("/tracing/spans", json={"spans": spans}, headers=bearer(keys["writer"]))


def test_spans_from_the_future_are_rejected_by_index_and_the_rest_kept(client):
    client, keys = client
    now = int(time.time() * 1000)
    spans = [seed_span("t-2100", "a", 2500, ["n"], end_ms=4_102_000_000_000),
             seed_span("t-skew-ok", "b", 2500, ["n"], end_ms=now + 60_000),          # a minute of skew: fine
             seed_span("t-skew-bad", "c", 2500, ["n"], end_ms=now + 3_600_000),     # an hour ahead
             seed_span("t-now", "d", 2500, ["n"], end_ms=now)]
    answer = post(client, keys, spans).get_json()
    assert answer["accepted"] == 2
    rejected = {r["index"]: r["errors"][0] for r in answer["rejected"]}
    assert sorted(rejected) == [0, 2]
    assert rejected[2]["field"] == "end_time_ms" and "at most 300 s of clock skew" in rejected[2]["message"]
    listed = client.get("/tracing/slo-violations", headers=bearer(keys["reader"])).get_json()["violations"]
    assert [v["trace_id"] for v in listed] == ["t-skew-ok", "t-now"]


def test_violations_page_with_a_cursor_newest_first_none_lost_none_repeated(client):
    client, keys = client
    now = int(time.time() * 1000)
    # 25 violations, several sharing an end time (the cursor must break ties).
    spans = [seed_span(f"trace-{i:02d}", "s", 2500, ["n"], end_ms=now - (i // 3) * 1000) for i in range(25)]
    assert post(client, keys, spans).get_json()["accepted"] == 25
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 4, **({"cursor": cursor} if cursor else {})}
        page = client.get("/tracing/slo-violations", query_string=params, headers=bearer(keys["reader"])).get_json()
        seen += [(v["end_ms"], v["trace_id"]) for v in page["violations"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 7 and len(seen) == 25 and len({t for _, t in seen}) == 25
    assert [end for end, _ in seen] == sorted((end for end, _ in seen), reverse=True)
    bad = client.get("/tracing/slo-violations", query_string={"cursor": "x; DROP TABLE"},
                     headers=bearer(keys["reader"]))
    assert bad.status_code == 422


# ---- OTLP counted on the wire, before anything is parsed ------------------------------------

def otlp_request(shape: list[list[int]], rich: bool):
    """An ExportTraceServiceRequest: shape[r][s] spans in scope s of resource r; `rich`
    spans carry names, ids, attributes and events (fields the count must skip)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    for scopes in shape:
        resource = request.resource_spans.add()
        resource.resource.attributes.add(key="service.name").value.string_value = "svc"
        resource.schema_url = "https://example.invalid/schema"
        for count in scopes:
            scope = resource.scope_spans.add()
            scope.scope.name = "lib"
            for i in range(count):
                span = scope.spans.add()
                span.start_time_unix_nano, span.end_time_unix_nano = 1, 2 + i
                if rich:
                    span.name, span.trace_id, span.span_id = f"op-{i}", bytes(16), bytes(8)
                    span.attributes.add(key="network_path").value.string_value = "a,b"
                    span.events.add(name="e").time_unix_nano = 5
    return request


@pytest.mark.parametrize("shape", [[], [[]], [[3]], [[1, 0, 2], [], [4]], [[200], [130, 1]]])
@pytest.mark.parametrize("rich", [False, True])
def test_the_wire_count_is_the_parsed_count(shape, rich):
    from fabricscope.queryapi.tracing import otlp

    request = otlp_request(shape, rich)
    assert otlp.count_protobuf_spans(request.SerializeToString(), 10_000) == otlp.span_count(request)


def test_past_the_cap_spans_or_their_groups_are_refused_and_garbage_is_an_otlp_error():
    from fabricscope.queryapi.tracing import otlp

    with pytest.raises(otlp.TooManySpans, match="at most 100 spans"):
        otlp.count_protobuf_spans(otlp_request([[60], [41]], False).SerializeToString(), 100)
    # Empty resource groups are messages too: parsing builds one object each.
    with pytest.raises(otlp.TooManySpans, match="span groups"):
        otlp.count_protobuf_spans(b"\x0a\x00" * 101, 100)
    for garbage in (b"\x0a\x05ab", b"\xff", b"\x0b\x00"):
        with pytest.raises(otlp.OtlpError):
            otlp.count_protobuf_spans(garbage, 100)


def test_4m_empty_spans_are_refused_before_parsing_in_both_formats(client):
    import gzip
    import json

    from tests.hostile import otlp_empty_spans

    client, keys = client
    headers = {**bearer(keys["writer"]), "Content-Encoding": "gzip"}
    reply = client.post("/v1/traces", data=otlp_empty_spans(4_194_288),
                        headers={**headers, "Content-Type": "application/x-protobuf"})
    assert reply.status_code == 422 and reply.get_json()["error"]["code"] == "batch_too_large"
    as_json = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{}] * 2_000_000}]}]}).encode()
    for path in ("/v1/traces", "/tracing/spans"):
        reply = client.post(path, data=gzip.compress(as_json), headers={**headers, "Content-Type": "application/json"})
        assert reply.status_code == 422 and reply.get_json()["error"]["code"] == "batch_too_large", reply.get_data()
