"""The MCP front over stdio: one client on this process's stdin and stdout, one session.

`serve_stdio(front)` serves until the client closes stdin. As the SDK's stdio server does, fd 0
and 1 point elsewhere while serving (`sdk.claimed_stdio`). Unlike it, a line that is not a valid
JSON-RPC message is answered (`malformed_answer`: -32700 or -32600, with the request's id where
one can be read) instead of leaving the client to wait forever on that id.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR

from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.sdk import claimed_stdio


async def serve_stdio(front: McpFront) -> None:
    """Serve one client on this process's stdin/stdout until it closes them.

    As the SDK's stdio server does, fd 0 and 1 point elsewhere while serving (stray prints and
    children cannot touch the wire). Unlike it, a line that is not a valid message is answered
    (JSON-RPC 2.0: -32700 or -32600, with the request's id where one can be read) instead of
    leaving the client to wait forever on that id.
    """
    front.stdio_session = front.proxy.barrier.new_session()
    with claimed_stdio() as (wire_in, wire_out):
        lines = _RecordedLines(anyio.wrap_file(wire_in))
        async with stdio_server(stdin=cast(Any, lines), stdout=anyio.wrap_file(wire_out)) as (read, write):
            answering = _AnswerMalformed(read, write, lines.taken)
            await front.server.run(answering, write, front.server.create_initialization_options())


class _RecordedLines:
    """Lines of stdin as the SDK reads them, kept until the matching message is taken."""

    def __init__(self, file: anyio.AsyncFile[str]) -> None:
        self._file = file
        self.taken: deque[str] = deque()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._file:
            self.taken.append(line)
            yield line


class _AnswerMalformed:
    """The server's read stream; a line that failed to parse gets its JSON-RPC error answered."""

    def __init__(self, inner: Any, write: Any, lines: deque[str]) -> None:
        self._inner = inner
        self._write = write
        self._lines = lines

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            line = self._lines.popleft() if self._lines else ""
            if not isinstance(item, Exception):
                return item
            error = malformed_answer(line)
            if error is not None:
                await self._write.send(SessionMessage(error))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _AnswerMalformed:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _AnswerMalformed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.aclose()


_ANY_ID = re.compile(r'"id"\s*:\s*(-?\d{1,19}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')


def malformed_answer(line: str) -> types.JSONRPCError | None:
    """The JSON-RPC error a line that is not a valid message deserves, or None (a notification)."""
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        # JSON-RPC 2.0: when the id cannot be detected (a parse error), the answer's id is null.
        return types.JSONRPCError(
            jsonrpc="2.0", id=None, error=types.ErrorData(code=PARSE_ERROR, message="Parse error")
        )
    except (RecursionError, ValueError) as exc:
        # Nested too deep, or an integer past Python's digit limit: the id may still be legible.
        found = _ANY_ID.search(line[:4096])
        request_id = json.loads(found.group(1)) if found else None
        why = "nested too deep" if isinstance(exc, RecursionError) else "a number is too long"
        return types.JSONRPCError(
            jsonrpc="2.0", id=request_id, error=types.ErrorData(code=INVALID_REQUEST, message=f"Invalid Request: {why}")
        )
    if isinstance(data, dict) and "method" in data and "id" not in data:
        return None  # a malformed notification: nobody waits for an answer
    raw_id = data.get("id") if isinstance(data, dict) else None
    request_id = (
        raw_id if isinstance(raw_id, str) or (isinstance(raw_id, int) and not isinstance(raw_id, bool)) else None
    )
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a valid JSON-RPC 2.0 message"),
    )
