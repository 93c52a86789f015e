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
