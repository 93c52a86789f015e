"""Sidecar storage: one small interface (`Storage`, storage/base.py), two backends.

- SQLite (default): one file in WAL mode, `synchronous=FULL` so an acknowledged write
  survives a kill -9 or a power cut, and an exclusive flock(2) on the file so a second
  sidecar process (a rolling update racing the old one) fails loudly at start-up.
- PostgreSQL (`--database postgresql://...`): for several replicas behind one load
  balancer; the same SQL, the same tests.

Both apply the numbered migrations in storage/migrations/ at start-up, record each in a
`schema_version` ledger, and refuse a database whose schema is newer than the code.
"""
from __future__ import annotations

from .base import SCHEMA_VERSION, SpanRow, Storage, StorageError  # noqa: F401


def open_storage(database: str, **kwargs) -> Storage:
    """`postgresql://...` (or `postgres://`) opens PostgreSQL; anything else is a SQLite path."""
    if database.startswith(("postgresql://", "postgres://")):
        from .postgres import PostgresStorage
        return PostgresStorage(database, **kwargs)
    from .sqlite import SQLiteStorage
    return SQLiteStorage(database, **kwargs)
