"""Typed query parameters: each type validates and canonicalises one kind of value.

A registered query names a type per parameter; whatever asks (HTTP, MeshQL, the NL
extractor, an LLM, an MCP client) goes through the same `ParamType.parse`, so a value that
reaches a PromQL template is always canonical: numbers are ints or floats, durations are
Prometheus durations, strings match a bounded pattern (and are still written through
`promql.quote`, never pasted).
"""
from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..promql import UnencodableValue, escape_label_value


class ParamError(ValueError):
    """A parameter value that its type refuses; `param` names the parameter."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"parameter {param!r}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True)
class ParamType:
    name: str
    description: str
    parse: Callable[[Any], Any]          # raises ValueError with a specific message
    json_schema: dict[str, Any]
    # How `{{ value p }}` writes it: "string" -> escaped literal, "bare" -> canonical text
    # of a number or duration (made only of digits, letters and '.').
    render: str = "string"
    choices: tuple[str, ...] = field(default=())


_MAX_TEXT = 256


def _text(value: Any, pattern: re.Pattern[str] | None, what: str, lower: bool = False) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"expected {what} as a string, got {type(value).__name__}")
    text = str(value).strip()
    if lower:
        text = text.lower()
    if not text:
        raise ValueError(f"expected {what}, got an empty string")
    if len(text) > _MAX_TEXT:
        raise ValueError(f"expected {what} of at most {_MAX_TEXT} characters, got {len(text)}")
    if pattern is not None and not pattern.fullmatch(text):
        raise ValueError(f"{text[:64]!r} is not {what}")
    try:
        escape_label_value(text)
    except UnencodableValue as exc:
        raise ValueError(str(exc)) from None
    return text


def _integer(value: Any, low: int, high: int, what: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected {what} (an integer {low}..{high}), got a boolean")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,9}\s*", value):
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"expected {what} (an integer {low}..{high}), got {str(value)[:32]!r}")
    if not low <= value <= high:
        raise ValueError(f"{what} {value} is out of range {low}..{high}")
    return value


_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")
_DURATION = re.compile(r"(?:[0-9]+(?:ms|s|m|h|d|w))+")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MIN_WINDOW_SECONDS = 30          # below two scrape intervals a rate() has nothing to work on
MAX_WINDOW_SECONDS = 30 * 86400  # bounds the samples one query may touch


def duration_seconds(text: str) -> float:
    text = text.strip().lower()
    if not _DURATION.fullmatch(text):
        raise ValueError(f"{text[:32]!r} is not a duration like 90s, 5m, 1h or 1h30m")
    return sum(int(n) * _UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration for a whole number of seconds (3600 -> '1h')."""
    seconds = int(seconds)
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _duration(value: Any) -> str:
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    seconds = float(value) if isinstance(value, (int, float)) else duration_seconds(_text(value, None, "a duration"))
    if not math.isfinite(seconds) or seconds != int(seconds):
        raise ValueError("a duration must be a whole number of seconds")
    if not MIN_WINDOW_SECONDS <= seconds <= MAX_WINDOW_SECONDS:
        raise ValueError(f"duration {format_duration(seconds)} is outside "
                         f"{format_duration(MIN_WINDOW_SECONDS)}..{format_duration(MAX_WINDOW_SECONDS)}")
    return format_duration(seconds)


def _choice(choices: dict[str, str], what: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        key = _text(value, None, what, lower=True)
        if key not in choices:
            raise ValueError(f"{key[:32]!r} is not {what} (one of: {', '.join(sorted(set(choices.values())))})")
        return choices[key]
    return parse


def _threshold(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a threshold, got a boolean")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{str(value)[:16]!r} is not a number") from None
    if not 1.0 <= number <= 50.0:
        raise ValueError(f"threshold {number:g} is outside 1..50 (robust z-scores)")
    return number


def _ip(value: Any) -> str:
    text = _text(value, None, "an IP address")
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError(f"{text[:64]!r} is not an IPv4 or IPv6 address") from None


def _quantile(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a quantile, got a boolean")
    if isinstance(value, str):
        text = value.strip().lower()
        match = re.fullmatch(r"p([0-9]{2,4})", text)
        if match:   # p99 -> 0.99, p999 -> 0.999, p50 -> 0.5
            digits = match.group(1)
            value = float("0." + digits)
        else:
            try:
                value = float(text)
            except ValueError:
                raise ValueError(f"{text[:16]!r} is not a quantile (0.5, 0.99, p99, p999)") from None
    if not isinstance(value, (int, float)) or not 0 < float(value) < 1:
        raise ValueError(f"quantile {value!r} is not between 0 and 1 (exclusive)")
    return float(value)


# Label names, host names and device names as the exporter writes them.
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})")
_DEVICE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:/-]{0,127})")
_COMM = re.compile(r"[0-9a-f]{16}")
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._:/-]{0,127})")

SEVERITIES = {"critical": "critical", "warning": "warning", "info": "info",
              "page": "critical", "fatal": "critical", "ticket": "warning", "warn": "warning"}
# Kernel-log and Xid events are fatal or non_fatal (exporter/health); alert words map onto them.
EVENT_SEVERITIES = {"fatal": "fatal", "critical": "fatal", "page": "fatal", "non_fatal": "non_fatal",
                    "non-fatal": "non_fatal", "nonfatal": "non_fatal", "warning": "non_fatal", "warn": "non_fatal"}
PORT_STATES = {"down": "DOWN", "init": "INIT", "armed": "ARMED", "active": "ACTIVE", "up": "ACTIVE"}
FAILURE_TYPES = {t: t for t in ("device_failure", "power_failure", "rack_failure", "switch_failure")}
# NCCL collective names as the exporter labels them (exporter/nccl/events.py OPS), by the
# spellings operators use.
NCCL_OPS = {name.lower(): name for name in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
                                             "AllToAll", "Send", "Recv")}
