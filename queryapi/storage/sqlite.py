"""SQLite backend: one file, WAL, an exclusive flock(2) held for the process' lifetime."""
from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
from pathlib import Path

from .base import StorageError
from .sql import SqlStorage


class SQLiteStorage(SqlStorage):
    dialect = "sqlite"
    auto_id = "INTEGER PRIMARY KEY AUTOINCREMENT"

    def __init__(self, path: str | Path, migrate: bool = True) -> None:
        self.path = Path(path).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._take_lock()
        self._local = threading.local()
        # SQLite allows one writer at a time; queueing writers here is cheaper than
        # letting them spin on SQLITE_BUSY.
        self._write_lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        try:
            if migrate:
                self.migrate()
        except BaseException:
            self.close()
            raise

    def describe(self) -> str:
        return str(self.path)

    def _take_lock(self) -> int:
        # flock on the database file itself: SQLite's own locks are fcntl(2) record locks,
        # which are independent of flock(2), so this one only excludes other sidecars.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageError(f"database {self.path} is locked by another sidecar process; two writers "
                               "would corrupt it. Stop the other process, or give this one its own "
                               "--database (or use PostgreSQL for several replicas).") from None
        return fd

    def _connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a write acknowledged to a client is on disk, not only in the page cache.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    @contextlib.contextmanager
    def _transaction(self, write: bool):
        conn = self._connection()
        lock = self._write_lock if write else contextlib.nullcontext()
        with lock:
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield cur
            except BaseException:
                conn.rollback()
                raise
            else:
                conn.commit()
            finally:
                cur.close()

    def _current_version(self, cur) -> int:
        cur.execute("SELECT MAX(version) FROM schema_version")
        return int(cur.fetchone()[0] or 0)

    def close(self) -> None:
        with self._connections_lock:
            for conn in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._connections.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
