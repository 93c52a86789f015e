"""Running a registered query: validate, render, ask Prometheus (or call the tool), cap.

This is the only place a registered query executes, for every transport. PromQL queries
are bounded twice: Prometheus' own evaluation timeout (the sidecar's Prometheus timeout)
and a cap on returned rows (`truncated` says when it cut).
"""
from __future__ import annotations

import math
from typing import Any

from .calls import Caller, QueryForbidden, ToolUnavailable
from .registry import Registry
from .sidecar_tools import HANDLERS

MAX_ROWS = 500


def _number(value: float) -> float | str | None:
    # JSON has no NaN/Inf; Prometheus can return them (e.g. histogram_quantile of nothing).
    if value is None or math.isnan(value):
        return None
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


def run(state, registry: Registry, name: str, params: dict[str, Any] | None, caller: Caller | None = None,
        max_rows: int = MAX_ROWS) -> dict[str, Any]:
    """{query_name, params, kind, promql?, results, truncated[, summary]}; raises UnknownQuery,
    ParamError, QueryForbidden, PrometheusError, ToolUnavailable."""
    spec = registry.get(name)
    if caller is not None and caller.key is not None and not caller.key.grants(spec.scope):
        raise QueryForbidden(name, spec.scope)
    values = registry.validate(name, params)
    result: dict[str, Any] = {"query_name": name, "params": values, "kind": "promql" if spec.promql else "tool"}
    if spec.promql is not None:
        promql = registry.render(name, values)
        samples = state.prom.query(promql, timeout=state.config.prometheus_timeout_seconds)
        rows = [{"labels": sample.labels, "value": _number(sample.value)} for sample in samples]
        result["promql"] = promql
    else:
        handler = HANDLERS.get(spec.tool)
        if handler is None:
            raise ToolUnavailable(f"tool {spec.tool!r} behind query {name!r} is not available in this sidecar")
        rows = handler(state, values, caller or Caller())
        if isinstance(rows, dict):
            result["summary"] = rows.get("summary", {})
            rows = rows["results"]
    result["truncated"] = len(rows) > max_rows
    result["results"] = rows[:max_rows]
    return result
