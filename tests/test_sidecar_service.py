"""The sidecar as operators run it: `fabricscope sidecar` with TLS, over
real sockets. Security defaults (TLS, keys and scopes, rate limit, body limit, audit),
probes, the OpenAPI document and key rotation."""
from __future__ import annotations

import gzip
import json
import re
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests

from fabricscope.demo.stack.sidecar import sidecar_argv, start_sidecar
from fabricscope.demo.stack import free_port
from fabricscope.queryapi.keys import add_key
from tests.procs import wait_for
from tests.sidecar_helpers import bearer, make_keys, seed_span

MAX_BODY = 4096


class Server:
    def __init__(self, process, keys: dict[str, str], workdir: Path) -> None:
        self.process = process
        self.url = process.url
        self.keys = keys
        self.workdir = workdir
        self.session = requests.Session()
        # Per request, not session.verify: REQUESTS_CA_BUNDLE in the environment would win.
        self.ca = str(process.certs.ca)

    def request(self, method: str, path: str, key: str | None = None, **kwargs) -> requests.Response:
        headers = {**(bearer(self.keys[key]) if key else {}), **kwargs.pop("headers", {})}
        return self.session.request(method, self.url + path, headers=headers, timeout=15, verify=self.ca, **kwargs)

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in (self.workdir / "sidecar-audit.log").read_text().splitlines()]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sidecar")
    keys = make_keys(workdir / "keys.yaml", {"limited": "read"})
    # The limited key: 1 request/s with a burst of 3.
    text = (workdir / "keys.yaml").read_text().replace(
        "- id: limited\n", "- id: limited\n  rate_limit: {per_second: 1, burst: 3}\n")
    (workdir / "keys.yaml").write_text(text)
    unreachable = f"http://127.0.0.1:{free_port()}"
    process = start_sidecar(workdir, "127.0.0.1", free_port(), unreachable, workdir / "keys.yaml",
                            extra_args=["--max-body-bytes", str(MAX_BODY), "--prometheus-timeout", "1"])
    try:
        yield Server(process, keys, workdir)
    finally:
        process.stop()


