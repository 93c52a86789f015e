"""Running a registered query: validate, render, ask Prometheus (or call the tool), cap.

This is the only place a registered query executes, for every transport. PromQL queries
are bounded twice: Prometheus' own evaluation timeout (the sidecar's Prometheus timeout)
and a cap on returned rows (`truncated` says when it cut).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from .registry import Registry

MAX_ROWS = 500


@dataclass(frozen=True)
class Caller:
    """Who runs a query: their API key (scope checks, per-key budgets) and the Flask app
    (other areas' services in app.extensions). The command line's direct mode has none."""
    key: Any = None
    app: Any = None


# tool name (queries.yaml `tool:`) -> handler(state, params, caller) -> rows, or
# {"results": rows, "summary": {...}}.
ToolHandler = Callable[[Any, dict[str, Any], Caller], Any]
_TOOL_HANDLERS: dict[str, ToolHandler] = {}


class ToolUnavailable(RuntimeError):
    """The tool behind a registered query is not available in this sidecar."""


class QueryForbidden(PermissionError):
    """The caller's key lacks the scope the query needs."""

    def __init__(self, name: str, scope: str) -> None:
        super().__init__(f"query {name!r} needs the {scope!r} scope")
        self.scope = scope


class QueryBudgetExceeded(RuntimeError):
    """A per-key budget (e.g. chaos simulations a minute) is spent; retry after `retry_after`."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def tool_handler(name: str) -> Callable[[ToolHandler], ToolHandler]:
    """Bind the Python function behind a `tool:` query (one binding per name)."""
    def decorator(function: ToolHandler) -> ToolHandler:
        if name in _TOOL_HANDLERS and _TOOL_HANDLERS[name] is not function:
            raise ValueError(f"tool handler {name!r} is already bound")
        _TOOL_HANDLERS[name] = function
        return function
    return decorator


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
        handler = _TOOL_HANDLERS.get(spec.tool)
        if handler is None:
            _load_tool_modules()
            handler = _TOOL_HANDLERS.get(spec.tool)
        if handler is None:
            raise ToolUnavailable(f"tool {spec.tool!r} behind query {name!r} is not available in this sidecar")
        rows = handler(state, values, caller or Caller())
        if isinstance(rows, dict):
            result["summary"] = rows.get("summary", {})
            rows = rows["results"]
    result["truncated"] = len(rows) > max_rows
    result["results"] = rows[:max_rows]
    return result


def _load_tool_modules() -> None:
    from . import sidecar_tools  # noqa: F401  (binds the handlers)
