"""POST /nccl/operations and GET /nccl/operations/active over real HTTP (start_exporter)."""
from __future__ import annotations

import http.client
import json
import time

import pytest
import requests

from fabricscope.exporter.context import Context
from fabricscope.exporter.main import start_exporter
from fabricscope.exporter.nccl.ingest import IngestError, parse_operations

NOW = time.time()


def record(**overrides):
    base = {"op": "AllReduce", "comm": "job-42", "rank": 0, "nranks": 2, "bytes": 4096, "start": NOW - 10,
            "end": NOW - 9.9}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not ...}


@pytest.fixture
def exporter(port, tmp_path):
    ctx = Context(state_dir=tmp_path, node="n1", config={"nccl": {"uprobes": False, "min_completed": 3, "ingest": True}})
    running = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    yield f"http://127.0.0.1:{port}"
    running.stop()


def metric(base, name, **labels):
    text = requests.get(base + "/metrics", timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "node": "n1"}.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


def post(base, payload=None, data=None):
    body = data if data is not None else json.dumps(payload)
    return requests.post(base + "/nccl/operations", data=body, headers={"Content-Type": "application/json"},
                         timeout=5)


def test_single_record_and_batch_are_accepted(exporter):
    assert post(exporter, record()).status_code == 202
    batch = [record(start=NOW - 8 + i, end=NOW - 8 + i + 0.1, rank=1) for i in range(3)]
    response = post(exporter, batch)
    assert response.status_code == 202 and response.json() == {"accepted": 3}
    assert metric(exporter, "fabric_nccl_calls_total", comm="job-42", rank="1", op="AllReduce") == 3
    assert metric(exporter, "fabric_nccl_bytes_total", comm="job-42", rank="1", op="AllReduce") == 3 * 4096
    assert metric(exporter, "fabric_nccl_completed_average_seconds", comm="job-42", rank="1",
                  op="AllReduce") == pytest.approx(0.1)
    assert metric(exporter, "fabric_nccl_comm_info", comm="job-42", rank="1", nranks="2") == 1
    assert metric(exporter, "fabric_nccl_ingest_requests_total", result="accepted") == 2


@pytest.mark.parametrize("payload, field, message", [
    (record(op="AllReduceX"), "op", "op 'AllReduceX' is not one of"),
    (record(op=...), "op", "missing field 'op'"),
    (record(comm=""), "comm", "comm must be 1-64 characters"),
    (record(comm="a b"), "comm", "comm must be 1-64 characters"),
    (record(rank=-1), "rank", "rank must be >= 0"),
    (record(rank=2), "rank", "rank 2 must be below nranks 2"),
    (record(rank="0"), "rank", "rank must be an integer"),
    (record(nranks=0), "nranks", "nranks must be >= 1"),
    (record(nranks=True), "nranks", "nranks must be an integer"),
    (record(bytes=-5), "bytes", "bytes must be >= 0"),
    (record(bytes=1.5), "bytes", "bytes must be an integer"),
    (record(start="yesterday"), "start", "start must be a number of UNIX seconds"),
    (record(start=NOW * 1000), "start", "looks like milliseconds"),
    (record(start=12.0), "start", "is not a UNIX timestamp in seconds"),
    (record(end=NOW - 20), "end", "is before start"),
    (record(duration_ms=3), "duration_ms", "unknown field 'duration_ms'"),
])
def test_each_validation_error_names_the_field_and_record(exporter, payload, field, message):
    response = post(exporter, [record(), payload])
    assert response.status_code == 400
    body = response.json()
    assert body["index"] == 1 and body["field"] == field and message in body["error"]


def test_rejected_batch_stores_nothing_and_keeps_what_was_stored(exporter):
    assert post(exporter, record(rank=1)).status_code == 202
    response = post(exporter, [record(rank=1, start=NOW - 5, end=NOW - 4.9), record(rank=1, nranks=3)])
    assert response.status_code == 400
    assert response.json()["field"] == "nranks" and "disagrees with nranks 2" in response.json()["error"]
    assert metric(exporter, "fabric_nccl_calls_total", comm="job-42", rank="1", op="AllReduce") == 1
    assert metric(exporter, "fabric_nccl_ingest_requests_total", result="rejected") == 1


