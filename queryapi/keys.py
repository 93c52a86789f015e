"""The API-key file: hashed keys with scopes, re-read when it changes (rotation without a
restart).

Format (YAML):

    keys:
      - id: grafana                 # shown in the audit log, never the key itself
        sha256: 9f86d0...           # hex SHA-256 of the full key text
        scopes: [read]              # read < write < admin (each includes the ones before)
        rate_limit: {per_second: 20, burst: 40}   # optional, overrides the default

Keys are 256-bit random tokens (`fsk_` + 43 url-safe characters), so a fast SHA-256 is
the right hash here: there is nothing to brute-force that a slow hash would protect,
and every request pays for the lookup. `fabricscope sidecar --add-key ID` mints one.
"""
from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fabricscope.atomicfile import write_atomically
from fabricscope.exporter.schema import ConfigError, load_yaml
from fabricscope.httpconnection import capped

from .config import RateLimit, format_validation_error

log = logging.getLogger("fabricscope.sidecar.keys")

SCOPES = ("read", "write", "admin")
TOKEN_PREFIX = "fsk_"
# How often a request may trigger a stat() of the key file.
RELOAD_CHECK_SECONDS = 1.0


class KeyFileError(Exception):
    pass


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    scopes: list[str] = Field(min_length=1)
    rate_limit: RateLimit | None = None

    @field_validator("scopes")
    @classmethod
    def _known(cls, value: list[str]) -> list[str]:
        unknown = [s for s in value if s not in SCOPES]
        if unknown:
            raise ValueError(f"unknown scope(s) {unknown}; known: {list(SCOPES)}")
        return value

    def grants(self, scope: str) -> bool:
        wanted = SCOPES.index(scope)
        return any(SCOPES.index(s) >= wanted for s in self.scopes)


class KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[KeyEntry] = Field(default_factory=list)


def hash_key(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def mint_key() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def parse_key_file(path: Path) -> dict[str, KeyEntry]:
    try:
        data = load_yaml(path) or {}
    except ConfigError as exc:               # unreadable, not a regular file, not YAML: one line
        raise KeyFileError(f"key file {exc}") from None
    try:
        parsed = KeyFile.model_validate(data)
    except ValidationError as exc:
        raise KeyFileError(f"key file {path}: {format_validation_error(exc)}") from None
    by_hash: dict[str, KeyEntry] = {}
    ids = set()
    for entry in parsed.keys:
        if entry.id in ids:
            raise KeyFileError(f"key file {path}: duplicate key id {entry.id!r}")
        ids.add(entry.id)
        by_hash[entry.sha256] = entry
    return by_hash


@dataclass
class _Snapshot:
    signature: tuple | None
    keys: dict[str, KeyEntry]


class KeyStore:
    """Looks keys up by hash; re-reads the file when its inode, size or mtime changes.
    A broken edit keeps the last good keys (and logs why) instead of locking everyone out."""

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self._checked = 0.0
        self.reload_failures = 0
        if self.path is None:
            self._snapshot = _Snapshot(None, {})
        else:
            self._snapshot = _Snapshot(self._signature(), parse_key_file(self.path))

    def _signature(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _maybe_reload(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._checked < RELOAD_CHECK_SECONDS:
            return
        with self._lock:
            if now - self._checked < RELOAD_CHECK_SECONDS:
                return
            self._checked = now
            signature = self._signature()
            if signature == self._snapshot.signature:
                return
            try:
                keys = parse_key_file(self.path)
            except KeyFileError as exc:
                self.reload_failures += 1
                log.error("keeping the previous API keys: %s", capped(str(exc)))
                self._snapshot = _Snapshot(signature, self._snapshot.keys)
                return
            log.info("API key file reloaded: %d key(s)", len(keys))
            self._snapshot = _Snapshot(signature, keys)

    def lookup(self, token: str) -> KeyEntry | None:
        self._maybe_reload()
        return self._snapshot.keys.get(hash_key(token))

    def __len__(self) -> int:
        return len(self._snapshot.keys)


def add_key(path: Path, key_id: str, scopes: list[str]) -> str:
    """Append a new key to `path` (created if missing, written atomically) and return the
    token, which is shown once and stored nowhere."""
    path = Path(path)
    # A broken file is refused, not appended to; the entries come back in file order.
    existing = KeyFile(keys=list(parse_key_file(path).values())) if path.exists() else KeyFile()
    if any(entry.id == key_id for entry in existing.keys):
        raise KeyFileError(f"key id {key_id!r} already exists in {path}; remove it first to rotate")
    token = mint_key()
    try:
        entry = KeyEntry(id=key_id, sha256=hash_key(token), scopes=scopes)
    except ValidationError as exc:
        raise KeyFileError(format_validation_error(exc)) from None
    data = existing.model_dump(exclude_none=True)
    data["keys"].append(entry.model_dump(exclude_none=True))
    write_atomically(path, yaml.safe_dump(data, sort_keys=False), mode=0o600)
    return token
