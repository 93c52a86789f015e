"""The Storage interface in SQL shared by SQLite and PostgreSQL.

Queries are written once with `?` placeholders; a backend converts them to its own
paramstyle. The few real dialect differences (auto-increment key, row locking when
claiming work) are attributes of the backend class."""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import time
from typing import Any, Iterator

from .base import SpanRow, Storage, StorageError, migration_files

SPAN_COLUMNS = ("pk", "trace_id", "span_id", "service", "operation", "start_ms", "end_ms", "duration_ms",
                "network_path", "attributes", "received_ms", "slo_ms", "ingest_format")
CORRELATION_COLUMNS = ("span_pk", "trace_id", "span_id", "service", "operation", "span_end_ms", "duration_ms",
                       "slo_ms", "matched_anomaly_count", "path_length", "confidence", "anomalies",
                       "correlated_ms")
ALERT_COLUMNS = ("fingerprint", "starts_at", "alertname", "status", "labels", "annotations", "ends_at",
                 "generator_url", "first_received_ms", "last_received_ms", "receive_count", "receiver")


def now_ms() -> int:
    return int(time.time() * 1000)


_RFC3339 = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|z|[+-]\d\d:\d\d)$")


def instant_ms(stamp: str) -> int | None:
    """An RFC 3339 time as Unix milliseconds, whatever its fraction's length (Alertmanager's
    webhook writes nanoseconds with trailing zeros trimmed, its API milliseconds); None for
    text that is not one, which then matches only itself."""
    match = _RFC3339.match(stamp or "")
    if not match:
        return None
    whole, fraction, zone = match.groups()
    try:
        moment = dt.datetime.fromisoformat(whole + ("+00:00" if zone in ("Z", "z") else zone))
    except ValueError:
        return None
    return int(moment.timestamp()) * 1000 + int((fraction or "0")[:3].ljust(3, "0"))


# One encoder for every row: json.dumps with non-default arguments builds a new encoder per
# call, which was most of the cost of storing a 1,000-span batch.
_dumps = json.JSONEncoder(separators=(",", ":")).encode