NCCL_OPS.update({"all-reduce": "AllReduce", "all_reduce": "AllReduce", "all-gather": "AllGather",
                 "all_gather": "AllGather", "reduce-scatter": "ReduceScatter", "reduce_scatter": "ReduceScatter",
                 "all-to-all": "AllToAll", "all_to_all": "AllToAll"})
_TRACE_ID = re.compile(r"[0-9a-f]{16,32}")
DEVICE_FIELDS = {f: f for f in ("node", "device", "role", "hca_type", "fw_version", "board_id", "numa_node")}

TYPES: dict[str, ParamType] = {t.name: t for t in (
    ParamType("host", "a node name as Prometheus labels it (node label), e.g. gpu-node-1",
              lambda v: _text(v, _HOST, "a host name"), {"type": "string", "pattern": f"^{_HOST.pattern}$"}),
    ParamType("device", "a device name: an HCA (mlx5_3), a GPU or a switch as the topology names it",
              lambda v: _text(v, _DEVICE, "a device name"), {"type": "string", "pattern": f"^{_DEVICE.pattern}$"}),
    ParamType("gpu", "a GPU index on its node (0..255)", lambda v: _integer(v, 0, 255, "GPU index"),
              {"type": "integer", "minimum": 0, "maximum": 255}, render="bare"),
    ParamType("rank", "an NCCL rank (0..1048575)", lambda v: _integer(v, 0, 1 << 20, "rank"),
              {"type": "integer", "minimum": 0, "maximum": 1 << 20}, render="bare"),
    ParamType("port", "an HCA port number (1..255)", lambda v: _integer(v, 1, 255, "port"),
              {"type": "integer", "minimum": 1, "maximum": 255}, render="bare"),
    ParamType("limit", "how many rows (1..100)", lambda v: _integer(v, 1, 100, "limit"),
              {"type": "integer", "minimum": 1, "maximum": 100}, render="bare"),
    ParamType("comm", "an NCCL communicator id: the comm label, 16 hex digits (one per job)",
              lambda v: _text(v, _COMM, "a communicator id (16 hex digits)", lower=True),
              {"type": "string", "pattern": f"^{_COMM.pattern}$"}),
    ParamType("duration", "a time window (30s..30d), e.g. 15m, 1h, 1h30m",
              _duration, {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w))+$"}, render="bare"),
    ParamType("quantile", "a quantile between 0 and 1 (0.99, 0.999; p99 and p999 are accepted)",
              _quantile, {"type": ["number", "string"]}, render="bare"),
    ParamType("severity", "an alert severity", _choice(SEVERITIES, "a severity"),
              {"type": "string", "enum": ["critical", "warning", "info"]},
              choices=("critical", "warning", "info")),
    ParamType("event_severity", "a kernel-log event severity (fatal, non_fatal)",
              _choice(EVENT_SEVERITIES, "an event severity"), {"type": "string", "enum": ["fatal", "non_fatal"]},
              choices=("fatal", "non_fatal")),
    ParamType("port_state", "an InfiniBand port state", _choice(PORT_STATES, "a port state"),
              {"type": "string", "enum": ["down", "init", "armed", "active"]},
              choices=("DOWN", "INIT", "ARMED", "ACTIVE")),
    ParamType("failure_type", "what fails in a blast-radius simulation", _choice(FAILURE_TYPES, "a failure type"),
              {"type": "string", "enum": sorted(FAILURE_TYPES)}, choices=tuple(sorted(FAILURE_TYPES))),
    ParamType("device_field", "a label of fabric_infiniband_device_info to filter on",
              _choice(DEVICE_FIELDS, "a device field"), {"type": "string", "enum": sorted(DEVICE_FIELDS)},
              render="label", choices=tuple(sorted(DEVICE_FIELDS))),
    ParamType("name", "a service or job name (letters, digits, . _ : / -)",
              lambda v: _text(v, _NAME, "a name"), {"type": "string", "pattern": f"^{_NAME.pattern}$"}),
    ParamType("text", f"any text up to {_MAX_TEXT} characters (matched exactly)",
              lambda v: _text(v, None, "text"), {"type": "string", "maxLength": _MAX_TEXT}),
    ParamType("ip", "an IPv4 or IPv6 address", _ip, {"type": "string"}),
    ParamType("xid", "an NVIDIA Xid code (1..999), e.g. 79 (GPU fallen off the bus)",
              lambda v: _integer(v, 1, 999, "Xid code"), {"type": "integer", "minimum": 1, "maximum": 999}),
    ParamType("nccl_op", "an NCCL collective (AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, "
              "Send, Recv)", _choice(NCCL_OPS, "an NCCL collective"),
              {"type": "string", "enum": sorted(set(NCCL_OPS.values()))}, choices=tuple(sorted(set(NCCL_OPS.values())))),
    ParamType("trace_id", "a trace id (16 or 32 hex digits)",
              lambda v: _text(v, _TRACE_ID, "a trace id (16-32 hex digits)", lower=True),
              {"type": "string", "pattern": f"^{_TRACE_ID.pattern}$"}),
    ParamType("threshold", "a robust z-score threshold (1..50): |lag - median| / (1.4826 x MAD)", _threshold,
              {"type": "number", "minimum": 1, "maximum": 50}, render="bare"),
)}


def parse_value(param: str, type_name: str, value: Any) -> Any:
    try:
        return TYPES[type_name].parse(value)
    except ValueError as exc:
        raise ParamError(param, str(exc)) from None