@pytest.mark.parametrize("data, message", [
    ('{"op": "AllReduce", "comm": "job-42", "ra', "invalid JSON at line 1 column"),
    ("", "empty body"),
    ("[]", "empty list"),
    ("42", "expected a JSON object or a list of objects, got int"),
    ("[1]", "record 0: expected an object, got int"),
])
def test_malformed_bodies_get_clear_errors(exporter, data, message):
    assert post(exporter, record()).status_code == 202
    response = post(exporter, data=data)
    assert response.status_code == 400 and message in response.json()["error"]
    assert metric(exporter, "fabric_nccl_calls_total", comm="job-42", rank="0", op="AllReduce") == 1


def test_truncated_json_body(exporter):
    """A body cut off mid-record (a client killed while sending, a proxy limit): a clear
    400, and the operations already stored stay."""
    assert post(exporter, record()).status_code == 202
    host, port = exporter.rsplit("/", 1)[1].split(":")
    body = b'[{"op": "AllReduce", "comm": "job-42", "rank": 0, "nranks": 2, "bytes": 1'
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/nccl/operations")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    conn.send(body)
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    assert response.status == 400 and payload["error"].startswith("invalid JSON at line 1 column")
    assert metric(exporter, "fabric_nccl_calls_total", comm="job-42", rank="0", op="AllReduce") == 1


def test_get_active_reports_hanging_with_elapsed_and_average(exporter):
    start = time.time() - 20
    completed = [record(rank=0, start=start + i, end=start + i + 0.5) for i in range(3)]
    open_op = record(rank=0, start=start + 10, end=None)       # no end: in flight since 10 s
    other = [record(rank=1, start=start + i, end=start + i + 0.5) for i in range(3)]
    fresh = record(rank=1, start=time.time() - 0.1, end=None)   # in flight, young
    assert post(exporter, completed + [open_op] + other + [fresh]).status_code == 202
    response = requests.get(exporter + "/nccl/operations/active", timeout=5)
    assert response.status_code == 200
    operations = {op["rank"]: op for op in response.json()["operations"]}
    assert operations[0]["hanging"] is True and operations[0]["elapsed_seconds"] > 9
    assert operations[0]["average_seconds"] == pytest.approx(0.5)
    assert operations[1]["hanging"] is False
    assert metric(exporter, "fabric_nccl_hanging", comm="job-42", rank="0", op="AllReduce") == 1
    assert metric(exporter, "fabric_nccl_hanging", comm="job-42", rank="1", op="AllReduce") == 0
    assert metric(exporter, "fabric_nccl_inflight_elapsed_seconds", comm="job-42", rank="0", op="AllReduce") > 9


def test_wrong_method_is_405(exporter):
    assert requests.get(exporter + "/nccl/operations", timeout=5).status_code == 405


def test_parser_rejects_non_utf8():
    with pytest.raises(IngestError, match="not UTF-8"):
        parse_operations(b'{"op": "\xff"}')


# ---- who may post, and what ingested records may displace -------------------------------------

def test_ingest_is_off_unless_configured(port, tmp_path):
    ctx = Context(state_dir=tmp_path, node="n1", config={"nccl": {"uprobes": False}})
    running = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        response = post(base, record())
        assert response.status_code == 403 and "ingest: true" in response.json()["error"]
        assert metric(base, "fabric_nccl_comm_info", comm="job-42", rank="0", nranks="2") is None
        assert metric(base, "fabric_nccl_ingest_requests_total", result="disabled") == 1
        assert requests.get(base + "/nccl/operations/active", timeout=5).status_code == 200
    finally:
        running.stop()


