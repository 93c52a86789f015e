"""Sidecar storage on each backend: what is written is read back, repeats are stored once,
older schemas are migrated, newer ones refused, and a second SQLite writer is refused."""
from __future__ import annotations

import sqlite3
import uuid

import pytest

from tests import procs

from fabricscope.queryapi.storage import SCHEMA_VERSION, SpanRow, StorageError, open_storage
from fabricscope.queryapi.storage.base import Correlation
from fabricscope.queryapi.storage.sql import now_ms

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="module")
def postgres_server(tmp_path_factory):
    with procs.postgres(tmp_path_factory.mktemp("pg")) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def database(request, tmp_path) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "sidecar.db")
    import psycopg

    server = request.getfixturevalue("postgres_server")
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.rsplit("/", 1)[0] + f"/{name}"


def span(span_id: str, duration: float, slo: float = 2000.0, trace: str = "t1") -> SpanRow:
    end = now_ms()
    return SpanRow(trace, span_id, "llm-inference", "generate", int(end - duration), end, duration,
                   ["gpu-node-0", "ib-sw-01"], {"model": "m"}, slo)


def test_spans_violations_and_correlations_round_trip(database):
    store = open_storage(database)
    try:
        assert store.insert_spans([span("a", 100), span("b", 2500), span("c", 3000)]) == 3
        # A retried batch is stored once.
        assert store.insert_spans([span("b", 2500)]) == 0
        violations = store.slo_violations(since_ms=now_ms() - 60_000)
        assert sorted(v["span_id"] for v in violations) == ["b", "c"]
        assert violations[0]["network_path"] == ["gpu-node-0", "ib-sw-01"]
        claimed = store.claim_pending_violations(10)
        assert [c["span_id"] for c in claimed] == ["b", "c"]
        # Claimed work is leased: a second claimer gets nothing until the lease ends.
        assert store.claim_pending_violations(10) == []
        b = claimed[0]
        store.save_correlations([c["pk"] for c in claimed], [Correlation(
            b["pk"], "t1", "b", "llm-inference", "generate", b["end_ms"], 2500, 2000, 1, 2, 0.5,
            [{"device": "gpu-node-0", "alertname": "FabricTcpMicroburst"}])])
        assert store.count_pending_violations() == 0
        (found,) = store.correlations(trace_id="t1")
        assert found["confidence"] == 0.5 and found["anomalies"][0]["device"] == "gpu-node-0"
        assert store.correlations(trace_id="other") == []
    finally:
        store.close()


def test_replicas_claim_disjoint_work(database):
    first = open_storage(database)
    # A second replica on the same database (SQLite allows only one process; a second
    # handle in-process stands in for it there only through the same object).
    second = open_storage(database) if not first.dialect == "sqlite" else first
    try:
        first.insert_spans([span(f"v{i}", 3000) for i in range(10)])
        a = first.claim_pending_violations(4)
        b = second.claim_pending_violations(100)
        assert len(a) == 4 and len(b) == 6
        assert not {r["pk"] for r in a} & {r["pk"] for r in b}
        first.release_claims([r["pk"] for r in a])
        assert len(second.claim_pending_violations(100)) == 4
    finally:
        first.close()
        if second is not first:
            second.close()


def test_alerts_are_deduplicated_by_fingerprint_and_episode(database):
    store = open_storage(database)
    alert = {"fingerprint": "f1", "startsAt": "2026-01-01T00:00:00Z", "status": "firing",
             "labels": {"alertname": "FabricNcclHang", "comm": "c1"}, "annotations": {"summary": "s"}}
    try:
        assert store.record_alerts([alert], 1) == (1, 0)
        assert store.record_alerts([alert], 2) == (0, 1)
        assert store.record_alerts([{**alert, "status": "resolved", "endsAt": "2026-01-01T00:05:00Z"}], 3) == (0, 1)
        (row,) = store.alerts()
        assert row["status"] == "resolved" and row["receive_count"] == 3 and row["labels"]["comm"] == "c1"
        # The same alert firing again later is a new episode.
        assert store.record_alerts([{**alert, "startsAt": "2026-01-01T01:00:00Z"}], 4) == (1, 0)
    finally:
        store.close()


