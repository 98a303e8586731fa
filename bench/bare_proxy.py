"""The baseline for bench/overhead.py: a bare pass-through MCP proxy on the `mcp` SDK alone.

    python bench/bare_proxy.py [--http PORT] -- <command> <args...>
    python bench/bare_proxy.py [--http PORT] --url <streamable HTTP URL>

Connects to ONE stdio (or streamable HTTP) backend (`mode="auto"`: whichever era it speaks) and serves it with the
SDK's low-level `Server`, over stdio or (with `--http`) streamable HTTP on 127.0.0.1:PORT/mcp,
forwarding tools/list and tools/call as they come: no namespacing, no catalog, no validation,
no review. What a hop costs when it does nothing else.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp import Client, StdioServerParameters
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server


async def serve(argv: list[str], port: int | None, url: str | None = None) -> None:
    leg: StdioServerParameters | str = url if url is not None else StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(leg, mode="auto") as backend:

        async def list_tools(
            ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return await backend.list_tools(cursor=params.cursor if params else None)

        async def call_tool(
            ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            return await backend.call_tool(params.name, params.arguments)

        server: Server[Any] = Server("bare-proxy", on_list_tools=list_tools, on_call_tool=call_tool)
        if port is not None:
            app = server.streamable_http_app(host="127.0.0.1")
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
            await uvicorn.Server(config).serve()
            return
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def main() -> None:
    argv = sys.argv[1:]
    port = None
    if argv[:1] == ["--http"]:
        port, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--url"] and len(argv) == 2:
        anyio.run(serve, [], port, argv[1])
        return
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: bare_proxy.py [--http PORT] (-- <command> <args...> | --url URL)")
    anyio.run(serve, argv, port)


if __name__ == "__main__":
    main()
