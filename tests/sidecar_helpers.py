"""Helpers for the sidecar tests: keys with each scope, spans in the seed format."""
from __future__ import annotations

import time
from pathlib import Path

from fabricscope.queryapi.keys import add_key

SCOPED_KEYS = {"reader": "read", "writer": "write", "admin": "admin"}


def make_keys(keys_file: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Mint one key per scope (and `extra` id -> scopes) into keys_file; id -> token."""
    return {key_id: add_key(keys_file, key_id, scopes.split(","))
            for key_id, scopes in {**SCOPED_KEYS, **(extra or {})}.items()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def seed_span(trace_id: str, span_id: str, duration_ms: float, path: list[str], *, service: str = "llm-inference",
              operation: str = "generate", end_ms: int | None = None, **attributes) -> dict:
    end_ms = end_ms if end_ms is not None else int(time.time() * 1000)
    return {"trace_id": trace_id, "span_id": span_id, "service": service, "operation": operation,
            "start_time_ms": int(end_ms - duration_ms), "end_time_ms": end_ms, "duration_ms": duration_ms,
            "network_path": path, "attributes": attributes}
