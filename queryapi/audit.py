"""Structured audit log: one JSON object per request, written for every request the
sidecar answers, including the ones auth rejected (401/403), the body limit refused (413)
and the rate limiter turned away (429); burst attackers and misbehaving clients show up
there. Never logs credentials or bodies."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

AUDIT_LOGGER = "fabricscope.sidecar.audit"


def make_audit_logger(path: Path | None) -> logging.Logger:
    logger = logging.getLogger(f"{AUDIT_LOGGER}.{id(path)}" if path else AUDIT_LOGGER)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            handler: logging.Handler = logging.FileHandler(path)
        else:
            handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    return logger


def audit_record(*, method: str, path: str, status: int, key_id: str | None, scope: str | None,
                 remote: str | None, started: float, error_code: str | None,
                 request_bytes: int | None) -> str:
    return json.dumps({
        "ts": round(time.time(), 3),
        "event": "request",
        "method": method,
        "path": path,
        "status": status,
        "key_id": key_id,
        "scope": scope,
        "remote": remote,
        "duration_ms": round((time.perf_counter() - started) * 1000, 3),
        "error_code": error_code,
        "request_bytes": request_bytes,
    }, separators=(",", ":"))
