"""POST /nccl/operations and GET /nccl/operations/active: NCCL operations reported by a
job over HTTP, and the operations in flight with any hang's culprits.

Parsing and validation are pure (parse_operations); the handlers only map results and
errors to HTTP. A batch is all or nothing: one invalid record rejects the whole body and
nothing already stored changes.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from ..schema import shown
from .events import OPS, NcclCall
from .tracker import CapacityError, NcclTracker, RecordError

MAX_RECORDS = 10_000
_COMM_PATTERN = re.compile(r"^[0-9A-Za-z_.:-]{1,64}$")
_FIELDS = {"op", "comm", "rank", "nranks", "bytes", "start", "end", "pid"}
# Linux PID_MAX_LIMIT: pids are below 2^22.
_MAX_PID = 1 << 22
_REQUIRED = ("op", "comm", "rank", "nranks", "bytes", "start")
# UNIX seconds between 2001 and 2286: catches milliseconds and relative times early.
_MIN_TIMESTAMP, _MAX_TIMESTAMP = 1e9, 1e10


class IngestError(RecordError):
    """A request body or record that is not valid input."""


def parse_operations(body: bytes) -> list[NcclCall]:
    """One JSON record or a list of them -> NcclCall records, or IngestError."""
    if not body.strip():
        raise IngestError("empty body: expected a JSON object or a list of objects")
    try:
        data = json.loads(body)
    except UnicodeDecodeError as exc:
        raise IngestError(f"body is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise IngestError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise IngestError("JSON nested too deeply") from None
    except ValueError as exc:              # e.g. an integer of more digits than int() takes
        raise IngestError(f"invalid JSON: {exc}") from None
    records = data if isinstance(data, list) else [data]
    if not isinstance(data, (list, dict)):
        raise IngestError(f"expected a JSON object or a list of objects, got {type(data).__name__}")
    if not records:
        raise IngestError("empty list: nothing to ingest")
    if len(records) > MAX_RECORDS:
        raise IngestError(f"{len(records)} records in one request; at most {MAX_RECORDS}")
    return [_parse_record(record, index) for index, record in enumerate(records)]


def _parse_record(record: Any, index: int) -> NcclCall:
    if not isinstance(record, dict):
        raise IngestError(f"record {index}: expected an object, got {type(record).__name__}", index)
    unknown = sorted(set(record) - _FIELDS)
    if unknown:
        raise IngestError(f"record {index}: unknown field {shown(unknown[0])} (allowed: {', '.join(sorted(_FIELDS))})",
                          index, unknown[0][:64])
    for name in _REQUIRED:
        if name not in record:
            raise IngestError(f"record {index}: missing field {name!r}", index, name)
    op = record["op"]
    if op not in OPS:
        raise IngestError(f"record {index}: op {shown(op)} is not one of {', '.join(OPS)}", index, "op")
    comm = record["comm"]
    if not isinstance(comm, str) or not _COMM_PATTERN.match(comm):
        raise IngestError(f"record {index}: comm must be 1-64 characters of [0-9A-Za-z_.:-], got {shown(comm)}",
                          index, "comm")
    nranks = _integer(record, "nranks", index, minimum=1)
    rank = _integer(record, "rank", index, minimum=0)
    if rank >= nranks:
        raise IngestError(f"record {index}: rank {rank} must be below nranks {nranks}", index, "rank")
    nbytes = _integer(record, "bytes", index, minimum=0)
    start = _timestamp(record, "start", index)
    end = _timestamp(record, "end", index) if record.get("end") is not None else None
    if end is not None and end < start:
        raise IngestError(f"record {index}: end {end} is before start {start}", index, "end")
    pid = _integer(record, "pid", index, minimum=1) if record.get("pid") is not None else None
    if pid is not None and pid >= _MAX_PID:
        raise IngestError(f"record {index}: pid {pid} is not a Linux process id (below {_MAX_PID})", index, "pid")
    return NcclCall(op=op, comm=comm, rank=rank, nranks=nranks, nbytes=nbytes, start=start, end=end, pid=pid)


def _integer(record: dict, name: str, index: int, minimum: int) -> int:
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise IngestError(f"record {index}: {name} must be an integer, got {shown(value)}", index, name)
    if value < minimum:
        raise IngestError(f"record {index}: {name} must be >= {minimum}, got {value}", index, name)
    if value >= 2 ** 63:
        raise IngestError(f"record {index}: {name} {value} is out of range", index, name)
    return value


def _timestamp(record: dict, name: str, index: int) -> float:
    value = record[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise IngestError(f"record {index}: {name} must be a number of UNIX seconds, got {shown(value)}", index, name)
    if value > _MAX_TIMESTAMP:
        raise IngestError(f"record {index}: {name} {value} looks like milliseconds; send UNIX seconds",
                          index, name)
    if value < _MIN_TIMESTAMP:
        raise IngestError(f"record {index}: {name} {value} is not a UNIX timestamp in seconds", index, name)
    return float(value)


def _json(status: int, payload: Any) -> tuple[int, str, bytes]:
    return status, "application/json", (json.dumps(payload, sort_keys=True) + "\n").encode()


class IngestRoutes:
    """The two HTTP handlers over one tracker; counts accepted and rejected requests.

    POST is off unless the `nccl.ingest` setting turns it on: whoever can reach the port
    could otherwise invent communicators. Turn it on behind --web.config.file
    basic_auth_users (every route then needs credentials)."""

    def __init__(self, tracker: NcclTracker, enabled: bool = False) -> None:
        self.tracker = tracker
        self.enabled = enabled
        self.requests = {"accepted": 0, "rejected": 0, "disabled": 0}

    def routes(self) -> dict:
        return {("POST", "/nccl/operations"): self.post_operations,
                ("GET", "/nccl/operations/active"): self.get_active}

    def post_operations(self, body: bytes, query: dict) -> tuple[int, str, bytes]:
        if not self.enabled:
            self.requests["disabled"] += 1
            return _json(403, {"error": "POST /nccl/operations is off on this exporter: set `ingest: true` in the "
                                        "nccl section of --config.file (with basic_auth_users in --web.config.file)"})
        try:
            calls = parse_operations(body)
            self.tracker.record_batch(calls)
        except RecordError as exc:            # invalid input, a conflict, or no room left
            self.requests["rejected"] += 1
            payload = {"error": str(exc)}
            if exc.index is not None:
                payload["index"] = exc.index
            if exc.field is not None:
                payload["field"] = exc.field
            return _json(503 if isinstance(exc, CapacityError) else 400, payload)
        self.requests["accepted"] += 1
        return _json(202, {"accepted": len(calls)})

    def get_active(self, body: bytes, query: dict) -> tuple[int, str, bytes]:
        active, culprits = self.tracker.hang_culprits()
        return _json(200, {"operations": [operation.as_json() for operation in active],
                           "culprits": [culprit.as_json() for culprit in culprits],
                           "hang_multiplier": self.tracker.hang_multiplier,
                           "min_completed": self.tracker.min_completed,
                           "window": self.tracker.window})
