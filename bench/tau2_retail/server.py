"""The retail MCP server: the 16 tools over stdio, on a private copy of the DB, one process per task.

Promises:

- Tools are listed with their input schemas and annotations: reads and `calculate` are
  `readOnlyHint: true`; the seven writes and `transfer_to_human_agents` (it ends the
  conversation, so a proxy must hold it) are `readOnlyHint: false`.
- A failed call is an `isError` result whose text is `Error: <message>`, the message TOOLS.md
  quotes. Records come back as JSON text, plain strings as they are.
- Calls run one at a time, in arrival order, so the DB a call sees is the one its predecessors
  left.
- With a state file, the end state is always readable there: it is written once before the
  server answers anything, then after every call of a mutating tool (failed ones too: a failed
  cancel can credit gift cards), each time atomically (a temporary file renamed over it), and
  before the call's result is sent. Its content is one JSON object:
  `{"hash": <DB hash>, "mutating_calls": <n>, "db": <canonical DB>}`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server

from bench.tau2_retail.catalogue import TOOLS, ToolSpec, call_tool
from bench.tau2_retail.db import Db, canonical_json, hash_text
from bench.tau2_retail.tools import ToolError, error_text, render

SERVER_NAME = "tau2-retail"
Ctx = ServerRequestContext[Any, Any]


@dataclass(frozen=True)
class EndState:
    """What a state file holds."""

    hash: str
    mutating_calls: int
    db: Db


def read_state(path: Path) -> EndState:
    """Read a state file the server wrote."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return EndState(hash=data["hash"], mutating_calls=data["mutating_calls"], db=data["db"])


def write_state(path: Path, db: Db, mutating_calls: int) -> str:
    """Write `db` to the state file atomically; returns its hash."""
    text = canonical_json(db)
    digest = hash_text(text)
    payload = f'{{"hash": "{digest}", "mutating_calls": {mutating_calls}, "db": {text}}}'
    # Same folder, so the rename is atomic; readers see the old state or the new, never half.
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return digest


def tool_annotations(spec: ToolSpec) -> types.ToolAnnotations:
    if spec.kind == "read" or spec.name == "calculate":
        return types.ToolAnnotations(read_only_hint=True, open_world_hint=False)
    if spec.kind == "write":
        return types.ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False
        )
    # transfer_to_human_agents: changes no data, but hands the conversation to people.
    return types.ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)


def definitions() -> list[types.Tool]:
    return [
        types.Tool(
            name=spec.name,
            description=spec.description,
            input_schema=spec.input_schema(),
            annotations=tool_annotations(spec),
        )
        for spec in TOOLS.values()
    ]


class RetailServer:
    """One task's retail environment behind an MCP `Server`."""

    def __init__(self, db: Db, state_out: Path | None = None) -> None:
        self.db = db
        self.state_out = state_out
        self.mutating_calls = 0
        self._lock = anyio.Lock()
        self._tools = definitions()
        self.server: Server[Any] = Server(SERVER_NAME, on_list_tools=self._list_tools, on_call_tool=self._call_tool)

    async def save(self) -> None:
        if self.state_out is not None:
            await anyio.to_thread.run_sync(write_state, self.state_out, self.db, self.mutating_calls)

    async def _list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._tools)

    async def _call_tool(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        async with self._lock:
            try:
                text, failed = render(call_tool(self.db, params.name, params.arguments or {})), False
            except ToolError as exc:
                text, failed = error_text(exc), True
            spec = TOOLS.get(params.name)
            if spec is not None and spec.mutating:
                self.mutating_calls += 1
                await self.save()
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    async def serve_stdio(self) -> None:
        await self.save()
        async with stdio_server() as (read, write):
            await self.server.run(read, write, self.server.create_initialization_options())
