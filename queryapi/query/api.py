"""HTTP endpoints of the query layer.

    GET  /ai/query/catalog           registered queries by category (open, like the probes)
    GET  /ai/query/parameters        extraction preview: what a question would run
    POST /ai/query/conversation      NL question in a session (10 turns, 30 min idle)
    POST /queries/meshql             MeshQL; 422 with position and expected tokens
    GET  /chat/status                the LLM provider in use (open)
    GET  /api/v1/tools/list          the tool registry (same as MCP tools/list)
    POST /api/v1/tools/<name>        call a tool (same as MCP tools/call)
    POST /mcp                        MCP streamable HTTP over the same tools
"""
from __future__ import annotations

from typing import Any

from apiflask import APIBlueprint
from flask import Response, request
from pydantic import BaseModel, Field

from ..auth import current_key, open_endpoint, require_scope
from ..context import sidecar
from ..errors import ApiError
from .calls import Caller
from .mcp_bridge import REQUEST_TIMEOUT as MCP_TIMEOUT, McpBridge
from .service import QueryService
from .tools import ToolRegistry, build_tools, classify

bp = APIBlueprint("query", __name__, tag="Query")


class ConversationIn(BaseModel):
    message: str = Field(min_length=1, max_length=2000)
    session_id: str | None = Field(None, max_length=64)


class MeshQLIn(BaseModel):
    query: str = Field(max_length=2000)
    execute: bool = True


class QueryArea:
    """The query layer of a running sidecar: the service, its tool registry, MCP."""

    def __init__(self, service: QueryService, tools: ToolRegistry, bridge: McpBridge) -> None:
        self.service, self.tools, self.bridge = service, tools, bridge


def _query() -> QueryArea:
    return sidecar().query


def setup(app, state) -> None:
    from ..probes import full_version
    service = QueryService()
    state.query = QueryArea(service, build_tools(service.registry, service), McpBridge("fabricscope", full_version()))
    state.capabilities.update({"query_catalog", "meshql", "nl_query", "tools_endpoint", "mcp"})


def _caller() -> Caller:
    return Caller(current_key())


def _run(function, *args) -> Any:
    """Call a query-layer operation; its failures leave as the same JSON errors the tool
    endpoints return (classify). An unexpected exception stays one: the sidecar's 500."""
    try:
        return function(*args)
    except Exception as exc:
        error = classify(exc)
        if error.code == "internal_error":
            raise
        raise ApiError(error.status, error.message, code=error.code, detail=error.detail,
                       headers=error.headers or None) from None


@bp.get("/ai/query/catalog")
@open_endpoint
@bp.doc(summary="Registered queries sorted by category, with their parameters (no key needed)")
def catalog():
    return _query().service.registry.catalog()


@bp.get("/ai/query/parameters")
@require_scope("read")
@bp.doc(summary="Preview parameter extraction and the matched query for a question, without running it")
def parameters():
    return _run(_query().service.parameters, sidecar(), request.args.get("message"), _caller())


@bp.post("/ai/query/conversation")
@require_scope("read")
@bp.input(ConversationIn)
@bp.doc(summary="Ask in plain language; follow-ups resolve against the session's previous turn")
def conversation(json_data: ConversationIn):
    return _run(_query().service.conversation, sidecar(), json_data.message, json_data.session_id, _caller())


@bp.post("/queries/meshql")
@require_scope("read")
@bp.input(MeshQLIn)
@bp.doc(summary="Run (or with execute=false only parse) a MeshQL statement")
def meshql(json_data: MeshQLIn):
    return _run(_query().service.meshql, sidecar(), json_data.query, json_data.execute, _caller())


@bp.get("/chat/status")
@open_endpoint
@bp.doc(summary="The LLM provider in use, if any (no key needed; never shows a key)")
def chat_status():
    return _query().service.chat_status()


@bp.get("/api/v1/tools/list")
@require_scope("read")
@bp.doc(summary="The tool catalog (the same tools MCP lists)")
def tools_list():
    return {"tools": _query().tools.listing()}


@bp.post("/api/v1/tools/<name>")
@require_scope("read")
@bp.doc(summary="Call a tool with a JSON object of arguments (the same call as MCP tools/call)")
def tools_call(name: str):
    if request.content_length and request.mimetype != "application/json":
        raise ApiError(415, "send the tool arguments as application/json", code="unsupported_media_type")
    arguments = request.get_json(silent=True) if request.content_length else {}
    if arguments is None:
        raise ApiError(400, "the body is not valid JSON", code="bad_request")
    status, body, headers = _query().tools.call(sidecar(), name, arguments, current_key(), "http")
    if status >= 400:
        error = body["error"]
        raise ApiError(status, error["message"], code=error["code"], detail=error["detail"], headers=headers or None)
    return body


# POST only: the transport runs stateless with JSON answers, so there is no standalone SSE
# stream to GET and no session to DELETE (405 for both, as the MCP spec allows).
@bp.route("/mcp", methods=["POST"])
@require_scope("read")
@bp.doc(summary="MCP streamable HTTP transport over the same tool registry", hide=True)
def mcp():
    query = _query()
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in ("authorization", "x-api-key")]
    try:
        status, response_headers, body = query.bridge.handle(
            request.method, "/mcp", request.query_string, headers, request.get_data(cache=False),
            (request.remote_addr or "", 0), {"state": sidecar(), "key": current_key(), "tools": query.tools})
    except TimeoutError:
        raise ApiError(504, f"the MCP request did not finish within {MCP_TIMEOUT:g}s", code="upstream_timeout") \
            from None
    response = Response(body, status=status)
    for key, value in response_headers:
        if key.lower() not in ("content-length", "transfer-encoding", "connection"):
            response.headers[key] = value
    return response