class SqlStorage(Storage):
    auto_id = ""                 # the dialect's auto-increment primary key column type
    claim_lock_suffix = ""       # row locking for the claim sub-select, where the dialect has it
    paramstyle = "?"

    # Backends provide a transaction context yielding a DB-API cursor.
    def _transaction(self, write: bool) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        return text if self.paramstyle == "?" else text.replace("?", self.paramstyle)

    def _execute(self, cur, text: str, params: tuple | list = ()) -> Any:
        return cur.execute(self._sql(text), params)

    def _rows(self, cur, columns: tuple[str, ...]) -> list[dict]:
        return [dict(zip(columns, row)) for row in cur.fetchall()]

    # -- migrations -------------------------------------------------------------------
    def _current_version(self, cur) -> int:
        raise NotImplementedError

    def migrate(self, up_to: int | None = None) -> int:
        """Apply every migration newer than the database's (or up to `up_to`, which is how
        tests build an older schema); refuse a database newer than this code."""
        files = migration_files()
        latest = len(files)
        if up_to is not None:
            files = files[:up_to]
        with self._transaction(write=True) as cur:
            self._lock_for_migration(cur)
            self._execute(cur, "CREATE TABLE IF NOT EXISTS schema_version "
                               "(version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL)")
            current = self._current_version(cur)
            if current > latest:
                raise StorageError(
                    f"database {self.describe()} has schema version {current}, newer than this sidecar "
                    f"understands ({latest}); refusing to downgrade it. Run the newer sidecar, or restore "
                    "a backup taken before the upgrade.")
            for version, path in files[current:]:
                for statement in _statements(path.read_text().replace("@AUTO_ID@", self.auto_id)):
                    self._execute(cur, statement)
                self._execute(cur, "INSERT INTO schema_version (version, applied_ms) VALUES (?, ?)",
                              (version, now_ms()))
        return len(files)

    def _lock_for_migration(self, cur) -> None:
        pass

    def schema_version(self) -> int:
        with self._transaction(write=False) as cur:
            return self._current_version(cur)

    def describe(self) -> str:
        raise NotImplementedError

    # -- spans ------------------------------------------------------------------------
    def insert_spans(self, spans: list[SpanRow]) -> int:
        if not spans:
            return 0
        received = now_ms()
        rows = [(s.trace_id, s.span_id, s.service, s.operation, s.start_ms, s.end_ms, s.duration_ms,
                 _dumps(s.network_path), _dumps(s.attributes), s.received_ms or received, s.slo_ms,
                 1 if s.violated else 0, "pending" if s.violated else "none", s.ingest_format)
                for s in spans]
        with self._transaction(write=True) as cur:
            # A span re-sent (an exporter retrying after a timeout) is stored once.
            cur.executemany(self._sql(
                "INSERT INTO spans (trace_id, span_id, service, operation, start_ms, end_ms, duration_ms, "
                "network_path, attributes, received_ms, slo_ms, violated, correlation_state, ingest_format) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (trace_id, span_id) DO NOTHING"), rows)
            inserted = cur.rowcount
        return inserted if inserted is not None and inserted >= 0 else len(rows)

    def _span_dicts(self, rows: list[dict]) -> list[dict]:
        for row in rows:
            row["network_path"] = json.loads(row["network_path"])
            row["attributes"] = json.loads(row["attributes"])
        return rows

    def slo_violations(self, since_ms, until_ms=None, service=None, operation=None, limit=500, before=None):
        where, params = ["violated = 1", "end_ms >= ?"], [since_ms]
        if before is not None:
            where.append("(end_ms < ? OR (end_ms = ? AND pk < ?))")
            params += [before[0], before[0], before[1]]
        if until_ms is not None:
            where.append("end_ms <= ?")
            params.append(until_ms)
        if service is not None:
            where.append("service = ?")
            params.append(service)
        if operation is not None:
            where.append("operation = ?")
            params.append(operation)
        with self._transaction(write=False) as cur:
            self._execute(cur, f"SELECT {', '.join(SPAN_COLUMNS)} FROM spans WHERE {' AND '.join(where)} "
                               "ORDER BY end_ms DESC, pk DESC LIMIT ?", (*params, limit))
            return self._span_dicts(self._rows(cur, SPAN_COLUMNS))

    def recent_services(self, since_ms, limit=1000):
        # Through the received_ms index: a window of spans, not the whole table.
        with self._transaction(write=False) as cur:
            self._execute(cur, "SELECT DISTINCT service FROM spans WHERE received_ms >= ? LIMIT ?", (since_ms, limit))
            return sorted(row[0] for row in cur.fetchall())

    def claim_pending_violations(self, limit, lease_ms=60_000):
        now = now_ms()
        # A claim is a lease: a replica that dies mid-correlation leaves work that another
        # picks up once the lease runs out.
        with self._transaction(write=True) as cur:
            self._execute(cur,
                          "UPDATE spans SET claim_until_ms = ? WHERE pk IN (SELECT pk FROM spans "
                          "WHERE correlation_state = 'pending' AND (claim_until_ms IS NULL OR claim_until_ms < ?) "
                          f"ORDER BY pk LIMIT ?{self.claim_lock_suffix}) RETURNING {', '.join(SPAN_COLUMNS)}",
                          (now + lease_ms, now, limit))
            rows = self._rows(cur, SPAN_COLUMNS)
        rows.sort(key=lambda r: r["pk"])
        return self._span_dicts(rows)

    def save_correlations(self, done_span_pks, correlations):
        if not done_span_pks:
            return
        stamp = now_ms()
        rows = [(c.span_pk, c.trace_id, c.span_id, c.service, c.operation, c.span_end_ms, c.duration_ms, c.slo_ms,
                 c.matched_anomaly_count, c.path_length, c.confidence, _dumps(c.anomalies), stamp)
                for c in correlations]
        with self._transaction(write=True) as cur:
            if rows:
                cur.executemany(self._sql(
                    f"INSERT INTO correlations ({', '.join(CORRELATION_COLUMNS)}) VALUES "
                    f"({', '.join('?' * len(CORRELATION_COLUMNS))}) ON CONFLICT (span_pk) DO NOTHING"), rows)
            cur.executemany(self._sql("UPDATE spans SET correlation_state = 'done', claim_until_ms = NULL "
                                      "WHERE pk = ?"), [(pk,) for pk in done_span_pks])

    def release_claims(self, span_pks):
        if not span_pks:
            return
        with self._transaction(write=True) as cur:
            cur.executemany(self._sql("UPDATE spans SET claim_until_ms = NULL WHERE pk = ?"),
                            [(pk,) for pk in span_pks])

    def count_pending_violations(self, trace_id=None):
        with self._transaction(write=False) as cur:
            if trace_id is None:
                self._execute(cur, "SELECT COUNT(*) FROM spans WHERE correlation_state = 'pending'")
            else:
                self._execute(cur, "SELECT COUNT(*) FROM spans WHERE correlation_state = 'pending' AND trace_id = ?",
                              (trace_id,))
            return int(cur.fetchone()[0])

    def correlations(self, trace_id=None, since_ms=None, limit=500, until_ms=None):
        where, params = ["1 = 1"], []
        if trace_id is not None:
            where.append("trace_id = ?")
            params.append(trace_id)
        if since_ms is not None:
            where.append("span_end_ms >= ?")
            params.append(since_ms)
        if until_ms is not None:
            where.append("span_end_ms <= ?")
            params.append(until_ms)
        with self._transaction(write=False) as cur:
            self._execute(cur, f"SELECT {', '.join(CORRELATION_COLUMNS)} FROM correlations "
                               f"WHERE {' AND '.join(where)} ORDER BY span_end_ms DESC, span_pk DESC LIMIT ?",
                          (*params, limit))
            rows = self._rows(cur, CORRELATION_COLUMNS)
        for row in rows:
            row["anomalies"] = json.loads(row["anomalies"])
            row.pop("span_pk")
        return rows

    # -- alerts -----------------------------------------------------------------------
    def record_alerts(self, alerts, received_ms, receiver=""):
        """Upsert by (fingerprint, startsAt); returns (new episodes, repeats updated)."""
        new = repeats = 0
        with self._transaction(write=True) as cur:
            for alert in alerts:
                labels = alert.get("labels") or {}
                params = (alert["fingerprint"], alert["startsAt"], str(labels.get("alertname", "")),
                          alert["status"], _dumps(labels), _dumps(alert.get("annotations") or {}),
                          alert.get("endsAt"), alert.get("generatorURL"), received_ms, received_ms, 1, receiver)
                self._execute(cur, "SELECT receive_count FROM alerts WHERE fingerprint = ? AND starts_at = ?",
                              params[:2])
                if cur.fetchone() is None:
                    new += 1
                else:
                    repeats += 1
                self._execute(cur,
                              f"INSERT INTO alerts ({', '.join(ALERT_COLUMNS)}) VALUES "
                              f"({', '.join('?' * len(ALERT_COLUMNS))}) ON CONFLICT (fingerprint, starts_at) DO "
                              "UPDATE SET status = excluded.status, ends_at = excluded.ends_at, "
                              "annotations = excluded.annotations, last_received_ms = excluded.last_received_ms, "
                              "receiver = excluded.receiver, "
                              "receive_count = alerts.receive_count + 1", params)
        return new, repeats

    def reconcile_alerts(self, current, now_iso, received_ms):
        """Make the firing rows exactly Alertmanager's alerts (`current`: its
        GET /api/v2/alerts, every state). A firing row Alertmanager no longer holds is
        resolved (ends_at `now_iso`): it ended while inhibited or silenced, when no
        notification carries a resolution. An alert Alertmanager holds with no firing row
        (inhibited or silenced since it started, so never notified) is added with
        receive_count 0 and no receiver. Episodes match on fingerprint and start time
        (the API and the webhook write the same instant in different precisions).
        Returns counts: resolved, added, firing."""
        wanted = {(a["fingerprint"], instant_ms(a["startsAt"])): a for a in current}
        resolved = added = 0
        with self._transaction(write=True) as cur:
            fingerprints = sorted({fingerprint for fingerprint, _ in wanted})
            placeholders = ", ".join("?" * len(fingerprints)) or "NULL"
            self._execute(cur, "SELECT fingerprint, starts_at, status FROM alerts WHERE status = 'firing' "
                               f"OR fingerprint IN ({placeholders})", fingerprints)
            stored = {}
            for fingerprint, starts_at, status in cur.fetchall():
                stored.setdefault((fingerprint, instant_ms(starts_at)), []).append((starts_at, status))
            for key, rows in stored.items():
                for starts_at, status in rows:
                    if status == "firing" and key not in wanted:
                        self._execute(cur, "UPDATE alerts SET status = 'resolved', ends_at = ? "
                                           "WHERE fingerprint = ? AND starts_at = ?", (now_iso, key[0], starts_at))
                        resolved += 1
                    elif status != "firing" and key in wanted:
                        # Resolved here, still held there (a resolution raced a re-fire).
                        self._execute(cur, "UPDATE alerts SET status = 'firing', ends_at = NULL "
                                           "WHERE fingerprint = ? AND starts_at = ?", (key[0], starts_at))
            for key, alert in wanted.items():
                if key in stored:
                    continue
                labels = alert.get("labels") or {}
                self._execute(cur, f"INSERT INTO alerts ({', '.join(ALERT_COLUMNS)}) VALUES "
                                   f"({', '.join('?' * len(ALERT_COLUMNS))}) ON CONFLICT (fingerprint, starts_at) "
                                   "DO UPDATE SET status = 'firing'",
                              (alert["fingerprint"], alert["startsAt"], str(labels.get("alertname", "")), "firing",
                               _dumps(labels), _dumps(alert.get("annotations") or {}), None,
                               alert.get("generatorURL"), received_ms, received_ms, 0, ""))
                added += 1
            self._execute(cur, "SELECT COUNT(*) FROM alerts WHERE status = 'firing'")
            firing = cur.fetchone()[0]
        return {"resolved": resolved, "added": added, "firing": firing}

    def alerts(self, since_ms=None, status=None, alertname=None, limit=500):
        where, params = ["1 = 1"], []
        for column, value in (("status", status), ("alertname", alertname)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if since_ms is not None:
            where.append("last_received_ms >= ?")
            params.append(since_ms)
        with self._transaction(write=False) as cur:
            self._execute(cur, f"SELECT {', '.join(ALERT_COLUMNS)} FROM alerts WHERE {' AND '.join(where)} "
                               "ORDER BY last_received_ms DESC LIMIT ?", (*params, limit))
            rows = self._rows(cur, ALERT_COLUMNS)
        for row in rows:
            row["labels"] = json.loads(row["labels"])
            row["annotations"] = json.loads(row["annotations"])
        return rows

    def alerts_after(self, cursor, status=None, limit=100):
        where, params = ["1 = 1"], []
        if status is not None:
            where.append("status = ?")
            params.append(status)
        if cursor is not None:
            received, fingerprint, starts_at = cursor
            where.append("(last_received_ms > ? OR (last_received_ms = ? AND (fingerprint > ? OR "
                         "(fingerprint = ? AND starts_at > ?))))")
            params += [received, received, fingerprint, fingerprint, starts_at]
        with self._transaction(write=False) as cur:
            self._execute(cur, f"SELECT {', '.join(ALERT_COLUMNS)} FROM alerts WHERE {' AND '.join(where)} "
                               "ORDER BY last_received_ms, fingerprint, starts_at LIMIT ?", (*params, limit))
            rows = self._rows(cur, ALERT_COLUMNS)
        for row in rows:
            row["labels"] = json.loads(row["labels"])
            row["annotations"] = json.loads(row["annotations"])
        return rows

    # -- documents --------------------------------------------------------------------
    def save_session(self, session_id, data):
        stamp = now_ms()
        with self._transaction(write=True) as cur:
            self._execute(cur, "INSERT INTO sessions (id, created_ms, updated_ms, data) VALUES (?, ?, ?, ?) "
                               "ON CONFLICT (id) DO UPDATE SET updated_ms = excluded.updated_ms, data = excluded.data",
                          (session_id, stamp, stamp, _dumps(data)))

    def load_session(self, session_id):
        with self._transaction(write=False) as cur:
            self._execute(cur, "SELECT data, created_ms, updated_ms FROM sessions WHERE id = ?", (session_id,))
            row = cur.fetchone()
        return None if row is None else {"id": session_id, "data": json.loads(row[0]),
                                         "created_ms": row[1], "updated_ms": row[2]}

    def save_simulation(self, sim_id, status, data):
        stamp = now_ms()
        with self._transaction(write=True) as cur:
            self._execute(cur, "INSERT INTO simulation_results (id, created_ms, updated_ms, status, data) "
                               "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                               "updated_ms = excluded.updated_ms, status = excluded.status, data = excluded.data",
                          (sim_id, stamp, stamp, status, _dumps(data)))

    def load_simulation(self, sim_id):
        with self._transaction(write=False) as cur:
            self._execute(cur, "SELECT status, data, created_ms, updated_ms FROM simulation_results WHERE id = ?",
                          (sim_id,))
            row = cur.fetchone()
        return None if row is None else {"id": sim_id, "status": row[0], "data": json.loads(row[1]),
                                         "created_ms": row[2], "updated_ms": row[3]}

    # -- housekeeping -----------------------------------------------------------------
    def purge_before(self, cutoff_ms):
        deleted = {}
        with self._transaction(write=True) as cur:
            for table, column in (("correlations", "correlated_ms"), ("spans", "received_ms"),
                                  ("alerts", "last_received_ms"), ("sessions", "updated_ms"),
                                  ("simulation_results", "updated_ms")):
                self._execute(cur, f"DELETE FROM {table} WHERE {column} < ?", (cutoff_ms,))
                deleted[table] = max(cur.rowcount, 0)
        return deleted


def _statements(script: str) -> Iterator[str]:
    """Statements of a migration file: `;`-terminated, `--` comments dropped."""
    lines = [line for line in script.splitlines() if not line.strip().startswith("--")]
    for statement in "\n".join(lines).split(";"):
        if statement.strip():
            yield statement.strip()
