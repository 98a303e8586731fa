"""What a backend asks the client during a handshake-era read on the lean HTTP lane.

On the SDK's path a backend's question inside a call (`roots/list`, sampling, elicitation) is a
request to the client on the stream of the POST that made the call: the session's dispatcher sends
it with the call as its related request, the transport's router stores it under that request's
stream and writes it there, and the client's answer, POSTed on its session, settles it in that
session's dispatcher. The lane keeps exactly that, and opens the stream only when it is needed:

* a read whose backend asks nothing is answered whole, as before (`AskingAnswer.settle` says so);
* at the first question the lane registers the request's stream with the transport (so the router
  delivers there what the session sends for this request), writes the SSE response's head and its
  priming event as the transport would, and from then on writes each event the router delivers;
  the read's answer, stored like the router stores it, is the stream's last event;
* while the stream is open it sends the transport's keep-alive comment every `PING_S` (the SDK's
  15 s), so a proxy's idle-read timeout does not close it while a question waits for its client.

A question so goes to this request's stream only, which only this client holds open, and its answer
is settled only by this session's dispatcher: no other client hears it or can answer it. A session
the manager answers in JSON keeps the SDK's path, which has no wire for such a question either.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.connection import Connection
from mcp.server.streamable_http import REQUEST_CANCELLED, EventMessage, StreamableHTTPServerTransport
from mcp.shared.exceptions import MCPError
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse, RequestId
from sse_starlette.event import ServerSentEvent, ensure_bytes
from starlette.types import Send

from mcp_spec_proxy.fronts.relay import Asked, Audit, Passthrough, server_request, unanswered
from mcp_spec_proxy.sdk import ask_related, close_request_stream, event_data, open_request_stream, priming_event, stored

_SSE_SEP = "\r\n"
PING_S: float = 15
"""How often an open stream sends its keep-alive comment: the SDK's (`EventSourceResponse.DEFAULT_PING_INTERVAL`)."""


class AskingAnswer:
    """The HTTP answer of one lean read: whole at the end, or an SSE stream from its first question.

    The stream's writer runs in `host`, a task group around the read (None: a client that cannot be asked)."""

    def __init__(
        self,
        transport: StreamableHTTPServerTransport,
        send: Send,
        request_id: RequestId,
        version: str,
        headers: list[tuple[bytes, bytes]],
        host: anyio.abc.TaskGroup | None,
    ) -> None:
        self._transport = transport
        self._send = send
        self.request_id = request_id
        self._stream = str(request_id)  # the transport's key for the request's stream
        self._version = version  # the one the request's header names: the priming event follows it
        self._headers = headers
        self._host = host
        self._events: MemoryObjectSendStream[EventMessage] | None = None
        self._opening = anyio.Lock()
        self._sending = anyio.Lock()
        self._settled = False  # the read has its answer: no stream opens from now on

    async def open(self) -> bool:
        """Start the SSE answer (once): its head and priming event, then what the router delivers.

        False: the read has ended (`settle`) with its stream unopened; its answer goes whole, and
        nothing may be asked on it. Once the head is on the wire the stream is set up whole, shielded:
        a cancel of the read half way would leave a started response that nothing ends."""
        async with self._opening:
            if self._events is not None or self._settled:
                return not self._settled
            assert self._host is not None, "a read whose client cannot be asked has no stream to open"
            with anyio.CancelScope(shield=True):
                priming = await priming_event(self._transport, self._stream, self._version)
                pair = open_request_stream(self._transport, self._stream)
                try:
                    await self._send({"type": "http.response.start", "status": 200, "headers": self._headers})
                    if priming is not None:
                        await self._chunk(ensure_bytes(priming, _SSE_SEP))
                except BaseException:
                    close_request_stream(self._transport, self._stream, pair)
                    raise
                self._events = pair[0]
                self._host.start_soon(self._write, pair)
            return True

    async def settle(self, message: JSONRPCMessage) -> bool:
        """The read's answer: the stream's last event where the stream opened (True; the writer ends
        the response with it), else False and the caller writes it whole. An opening under way is
        waited for, and none begins after: the response has one writer."""
        if self._opening.locked():  # (most reads never open one: they pass without a checkpoint)
            async with self._opening:
                pass
        self._settled = True
        if self._events is None:
            return False
        event = await stored(self._transport, self._stream, message)
        await self._events.send(event)
        return True

    async def _write(
        self, pair: tuple[MemoryObjectSendStream[EventMessage], MemoryObjectReceiveStream[EventMessage]]
    ) -> None:
        try:
            async with anyio.create_task_group() as pings:
                pings.start_soon(self._ping)
                async for event in pair[1]:
                    await self._chunk(ensure_bytes(event_data(self._transport, event), _SSE_SEP))
                    if (
                        isinstance(event.message, JSONRPCResponse | JSONRPCError)
                        and event.message.id == self.request_id
                    ):
                        break
                pings.cancel_scope.cancel()
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            close_request_stream(self._transport, self._stream, pair)

    async def _ping(self) -> None:
        """The keep-alive comment the transport's `EventSourceResponse` sends every `PING_S` while
        its stream is open, so a proxy's idle-read timeout does not close it under a waiting question."""
        while True:
            await anyio.sleep(PING_S)
            comment = ServerSentEvent(comment=f"ping - {datetime.now(UTC)}", sep=_SSE_SEP)
            await self._chunk(ensure_bytes(comment, _SSE_SEP))

    async def _chunk(self, body: bytes) -> None:
        async with self._sending:  # a ping and an event never interleave (sse-starlette's `_send_lock`)
            await self._send({"type": "http.response.body", "body": body, "more_body": True})


@dataclass
class LaneLink:
    """A handshake-era client asked on the stream of the lean read its call came in (`AskingAnswer`)."""

    client: object
    connection: Connection
    answer: AskingAnswer
    audit: Audit
    ttl: float
    asked: Asked

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self.connection.client_capabilities

    async def relay(self, server: str, method: str, params: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
        with self.asked.one(self.client, method):
            await self.audit(server, method)
            data = server_request(method, params).model_dump(by_alias=True, mode="json", exclude_none=True)
            if not await self.answer.open():
                raise MCPError(REQUEST_CANCELLED, f"the call that asked {method} has ended; its client was not asked")
            version = self.connection.protocol_version
            try:
                with anyio.fail_after(self.ttl):
                    result = await ask_related(
                        self.connection, self.answer.request_id, version, method, data.get("params")
                    )
            except TimeoutError:
                raise unanswered(method, self.ttl) from None
        dumped: dict[str, Any] = Passthrough.model_validate(result, by_name=False).model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
        return dumped


__all__ = ["PING_S", "AskingAnswer", "LaneLink"]