def test_alerts_reconcile_with_alertmanagers_list(database):
    """The firing records become exactly Alertmanager's alerts: one it no longer holds is
    resolved (it ended while inhibited: no notification said so), one it holds that no
    notification carried is added, and the API's millisecond start time matches the
    webhook's trimmed one."""
    store = open_storage(database)

    def alert(fingerprint, starts, name="FabricNvlinkLinkDown"):
        return {"fingerprint": fingerprint, "startsAt": starts, "status": "firing",
                "labels": {"alertname": name, "node": "n1"}, "annotations": {}}
    try:
        store.record_alerts([alert("a1", "2026-01-01T00:00:00Z"), alert("b2", "2026-01-01T00:00:01.5Z"),
                             alert("c3", "2026-01-01T00:00:02Z")], 1)
        store.record_alerts([{**alert("c3", "2026-01-01T00:00:02Z"), "status": "resolved"}], 2)
        held = [alert("b2", "2026-01-01T00:00:01.500Z"), alert("d4", "2026-01-01T00:00:03.000Z", "FabricGpuXidFatal")]
        assert store.reconcile_alerts(held, "2026-01-01T00:10:00.000Z", 3) == {"resolved": 1, "added": 1, "firing": 2}
        rows = {row["fingerprint"]: row for row in store.alerts()}
        assert rows["a1"]["status"] == "resolved" and rows["a1"]["ends_at"] == "2026-01-01T00:10:00.000Z"
        assert rows["b2"]["status"] == "firing" and rows["b2"]["receive_count"] == 1
        assert rows["c3"]["status"] == "resolved"
        assert rows["d4"]["status"] == "firing" and rows["d4"]["receive_count"] == 0 and rows["d4"]["receiver"] == ""
        assert len(rows) == 4
        # Nothing changes when the records already agree; an empty list resolves them all.
        assert store.reconcile_alerts(held, "2026-01-01T00:11:00.000Z", 4) == {"resolved": 0, "added": 0, "firing": 2}
        assert store.reconcile_alerts([], "2026-01-01T00:12:00.000Z", 5) == {"resolved": 2, "added": 0, "firing": 0}
    finally:
        store.close()


def test_sessions_and_simulations(database):
    store = open_storage(database)
    try:
        store.save_session("s1", {"turns": [1]})
        store.save_session("s1", {"turns": [1, 2]})
        assert store.load_session("s1")["data"] == {"turns": [1, 2]}
        assert store.load_session("nope") is None
        store.save_simulation("r1", "running", {})
        store.save_simulation("r1", "done", {"devices": 3})
        assert store.load_simulation("r1")["status"] == "done"
    finally:
        store.close()


def test_retention_purges_only_old_rows(database):
    store = open_storage(database)
    try:
        old = span("old", 10)
        old.received_ms = now_ms() - 10_000_000
        store.insert_spans([old, span("new", 10)])
        deleted = store.purge_before(now_ms() - 1_000_000)
        assert deleted["spans"] == 1
        assert store.slo_violations(0) == [] and store.insert_spans([span("new", 10)]) == 0
    finally:
        store.close()


def test_older_schema_is_migrated_keeping_its_rows(database):
    old = open_storage(database, migrate=False)
    try:
        assert old.migrate(up_to=1) == 1
        assert old.schema_version() == 1
        with old._transaction(write=True) as cur:
            old._execute(cur, "INSERT INTO sessions (id, created_ms, updated_ms, data) VALUES (?, ?, ?, ?)",
                         ("kept", 1, 1, "{}"))
    finally:
        old.close()
    store = open_storage(database)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.load_session("kept") is not None
        assert store.insert_spans([span("x", 10)]) == 1      # the migrated table takes new rows
        # Opening again is idempotent.
        assert store.migrate() == SCHEMA_VERSION
    finally:
        store.close()


def test_newer_schema_is_refused(database):
    store = open_storage(database)
    with store._transaction(write=True) as cur:
        store._execute(cur, "INSERT INTO schema_version (version, applied_ms) VALUES (?, ?)", (SCHEMA_VERSION + 5, 1))
    store.close()
    with pytest.raises(StorageError, match="newer than this sidecar.*refusing to downgrade"):
        open_storage(database)


def test_second_sqlite_writer_is_refused(tmp_path):
    path = tmp_path / "one.db"
    first = open_storage(str(path))
    try:
        with pytest.raises(StorageError, match="locked by another sidecar process"):
            open_storage(str(path))
        # The file is intact and still usable by its owner.
        assert first.insert_spans([span("a", 1)]) == 1
        assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        first.close()
    open_storage(str(path)).close()       # released on close