def test_tls_is_required_unless_explicitly_opted_out(tmp_path):
    result = subprocess.run(sidecar_argv("--database", str(tmp_path / "db"), "--port", str(free_port())),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "TLS is required" in result.stderr and "--insecure-no-tls" in result.stderr


def test_tls_is_on_by_default(server):
    assert server.url.startswith("https://")
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(server.url.replace("https://", "http://") + "/api/versions", timeout=5)
    # An unknown CA is refused by a verifying client.
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/api/versions", timeout=5)


def test_versions_probe_is_open_and_gives_major_minor_only(server):
    response = server.request("GET", "/api/versions")
    assert response.status_code == 200
    assert re.fullmatch(r"\d+\.\d+", response.json()["version"])
    assert "v1" in response.json()["api_versions"]


def test_health_is_liveness_without_a_key_and_full_with_one(server):
    anonymous = server.request("GET", "/api/v1/health").json()
    assert anonymous["status"] == "ok" and anonymous["version"] is None
    full = server.request("GET", "/api/v1/health", "reader").json()
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", full["version"])
    assert full["storage"] == "sqlite" and full["schema_version"] >= 1
    # Prometheus is down in this module: health says so instead of failing.
    assert full["prometheus"] == "unreachable"


def test_no_key_is_401_an_unknown_key_is_401_a_missing_scope_is_403(server):
    response = server.request("GET", "/api/v1/openapi.json")
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"
    assert "Bearer" in response.headers["WWW-Authenticate"]
    response = server.request("GET", "/api/v1/openapi.json", headers={"X-API-Key": "fsk_not-a-key"})
    assert response.status_code == 401 and response.json()["error"]["code"] == "bad_credentials"
    response = server.request("POST", "/api/v1/admin/retention/run", "writer")
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    assert server.request("POST", "/api/v1/admin/retention/run", "admin").status_code == 200
    # Unknown paths need a key too (no probing for endpoints), then 404.
    assert server.request("GET", "/nope").status_code == 401
    response = server.request("GET", "/nope", "reader")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_openapi_document_is_3_1_and_generated_from_the_code(server):
    spec = server.request("GET", "/api/v1/openapi.json", "reader").json()
    assert spec["openapi"].startswith("3.1")
    assert {"/api/versions", "/api/v1/health", "/api/v1/admin/retention/run"} <= set(spec["paths"])
    assert spec["paths"]["/api/v1/admin/retention/run"]["post"]["security"]


def test_rate_limit_answers_429_and_the_429_is_audited(server):
    statuses = [server.request("GET", "/api/v1/openapi.json", "limited").status_code for _ in range(6)]
    assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
    limited = server.request("GET", "/api/v1/openapi.json", "limited")
    if limited.status_code == 429:
        assert int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["error"]["code"] == "rate_limited"
    # Other keys are not affected.
    assert server.request("GET", "/api/v1/openapi.json", "reader").status_code == 200
    records = wait_for(lambda: [r for r in server.audit() if r["status"] == 429], 10, "429 in the audit log")
    assert records[0]["key_id"] == "limited" and records[0]["error_code"] == "rate_limited"
    assert records[0]["path"] == "/api/v1/openapi.json"
    # Rejected authentication is audited as well, and no record carries a key.
    assert server.request("GET", "/api/v1/openapi.json", headers=bearer("fsk_not-a-key")).status_code == 401
    wait_for(lambda: [r for r in server.audit() if r["status"] == 401], 10, "401 in the audit log")
    audit_text = (server.workdir / "sidecar-audit.log").read_text()
    assert "fsk_not-a-key" not in audit_text
    assert not any(token in audit_text for token in server.keys.values())


def test_a_body_over_the_limit_is_413(server):
    response = server.request("POST", "/api/v1/admin/retention/run", "admin", data=b"x" * (MAX_BODY + 1),
                              headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


def test_keys_rotate_without_a_restart(server):
    keys_file = server.workdir / "keys.yaml"
    token = add_key(keys_file, "rotated-in", ["read"])
    wait_for(lambda: server.request("GET", "/api/v1/openapi.json", headers=bearer(token)).status_code == 200,
             10, "a newly added key to be accepted")
    text = keys_file.read_text()
    start = text.index("- id: rotated-in")
    keys_file.write_text(text[:start])
    wait_for(lambda: server.request("GET", "/api/v1/openapi.json", headers=bearer(token)).status_code == 401,
             10, "a removed key to be refused")
    # A broken edit keeps the keys that worked.
    keys_file.write_text(text[:start] + "keys: [this is not\n")
    time.sleep(1.5)
    assert server.request("GET", "/api/v1/openapi.json", "reader").status_code == 200
    # A FIFO in its place (a plain open() would wait for a writer forever, holding the
    # reload lock every request takes): refused as unreadable, the keys that worked kept.
    keys_file.unlink()
    os.mkfifo(keys_file)
    try:
        time.sleep(1.5)
        assert server.request("GET", "/api/v1/openapi.json", "reader").status_code == 200
    finally:
        keys_file.unlink()
        keys_file.write_text(text[:start])


def test_second_sidecar_on_the_same_database_is_refused(server):
    result = subprocess.run(sidecar_argv("--database", str(server.workdir / "sidecar.db"), "--insecure-no-tls",
                                         "--port", str(free_port())),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "locked by another sidecar process" in result.stderr


def test_span_ingest_needs_the_write_scope(server):
    batch = {"spans": [seed_span("scope-trace", "s1", 10, ["a"])]}
    assert server.request("POST", "/tracing/spans", json=batch).status_code == 401
    response = server.request("POST", "/tracing/spans", "reader", json=batch)
    assert response.status_code == 403 and response.json()["error"]["detail"]["needs"] == "write"
    assert server.request("POST", "/tracing/spans", "writer", json=batch).status_code == 200


def test_a_chunked_body_over_the_limit_is_413(server):
    def chunks():
        for _ in range(MAX_BODY // 512 + 4):
            yield b" " * 512       # JSON whitespace: valid until it exceeds the limit

    response = server.request("POST", "/tracing/spans", "writer", data=chunks(),
                              headers={"Content-Type": "application/json"})
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    # A chunked body within the limit is read normally.
    small = json.dumps({"spans": [seed_span("chunked-ok", "s1", 10, ["a"])]}).encode()
    response = server.request("POST", "/tracing/spans", "writer", data=iter([small[:20], small[20:]]),
                              headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["accepted"] == 1


def test_a_gzip_bomb_is_413_not_a_memory_spike(server):
    bomb = gzip.compress(b"{" + b" " * (50 * MAX_BODY) + b"}")
    assert len(bomb) < MAX_BODY
    response = server.request("POST", "/tracing/spans", "writer", data=bomb,
                              headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert response.status_code == 413


def test_wrong_media_type_is_415_and_broken_json_is_400(server):
    response = server.request("POST", "/tracing/spans", "writer", data="spans",
                              headers={"Content-Type": "text/plain"})
    assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"
    response = server.request("POST", "/tracing/spans", "writer", data="{\"spans\": [",
                              headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_json"


def test_bad_spans_are_rejected_by_index_and_the_good_ones_kept(server):
    good = seed_span("mixed-trace", "good", 2500, ["gpu-node-0"])
    backwards = {**seed_span("mixed-trace", "backwards", 10, ["a"]), "end_time_ms": 5, "start_time_ms": 10}
    batch = [{"trace_id": "x"}, good, backwards, {**good, "span_id": "typo", "duraton_ms": 3}, "not a span"]
    response = server.request("POST", "/tracing/spans", "writer", json={"spans": batch})
    assert response.status_code == 200
    answer = response.json()
    assert answer["accepted"] == 1 and answer["violations"] == 1
    rejected = {r["index"]: r["errors"] for r in answer["rejected"]}
    assert sorted(rejected) == [0, 2, 3, 4]
    assert {e["field"] for e in rejected[0]} >= {"span_id", "service"}
    assert "end_time_ms is before start_time_ms" in rejected[2][0]["message"]
    assert rejected[3][0]["field"] == "duraton_ms"
    stored = server.request("GET", "/tracing/slo-violations", "reader").json()["violations"]
    assert [(v["trace_id"], v["span_id"]) for v in stored if v["trace_id"] == "mixed-trace"] == [("mixed-trace", "good")]
    # A batch of nothing but bad spans is a 422 listing each.
    response = server.request("POST", "/tracing/spans", "writer", json={"spans": [{"trace_id": 1}]})
    assert response.status_code == 422 and response.json()["error"]["code"] == "all_spans_rejected"
    assert response.json()["error"]["detail"]["rejected"][0]["index"] == 0


def test_otlp_protobuf_is_decoded_and_garbage_is_400(server):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest, ExportTraceServiceResponse)

    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    attribute = resource_spans.resource.attributes.add()
    attribute.key, attribute.value.string_value = "service.name", "svc-proto"
    spans = resource_spans.scope_spans.add().spans
    now = time.time_ns()
    for index, trace_id in enumerate((b"\x01" * 16, b"")):     # the second has no trace id
        span = spans.add()
        span.trace_id, span.span_id, span.name = trace_id, bytes([index + 1]) * 8, "op"
        span.start_time_unix_nano, span.end_time_unix_nano = now - 3_000_000_000, now
        path = span.attributes.add()
        path.key = "network_path"
        path.value.array_value.values.add().string_value = "gpu-node-0"
    response = server.request("POST", "/v1/traces", "writer", data=request.SerializeToString(),
                              headers={"Content-Type": "application/x-protobuf"})
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "span 1: trace_id" in answer.partial_success.error_message
    stored = server.request("GET", "/tracing/slo-violations", "reader", params={"service": "svc-proto"}).json()
    assert [v["trace_id"] for v in stored["violations"]] == ["01" * 16]
    response = server.request("POST", "/v1/traces", "writer", data=b"\xff\xfe garbage",
                              headers={"Content-Type": "application/x-protobuf"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_otlp"


def test_prometheus_down_is_a_clear_503_not_a_crash(server):
    for path in ("/api/v1/cluster/outlier-ranks", "/ebpf/metrics", "/nccl/operations/active"):
        response = server.request("GET", path, "reader")
        assert response.status_code == 503, path
        error = response.json()["error"]
        assert error["code"] == "prometheus_unreachable" and "is unreachable" in error["message"]
    # Ingest does not depend on Prometheus: violations wait for it, counted as pending.
    trace = "waits-for-prometheus"
    assert server.request("POST", "/tracing/spans", "writer",
                          json={"spans": [seed_span(trace, "s", 5000, ["gpu-node-0"])]}).status_code == 200
    answer = server.request("GET", "/tracing/correlations", "reader", params={"trace_id": trace}).json()
    assert answer["correlations"] == [] and answer["pending"] >= 1


def test_otlp_json_with_hex_ids_and_gzip_is_accepted(server):
    now = time.time_ns()
    export = {"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc-json"}}]},
        "scopeSpans": [{"spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "name": "generate",
            "startTimeUnixNano": str(now - 2_500_000_000), "endTimeUnixNano": str(now),
            "attributes": [{"key": "network_path", "value": {"stringValue": "gpu-node-0, ib-sw-01"}},
                           {"key": "tokens", "value": {"intValue": "42"}}]}]}]}]}
    response = server.request("POST", "/v1/traces", "writer", data=gzip.compress(json.dumps(export).encode()),
                              headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert response.status_code == 200 and response.json() == {}
    (stored,) = server.request("GET", "/tracing/slo-violations", "reader",
                               params={"service": "svc-json"}).json()["violations"]
    assert stored["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert stored["network_path"] == ["gpu-node-0", "ib-sw-01"] and stored["attributes"]["tokens"] == 42
    bad_ids = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "not-hex", "spanId": "00"}]}]}]}
    response = server.request("POST", "/v1/traces", "writer", json=bad_ids)
    assert response.status_code == 400 and "is not hex" in response.json()["error"]["message"]


