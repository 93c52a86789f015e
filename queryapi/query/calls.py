"""Who calls a registered query and how a call can be refused: the leaf the executor, the
tool handlers (sidecar_tools.py) and the tool registry (tools.py) share, importing nothing
of theirs, so none of them imports another back."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Caller:
    """Who runs a query: their API key (scope checks, per-key budgets). The command line's
    direct mode has none."""
    key: Any = None


# tool name (queries.yaml `tool:`) -> handler(state, params, caller) -> rows, or
# {"results": rows, "summary": {...}}. `state` is the running sidecar (context.Sidecar).
ToolHandler = Callable[[Any, dict[str, Any], Caller], Any]


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