def test_a_non_boolean_ingest_setting_is_refused(tmp_path):
    from fabricscope.exporter.collectors.nccl import NcclCollector

    with pytest.raises(ValueError, match=r"nccl\.ingest: input should be a valid boolean, got 'yes'"):
        NcclCollector(Context(state_dir=tmp_path, node="n1", config={"nccl": {"uprobes": False, "ingest": "yes"}}))


def test_a_communicator_has_one_size_so_its_ranks_are_bounded_by_it(exporter):
    assert post(exporter, record(rank=1, nranks=4)).status_code == 202
    response = post(exporter, record(rank=5, nranks=100_000))
    assert response.status_code == 400 and response.json()["field"] == "nranks"
    assert "disagrees with nranks 4 already stored for comm job-42" in response.json()["error"]
    # 10,000 invented ranks of a huge comm: series stay within max_series (4096), counted.
    flood = [record(comm="flood", rank=r, nranks=100_000) for r in range(10_000)]
    assert post(exporter, flood).status_code == 202
    text = requests.get(exporter + "/metrics", timeout=10).text
    assert text.count('fabric_nccl_calls_total{comm="flood"') <= 4096
    assert metric(exporter, "fabric_nccl_calls_dropped_total") >= 10_000 - 4096


def test_ingested_records_never_evict_a_communicator_seen_through_the_uprobes():
    from fabricscope.exporter.nccl.events import NcclCall
    from fabricscope.exporter.nccl.tracker import CapacityError, NcclTracker

    tracker = NcclTracker(max_comms=2)
    tracker.register_comm("real", 0, 2)                  # a process on this node
    tracker.call_entered(NcclCall("AllReduce", "real", 0, 2, 8, NOW - 100), token=(1, 1))

    def ingest(comm):
        tracker.record_batch([NcclCall("AllReduce", comm, 0, 2, 8, NOW - 5, end=NOW - 4)])

    ingest("invented-1")
    ingest("invented-2")                                 # evicts invented-1, the only ingested one
    assert {c for c, _, _ in tracker.snapshot().comms} == {"real", "invented-2"}
    with pytest.raises(CapacityError, match="only 1 ingested one"):
        tracker.record_batch([NcclCall("AllReduce", c, 0, 2, 8, NOW - 5) for c in ("x", "y")])
    assert {c for c, _, _ in tracker.snapshot().comms} == {"real", "invented-2"}
    # The series limit does not make room with a probed comm either.
    tracker = NcclTracker(max_series=2, max_comms=10)
    tracker.register_comm("real", 0, 8)
    tracker.call_entered(NcclCall("AllReduce", "real", 0, 8, 8, NOW - 100), token=(1, 1))
    tracker.call_entered(NcclCall("AllGather", "real", 0, 8, 8, NOW - 99), token=(1, 1))
    tracker.record_batch([NcclCall("AllReduce", "invented", r, 8, 8, NOW - 5) for r in range(3)])
    snap = tracker.snapshot()
    assert {o.comm for o in snap.ops} == {"real"} and snap.dropped_calls == 3


def test_a_full_exporter_answers_503_and_keeps_its_communicators(port, tmp_path):
    ctx = Context(state_dir=tmp_path, node="n1", config={"nccl": {"uprobes": False, "ingest": True, "max_comms": 1}})
    running = start_exporter(ctx, ["nccl"], f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        [collector] = running.collectors
        collector.tracker.register_comm("real", 0, 2)
        response = post(base, record(comm="invented"))
        assert response.status_code == 503 and "max_comms 1" in response.json()["error"]
        assert metric(base, "fabric_nccl_comm_info", comm="real", rank="0", nranks="2") == 1
    finally:
        running.stop()


@pytest.mark.parametrize("body, says", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"rank": ' + b"9" * 5000 + b"}", "invalid JSON"),          # beyond int()'s digit limit
])
def test_hostile_json_is_an_ingest_error_not_a_crash(body, says):
    from fabricscope.exporter.nccl.ingest import IngestError, parse_operations

    with pytest.raises(IngestError, match=says):
        parse_operations(body)
