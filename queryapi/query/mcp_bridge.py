"""MCP (streamable HTTP) at /mcp, inside the Flask sidecar.

The `mcp` SDK's server is ASGI; the sidecar is WSGI. The Flask route at
/mcp runs the sidecar's auth -> audit -> rate-limit pipeline like any endpoint, then hands
the request to the SDK's StreamableHTTPSessionManager (stateless, JSON responses) on an
event loop owned by the sidecar process. Tool calls come back to `ToolRegistry.call`, the
same function POST /api/v1/tools/<name> uses, with the caller's key, so both transports
answer alike.
"""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

CALL_KEY = "fabricscope.call"   # ASGI scope entry carrying (state, key, tool registry)
REQUEST_TIMEOUT = 60.0


class McpBridge:
    def __init__(self, name: str, version: str) -> None:
        self.server = Server(name, version=version, on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        self._manager: StreamableHTTPSessionManager | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._lock = threading.Lock()

    # -- MCP handlers ------------------------------------------------------------------
    @staticmethod
    def _call(ctx) -> dict[str, Any]:
        return ctx.request.scope[CALL_KEY]

    async def _list_tools(self, ctx, params) -> types.ListToolsResult:
        call = self._call(ctx)
        return types.ListToolsResult(tools=[
            types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
            for t in call["tools"].listing()])

    async def _call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        call = self._call(ctx)
        status, body, _ = await anyio.to_thread.run_sync(
            lambda: call["tools"].call(call["state"], params.name, params.arguments, call["key"], "mcp"))
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(body))],
                                    structured_content=body, is_error=status >= 400)

    # -- event loop of this process ----------------------------------------------------
    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is not None:
                return self._loop
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True)

            async def serve() -> None:
                self._stopped = asyncio.Event()
                async with manager.run():
                    ready.set()
                    await self._stopped.wait()

            thread = threading.Thread(target=loop.run_forever, name="mcp-loop", daemon=True)
            thread.start()
            asyncio.run_coroutine_threadsafe(serve(), loop)
            if not ready.wait(10):
                raise RuntimeError("the MCP session manager did not start")
            self._loop, self._manager = loop, manager
            return loop

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None and self._stopped is not None:
                self._loop.call_soon_threadsafe(self._stopped.set)
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None

    def handle(self, method: str, path: str, query_string: bytes, headers: list[tuple[str, str]], body: bytes,
               client: tuple[str, int] | None, call: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        """One HTTP exchange through the SDK: (status, headers, body)."""
        loop = self._ensure_started()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
            "query_string": query_string, "client": client, "server": ("127.0.0.1", 0),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            CALL_KEY: call,
        }
        response: dict[str, Any] = {"status": 500, "headers": [], "body": bytearray()}

        async def exchange() -> None:
            delivered = False
            done = asyncio.Event()

            async def receive() -> dict[str, Any]:
                nonlocal delivered
                if not delivered:
                    delivered = True
                    return {"type": "http.request", "body": body, "more_body": False}
                await done.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    response["status"] = message["status"]
                    response["headers"] = [(k.decode("latin-1"), v.decode("latin-1"))
                                           for k, v in message.get("headers", [])]
                elif message["type"] == "http.response.body":
                    response["body"] += message.get("body", b"")
                    if not message.get("more_body"):
                        done.set()

            await self._manager.handle_request(scope, receive, send)
            done.set()

        asyncio.run_coroutine_threadsafe(exchange(), loop).result(REQUEST_TIMEOUT)
        return response["status"], response["headers"], bytes(response["body"])