def test_an_unpaired_surrogate_is_malformed_json_not_a_500(server):
    span = json.dumps({"spans": [seed_span("surrogate", "s", 10, ["gpu-node-0"], note="NOTE")]})
    headers = {"Content-Type": "application/json"}
    bad = span.replace("NOTE", "\\ud800")
    response = server.request("POST", "/tracing/spans", "writer", data=bad, headers=headers)
    assert response.status_code == 400 and "unpaired UTF-16 surrogate" in response.json()["error"]["message"]
    webhook = '{"alerts": [{"status": "firing", "labels": {"alertname": "\\udfff"}, "startsAt": "x", "fingerprint": "a1"}]}'
    assert server.request("POST", "/alerts/webhook", "writer", data=webhook, headers=headers).status_code == 400
    # A surrogate pair is a real character and is kept.
    response = server.request("POST", "/tracing/spans", "writer", data=span.replace("NOTE", "\\ud83d\\ude00"),
                              headers=headers)
    assert response.status_code == 200 and response.json()["stored"] == 1


def test_span_listings_keep_to_the_range_they_are_given(server):
    """A dashboard passes its time range: only spans that ended inside it are listed."""
    base = int(time.time() * 1000) - 600_000
    spans = [seed_span("ranged-trace", f"s{minute}", 2500, ["gpu-node-0"], service="svc-ranged",
                       end_ms=base + minute * 60_000) for minute in range(5)]
    assert server.request("POST", "/tracing/spans", "writer", json={"spans": spans}).status_code == 200
    listed = server.request("GET", "/tracing/slo-violations", "reader", params={
        "service": "svc-ranged", "from_ms": base + 60_000, "to_ms": base + 180_000}).json()["violations"]
    assert [v["span_id"] for v in listed] == ["s3", "s2", "s1"]
    response = server.request("GET", "/tracing/correlations", "reader",
                              params={"from_ms": base + 180_000, "to_ms": base + 60_000})
    assert response.status_code in (400, 422) and "is before from_ms" in response.text
