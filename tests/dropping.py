"""An HTTP backend whose connections can be dropped: the toy served over streamable HTTP, and a
TCP relay in front of it that cuts the connection carrying a marked call once the server has run
it, while the server stays up.

`toy_over_http(record_file)` serves the toy (`tests/fixtures/toy_server.py`, its ledger in
`record_file`) on a free port; `Cutter(port, marker)` relays a free port to it and, for the one
connection whose request carries `marker`, holds back the server's answer until it has arrived
(so the backend's ledger has the call), then forwards nothing (`cut="before"`: the connection ends
before any response byte), only the response's headers (`cut="after-headers"`), or the answer up
to the marker (`cut="mid-answer"`: the JSON body or the SSE event ends midway), and closes both
sides. Every other connection is relayed as it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import anyio
from anyio.abc import SocketStream

from mcp_spec_proxy.fronts.asgi import serve_asgi
from tests.fixtures import toy_server

Cut = Literal["before", "after-headers", "mid-answer"]


@asynccontextmanager
async def toy_over_http(record_file: Path, *, json_response: bool) -> AsyncIterator[int]:
    """The toy on streamable HTTP at `http://127.0.0.1:PORT/mcp`; yields PORT."""
    app = toy_server.build(record_file).streamable_http_app(json_response=json_response)
    async with anyio.create_task_group() as tg:
        port: int = await tg.start(lambda task_status: serve_asgi(app, "127.0.0.1", 0, task_status=task_status))
        yield port
        tg.cancel_scope.cancel()


class Cutter:
    """A TCP relay that drops the connection of the request carrying `marker`, once answered."""

    def __init__(self, upstream: int, marker: bytes = b"", *, cut: Cut = "before", port: int = 0) -> None:
        self.upstream = upstream
        self.port = port  # 0: a free one
        self.marker = marker
        self.cut = cut
        self.cuts = 0
        self.cut_done = anyio.Event()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        async with listener:
            task_status.started(int(listener.extra(anyio.abc.SocketAttribute.local_port)))
            await listener.serve(self._relay)

    async def _relay(self, client: SocketStream) -> None:
        try:
            async with client, await anyio.connect_tcp("127.0.0.1", self.upstream) as server:
                doomed = anyio.Event()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._up, client, server, doomed)
                    await self._down(server, client, doomed)
                    tg.cancel_scope.cancel()
        except* (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # either side went away: so does the relayed connection

    async def _up(self, client: SocketStream, server: SocketStream, doomed: anyio.Event) -> None:
        seen = b""
        async for chunk in client:
            seen = (seen + chunk)[-(len(chunk) + len(self.marker)) :]
            if self.marker and self.marker in seen and self.cuts == 0:
                self.cuts += 1
                doomed.set()
            await server.send(chunk)

    async def _down(self, server: SocketStream, client: SocketStream, doomed: anyio.Event) -> None:
        held = b""
        try:
            async for chunk in server:
                if not doomed.is_set():
                    await client.send(chunk)
                    continue
                held += chunk
                if self.marker in held:  # the server has answered the marked call: it ran
                    if self.cut == "after-headers":
                        await client.send(held[: held.index(b"\r\n\r\n") + 4])
                    elif self.cut == "mid-answer":  # half the answer: inside its JSON body or SSE event
                        await client.send(held[: held.index(self.marker)])
                    return
        finally:
            if doomed.is_set():
                self.cut_done.set()
