"""The storage interface the blueprints use, and its records."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def migration_files() -> list[tuple[int, Path]]:
    found = []
    for path in sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql")):
        found.append((int(path.name[:4]), path))
    versions = [v for v, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migrations must be numbered 1..n without gaps, found {versions}")
    return found


SCHEMA_VERSION = len(migration_files())


class StorageError(Exception):
    """The database cannot be used (locked by another process, newer schema, unreachable)."""


@dataclass
class SpanRow:
    trace_id: str
    span_id: str
    service: str
    operation: str
    start_ms: int
    end_ms: int
    duration_ms: float
    network_path: list[str]
    attributes: dict[str, Any]
    slo_ms: float
    ingest_format: str = "seed"
    received_ms: int = 0

    @property
    def violated(self) -> bool:
        return self.duration_ms > self.slo_ms


@dataclass
class Correlation:
    span_pk: int
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
    anomalies: list[dict[str, Any]] = field(default_factory=list)


class Storage:
    """What the sidecar stores. Implemented once in SQL (storage/sql.py) for both backends;
    every method is safe to call from several threads."""

    dialect: str

    def schema_version(self) -> int: raise NotImplementedError
    # spans --------------------------------------------------------------------------
    def insert_spans(self, spans: list[SpanRow]) -> int: raise NotImplementedError
    def slo_violations(self, since_ms: int, until_ms: int | None = None, service: str | None = None,
                       operation: str | None = None, limit: int = 500,
                       before: tuple[int, int] | None = None) -> list[dict]:
        """Violating spans newest first (end_ms, then pk, descending); `before` = (end_ms, pk)
        of the last span of the previous page."""
        raise NotImplementedError
    def recent_services(self, since_ms: int, limit: int = 1000) -> list[str]:
        """Service names of the spans received since `since_ms` (the NL layer's vocabulary)."""
        raise NotImplementedError
    def claim_pending_violations(self, limit: int, lease_ms: int = 60_000) -> list[dict]: raise NotImplementedError
    def save_correlations(self, done_span_pks: list[int], correlations: list[Correlation]) -> None:
        raise NotImplementedError
    def release_claims(self, span_pks: list[int]) -> None: raise NotImplementedError
    def count_pending_violations(self, trace_id: str | None = None) -> int: raise NotImplementedError
    def correlations(self, trace_id: str | None = None, since_ms: int | None = None,
                     limit: int = 500, until_ms: int | None = None) -> list[dict]:
        """Correlated violations newest first, whose span ended in [since_ms, until_ms]."""
        raise NotImplementedError
    def alerts_after(self, cursor: tuple[int, str, str] | None, status: str | None = None,
                     limit: int = 100) -> list[dict]:
        """Alerts oldest first, strictly after `cursor` = (last_received_ms, fingerprint,
        starts_at) of the last one a reader handled: a reader that pages through them
        never skips one, however many arrive at once."""
        raise NotImplementedError
    # alerts -------------------------------------------------------------------------
    def record_alerts(self, alerts: list[dict], received_ms: int, receiver: str = "") -> tuple[int, int]:
        raise NotImplementedError
    def alerts(self, since_ms: int | None = None, status: str | None = None, alertname: str | None = None,
               limit: int = 500) -> list[dict]: raise NotImplementedError
    def reconcile_alerts(self, current: list[dict], now_iso: str, received_ms: int) -> dict[str, int]:
        raise NotImplementedError
    # documents (query sessions, simulation results) ---------------------------------
    def save_session(self, session_id: str, data: dict) -> None: raise NotImplementedError
    def load_session(self, session_id: str) -> dict | None: raise NotImplementedError
    def save_simulation(self, sim_id: str, status: str, data: dict) -> None: raise NotImplementedError
    def load_simulation(self, sim_id: str) -> dict | None: raise NotImplementedError
    # housekeeping -------------------------------------------------------------------
    def purge_before(self, cutoff_ms: int) -> dict[str, int]: raise NotImplementedError
    def close(self) -> None: raise NotImplementedError
