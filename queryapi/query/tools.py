"""One tool registry, two transports (MCP and POST /api/v1/tools/<name>).

Every tool is registered once here; `api.py` serves the list and the calls over HTTP and
`mcp_bridge.py` over MCP, both through `ToolRegistry.call`, so results, error shapes,
scope checks and the per-call audit line are the same whichever transport asked. Each
registered query is a tool (its parameters are the tool's input); `meshql`, `ask` and
`list_queries` are tools too.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import DEFAULT_CODES, public_message
from ..prom import PrometheusError
from . import executor
from .calls import Caller, QueryBudgetExceeded, QueryForbidden, ToolUnavailable
from .meshql import MeshQLError
from .params import ParamError
from .registry import Registry, UnknownQuery

log = logging.getLogger("fabricscope.queryapi.query")


class ToolError(Exception):
    """A failed call, with the sidecar's stable error code and an HTTP status."""

    def __init__(self, status: int, code: str, message: str, detail: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": public_message(self.status, self.code, self.message),
                          "detail": self.detail}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    handler: Callable[[Any, dict[str, Any], Caller], dict[str, Any]]   # (state, arguments, caller)
    scope: str = "read"

    def listing(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}


def classify(exc: BaseException) -> ToolError:
    """Map an exception to the one error shape both transports return."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, UnknownQuery):
        return ToolError(404, "unknown_query", str(exc), {"query_name": str(exc.name)[:80]})
    if isinstance(exc, ParamError):
        return ToolError(422, "invalid_params", str(exc), {"param": str(exc.param)[:80]})
    if isinstance(exc, MeshQLError):
        body = exc.to_dict()
        code = body.pop("error")
        body.pop("message")
        return ToolError(422, code, exc.message, body)
    if isinstance(exc, PrometheusError):
        status = 504 if exc.reason == "timeout" else 502 if exc.reason in ("bad_response", "query_error") else 503
        return ToolError(status, f"prometheus_{exc.reason}", exc.public_message)
    if isinstance(exc, ToolUnavailable):
        return ToolError(503, "tool_unavailable", str(exc))
    if isinstance(exc, QueryForbidden):
        return ToolError(403, "forbidden", str(exc), {"needs": exc.scope})
    if isinstance(exc, QueryBudgetExceeded):
        retry = max(1, math.ceil(exc.retry_after))
        return ToolError(429, "rate_limited", str(exc), {"retry_after_seconds": retry}, {"Retry-After": str(retry)})
    if isinstance(exc, ValueError):
        # e.g. fabricscope.chaos' ChaosInputError names the field it refused and close matches
        field, choices = getattr(exc, "field", None), getattr(exc, "choices", None)
        detail = {"param": field} if field else {}
        if choices:
            detail["choices"] = [str(choice)[:256] for choice in choices[:20]]
        return ToolError(422, "invalid_params", str(exc)[:500], detail)
    return ToolError(500, DEFAULT_CODES[500], f"internal error in tool ({type(exc).__name__})")


class ToolRegistry:
    def __init__(self, tools: list[Tool]) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"tool {tool.name!r} registered twice")
            self.tools[tool.name] = tool

    def listing(self) -> list[dict[str, Any]]:
        return [tool.listing() for tool in sorted(self.tools.values(), key=lambda t: t.name)]

    def call(self, state, name: str, arguments: Any, key, transport: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        """(HTTP status, body, headers): the result, or {"error": {code, message, detail}}."""
        headers: dict[str, str] = {}
        started = time.perf_counter()
        try:
            tool = self.tools.get(name)
            if tool is None:
                raise ToolError(404, "tool_not_found", f"no tool named {str(name)[:80]!r}",
                                {"tools": sorted(self.tools)})
            if key is None or not key.grants(tool.scope):
                raise ToolError(403, "forbidden", f"tool {tool.name!r} needs the {tool.scope!r} scope",
                                {"needs": tool.scope})
            if arguments is None:
                arguments = {}
            if not isinstance(arguments, dict):
                raise ToolError(422, "invalid_params", "tool arguments must be a JSON object")
            status, body = 200, tool.handler(state, arguments, Caller(key))
        except Exception as exc:  # every failure leaves as the shared error shape
            error = classify(exc)
            if error.code == DEFAULT_CODES[500]:
                log.exception("tool %r failed", str(name)[:80])
            status, body, headers = error.status, error.body(), error.headers
        state.audit.info(json.dumps({
            "ts": round(time.time(), 3), "event": "tool_call", "transport": transport, "tool": str(name)[:80],
            "status": status, "key_id": key.id if key is not None else None,
            "error_code": body["error"]["code"] if status >= 400 else None,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3)}, separators=(",", ":")))
        return status, body, headers


def _query_tool(registry: Registry, name: str) -> Tool:
    spec = registry.get(name)
    return Tool(name=name, description=f"[{spec.category}] {spec.description}", input_schema=spec.input_schema(),
                scope=spec.scope,
                handler=lambda state, arguments, caller: executor.run(state, registry, name, arguments, caller))


def build_tools(registry: Registry, service) -> ToolRegistry:
    """Every registered query as a tool, plus the query layer's own and other areas' tools.
    `service` is the QueryService (MeshQL, NL) of this app."""
    tools = [_query_tool(registry, name) for name in sorted(registry.queries)]
    tools.append(Tool(
        "meshql", "Parse a MeshQL statement (e.g. SHOW HANGS LAST 1h) and, unless execute is false, run it.",
        {"type": "object", "properties": {"query": {"type": "string", "maxLength": 2000},
                                          "execute": {"type": "boolean", "default": True}},
         "required": ["query"], "additionalProperties": False},
        lambda state, args, caller: service.meshql(state, args.get("query"), args.get("execute", True), caller)))
    tools.append(Tool(
        "ask", "Answer an operator's question in plain language with the registered query it means.",
        {"type": "object", "properties": {"message": {"type": "string", "maxLength": 2000},
                                          "execute": {"type": "boolean", "default": True}},
         "required": ["message"], "additionalProperties": False},
        lambda state, args, caller: service.ask(state, args.get("message"), execute=args.get("execute", True),
                                                caller=caller)))
    tools.append(Tool(
        "list_queries", "The registered queries by category, with their parameters.",
        {"type": "object", "properties": {}, "additionalProperties": False},
        lambda state, args, caller: {"queries": registry.catalog()}))
    return ToolRegistry(tools)
