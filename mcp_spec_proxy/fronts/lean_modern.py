"""How a 2026-07-28 read on the lean HTTP lane is answered: as the SDK's single-exchange writer answers it.

The SDK's 2026-07-28 entry, on a front that answers SSE (`json_response` off), defers committing
to `text/event-stream` for `_SSE_PING_INTERVAL`: a request answered within that window gets a
plain JSON body with the status its table maps an error to; one still running then gets the SSE
head, a `: ping` comment at once and another every interval, and its answer as one `message`
event at the end, so a proxy's idle-read timeout does not close a slow read. The lane answers the
same way (`LeanAnswers.write`), without the SDK's task per request: the read runs in the request's
own task, and only a read that outlasts the window is given a pinger, started then in the task
group the front hosts while it serves (`LeanAnswers.hosting`). An answer and a ping never
interleave, and the answer is the stream's last bytes. Where no front hosts one (an app served
without `serve_http`), a read gets a task group of its own, as on the SDK's path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import anyio
import anyio.abc
from mcp_types import JSONRPCError, JSONRPCResponse, RequestId
from starlette.types import Message, Receive, Scope, Send

from mcp_spec_proxy.fronts.hosting import Host
from mcp_spec_proxy.sdk import MODERN_SSE_HEADERS, modern_answer, modern_sse_event, modern_write

PING_S: float = 15.0
"""The deferral window, and the interval of the pings after it: the SDK's (`_SSE_PING_INTERVAL`)."""
PING = b": ping\r\n\r\n"
WATCH_S: float = 1.0
"""How long a read runs before the lane watches for its client to leave: a task from then on, from the
front's host (most reads end sooner and never need one); a client gone cancels its read, backend and
all, as the SDK's path cancels a request whose client disconnected."""

Answer = JSONRPCResponse | JSONRPCError


class LeanAnswers:
    """Where the lane's 2026-07-28 reads are answered: see the module docstring."""

    def __init__(self) -> None:
        self._tasks = Host()
        self.hosting = self._tasks.hosting  # while the front serves: the pingers of reads that outlast the window

    async def write(
        self,
        request_id: RequestId,
        run: Awaitable[dict[str, Any]],
        sse: bool,
        exchange: tuple[Scope, Receive, Send],
    ) -> None:
        """`run`'s answer to request `request_id` on the request's `exchange`: a JSON body, or (`sse`:
        the front answers SSE) one that outlasts the window as the SDK's SSE stream; nothing where
        the client left first (watched past `WATCH_S`)."""
        scope, receive, send = exchange
        host = self._tasks.group
        answering = _unless_gone(modern_answer(request_id, run), receive, host)
        if not sse:
            message = await answering
            if message is not None:
                await modern_write(message, scope, _no_receive, send)
            return
        pings = _Pings(send)
        if host is not None:
            await pings.run(host, answering, scope)
            return
        async with anyio.create_task_group() as own:
            await pings.run(own, answering, scope)


async def _unless_gone(
    answering: Awaitable[Answer], receive: Receive, host: anyio.abc.TaskGroup | None
) -> Answer | None:
    """What `answering` gives; None where the client left first: past `WATCH_S` a watcher in `host`
    waits for the disconnect and cancels the read. No host (a front not serving): not watched."""
    if host is None:
        return await answering
    watch = anyio.CancelScope()
    with anyio.CancelScope() as read:

        async def watching() -> None:
            with watch:
                while (await receive())["type"] != "http.disconnect":
                    pass
                read.cancel()

        timer = asyncio.get_running_loop().call_later(WATCH_S, host.start_soon, watching)
        try:
            return await answering
        finally:
            timer.cancel()
            watch.cancel()
    return None


class _Pings:
    """One read's answer once it outlasts the window: the SSE head, the pings, the last event."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._sending: anyio.Lock | None = None  # made by the pinger: most reads never need one
        self._scope: anyio.CancelScope | None = None
        self._committed = False  # the SSE head is out: the answer is its last event
        self._answered = False  # no ping may follow

    async def run(self, host: anyio.abc.TaskGroup, answering: Awaitable[Answer | None], scope: Scope) -> None:
        """Answer with what `answering` gives; past `PING_S`, pinging from `host` meanwhile (a timer
        until then, not a task: most reads end well before)."""
        timer = asyncio.get_running_loop().call_later(PING_S, host.start_soon, self._ping)
        try:
            message = await answering
        finally:
            timer.cancel()
            await self._stop()
        if message is None:  # the client left: no one to answer
            return
        if not self._committed:
            await modern_write(message, scope, _no_receive, self._send)
            return
        await self._send({"type": "http.response.body", "body": modern_sse_event(message), "more_body": False})

    async def _stop(self) -> None:
        """No ping from now on: one on the wire is waited for (the answer follows it)."""
        if self._sending is not None and self._sending.locked():
            with anyio.CancelScope(shield=True):
                async with self._sending:
                    self._answered = True
        self._answered = True
        if self._scope is not None:
            self._scope.cancel()

    async def _ping(self) -> None:
        sending = self._sending = anyio.Lock()
        with anyio.CancelScope() as self._scope:
            while True:
                async with sending:
                    if self._answered:
                        return
                    if not self._committed:
                        await self._send({"type": "http.response.start", "status": 200, "headers": MODERN_SSE_HEADERS})
                        self._committed = True
                    await self._send({"type": "http.response.body", "body": PING, "more_body": True})
                await anyio.sleep(PING_S)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


__all__ = ["PING", "PING_S", "LeanAnswers"]
