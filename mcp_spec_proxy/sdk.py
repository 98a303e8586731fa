"""The one door to the `mcp` SDK's private names: an SDK release that moves them breaks this file only.

The rest of the package imports the SDK's public API directly; what it needs from underscored
modules or names comes from here, each under a public alias, with the reason it is used:

* `mcp.client._transport.Transport` / `TransportStreams`, `mcp.shared._stream_protocols.ReadStream`:
  the types of a client transport and its streams. `backends/transports.py` wraps the read side
  to learn the moment a backend's stream ends; `backends/stdio.py` yields the same pair.
* `mcp.shared._httpx_utils.MCP_DEFAULT_TIMEOUT`, `MCP_DEFAULT_SSE_READ_TIMEOUT`: the timeouts of
  the httpx client the SDK's own streamable HTTP transport would build (`create_mcp_http_client`),
  given to the proxy's own (`backends/http.py`) as `MCP_HTTP_TIMEOUT`.
* `mcp.client.stdio._create_platform_compatible_process`, `_drain_stdout`, `_parse_line`,
  `_stop_server_process`: the SDK's spawn (own process group), line parsing and bounded, shielded
  shutdown, so `backends/stdio.py`'s size-bounded stdio client behaves as the SDK's in all else.
* `mcp.server.stdio._claim_fd`, `_open_stdin_diversion`, `_open_stdout_diversion`: the SDK
  stdio server's claim of fd 0 and 1 (stray prints and children cannot touch the wire), which
  `fronts/stdio.py` needs because it serves the pipes itself (on the event loop, not in worker
  threads; answering malformed lines) instead of running `stdio_server` (`claimed_stdio`).
* `ServerSession._connection`: a handler's `Connection` (its per-connection state, its session id,
  its outbound channel for notifications). The SDK hands it to handlers only through the session;
  `Context.connection` exists but is not what the request runner fills in yet (`server_connection`).
* `StreamableHTTPSessionManager._admit_session`, `StreamableHTTPServerTransport._event_store`: the
  manager hands every session's transport one shared event store, whose calls do not say which
  session they are for; `fronts/http.py` binds SSE resumption to the session that owns the stream,
  so each new session's transport gets a store of its own (`event_store_per_session`).
* `ClientSession._stamp`: what the client adds to each request for the era it negotiated (the
  2026-07-28 `_meta` envelope: protocol version, client info, capabilities). The fast path's
  reads (`backends/raw.py`) are written past the client and need the same envelope (`stamp_request`);
  and the capabilities in it follow the calling client, request by request (`restamp_capabilities`).
* `ClientSession._on_notify`, `_on_request`: what the session does with a server's notification or
  request its transport read. The lean HTTP reads (`backends/lean_http.py`) read a POST's answer
  themselves, and give what else the server sent on it to the session (`deliver_notification`,
  `answer_server_request`), so its handlers and callbacks hear it as they would.
* `StreamableHTTPSessionManager._handle_request`, `_server_instances`, `_session_owners` and a
  transport's `_event_store`, `_mint_priming_event`, `_create_event_data`, `_idle_timeout`,
  `_requests_in_flight`: `fronts/lean_http.py` answers a handshake-era read on an established session
  itself, so it finds the session's transport and owner as the manager does, holds the session
  against its idle timeout as the transport does, and — where the read's backend asks the client
  something — writes the priming, question and answer events the transport would write (stored for
  resumption alike). `mcp.server._streamable_http_modern._write`
  and `_to_jsonrpc_response`: a 2026-07-28 read answered with the SDK's own bytes and status; its
  `_SSE_HEADERS` and `_sse_event`: one that outlasts the SDK's deferral window, as its SSE stream.
* A transport's `_request_streams` and the dispatcher's `send_raw_request(_related_request_id=)`: a
  lean read whose backend asks the client something opens the read's SSE stream as the transport
  would, registers it where the transport's router delivers what the session sends for a request
  (`open_request_stream`), and asks on it as a handler's own request context does (`ask_related`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from types import SimpleNamespace
from typing import Any, BinaryIO, cast

import anyio
import httpx2
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import Transport, TransportStreams
from mcp.client.client import Client
from mcp.client.stdio import _create_platform_compatible_process as create_platform_compatible_process
from mcp.client.stdio import _drain_stdout as drain_stdout
from mcp.client.stdio import _parse_line as parse_line
from mcp.client.stdio import _stop_server_process as stop_server_process
from mcp.server._streamable_http_modern import _SSE_HEADERS as MODERN_SSE_HEADERS
from mcp.server._streamable_http_modern import _sse_event as modern_sse_event
from mcp.server._streamable_http_modern import _to_jsonrpc_response as modern_answer
from mcp.server._streamable_http_modern import _write as modern_write
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _open_stdout_diversion
from mcp.server.streamable_http import (
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    EventStore,
    SSEEvent,
    StreamableHTTPServerTransport,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared._stream_protocols import ReadStream
from mcp_types import CLIENT_CAPABILITIES_META_KEY, JSONRPCMessage, RequestId
from mcp_types.methods import validate_client_result
from starlette.types import ASGIApp

from mcp_spec_proxy.wire_types import RpcRequest

MCP_HTTP_TIMEOUT = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)


@contextmanager
def claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """The wire's stdin and stdout (binary), while fd 0 and 1 point elsewhere; restored on exit.

    Best-effort as in the SDK: where descriptors cannot be diverted, the sys streams' buffers
    are served in place (then the files yielded are `sys.stdin.buffer` and `sys.stdout.buffer`).
    Closing a claimed duplicate never closes its descriptor.
    """
    with ExitStack() as releases:
        wire_in, release_in = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
        _on_exit(releases, release_in)
        wire_out, release_out = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
        _on_exit(releases, release_out)
        yield wire_in, wire_out


def _on_exit(stack: ExitStack, release: Callable[[], None] | None) -> None:
    if release is not None:
        stack.callback(release)


def stamp_request(client: Client, data: RpcRequest) -> None:
    """Add to a request (`{"method", "params"}`) what `client` adds for its negotiated era."""
    # The SDK's stamp takes a plain dict and writes into it; a TypedDict is one at run time.
    client.session._stamp(cast("dict[str, Any]", data), {})  # pyright: ignore[reportPrivateUsage]


async def deliver_notification(client: Client, method: str, params: Mapping[str, Any] | None) -> None:
    """A server's notification heard past `client`'s transport (`backends/lean_http.py`), given to
    its session's own handlers, as if the transport had read it."""
    await client.session._on_notify(cast(Any, None), method, params)  # pyright: ignore[reportPrivateUsage]


async def answer_server_request(
    client: Client, request_id: object, method: str, params: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The result `client`'s session gives a server's request heard past its transport (its
    callbacks: ping, sampling, elicitation, roots); raises `MCPError` with its error."""
    context = SimpleNamespace(request_id=request_id)
    return await client.session._on_request(cast(Any, context), method, params)  # pyright: ignore[reportPrivateUsage]


def restamp_capabilities(client: Client, narrow: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """After `client` has negotiated: each request's 2026-07-28 `_meta` capabilities (which the
    SDK stamps with those the client was built with) become `narrow(stamped)`."""
    session = client.session
    stamp = session._stamp  # pyright: ignore[reportPrivateUsage]

    def restamp(data: dict[str, Any], opts: Any) -> None:
        stamp(data, opts)
        meta = data.get("params", {}).get("_meta")
        if isinstance(meta, dict) and isinstance(meta.get(CLIENT_CAPABILITIES_META_KEY), dict):
            meta[CLIENT_CAPABILITIES_META_KEY] = narrow(meta[CLIENT_CAPABILITIES_META_KEY])

    session._stamp = restamp  # pyright: ignore[reportPrivateUsage]


def server_connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The connection a request arrived on (see the module docstring for why it is read privately)."""
    connection: Connection = ctx.session._connection  # pyright: ignore[reportPrivateUsage]
    return connection


def event_store_per_session(manager: StreamableHTTPSessionManager, store: Callable[[], EventStore]) -> None:
    """From now on, each session `manager` opens gets an event store of its own, `store()`."""
    admit = manager._admit_session  # pyright: ignore[reportPrivateUsage]

    def admitted(requestor: Any) -> StreamableHTTPServerTransport | None:
        transport = admit(requestor)
        if transport is not None:
            transport._event_store = store()  # pyright: ignore[reportPrivateUsage]
        return transport

    manager._admit_session = admitted  # type: ignore[method-assign]  # see the module docstring


def front_of_sessions(manager: StreamableHTTPSessionManager, lane: Callable[[ASGIApp], ASGIApp]) -> None:
    """Put `lane` in front of `manager`'s request handling: past the routing and the bearer
    middleware (the caller is authenticated as for every request), inside the body size limit."""
    inner = manager._handle_request  # pyright: ignore[reportPrivateUsage]
    manager.asgi_app = RequestBodyLimitMiddleware(lane(inner), manager.max_request_body_size)


def http_session(
    manager: StreamableHTTPSessionManager, session_id: str
) -> tuple[StreamableHTTPServerTransport, AuthorizationContext | None] | None:
    """The transport of the handshake-era session `session_id` and the credential that opened it."""
    transport = manager._server_instances.get(session_id)  # pyright: ignore[reportPrivateUsage]
    if transport is None:
        return None
    return transport, manager._session_owners.get(session_id)  # pyright: ignore[reportPrivateUsage]


@contextmanager
def holding(transport: StreamableHTTPServerTransport) -> Iterator[None]:
    """A request in flight on `transport`'s session: its idle countdown waits, as the transport's own does."""
    idle = transport.idle_scope
    timeout = transport._idle_timeout  # pyright: ignore[reportPrivateUsage]
    if idle is None or timeout is None:
        yield
        return
    transport._requests_in_flight += 1  # pyright: ignore[reportPrivateUsage]
    idle.deadline = math.inf
    try:
        yield
    finally:
        transport._requests_in_flight -= 1  # pyright: ignore[reportPrivateUsage]
        if not transport._requests_in_flight:  # pyright: ignore[reportPrivateUsage]
            idle.deadline = anyio.current_time() + timeout


async def priming_event(transport: StreamableHTTPServerTransport, stream: str, version: str) -> SSEEvent | None:
    """The priming event the transport writes first on a request's stream (stored), where the client may resume."""
    return await transport._mint_priming_event(stream, version)  # pyright: ignore[reportPrivateUsage]


async def stored(transport: StreamableHTTPServerTransport, stream: str, message: JSONRPCMessage) -> EventMessage:
    """`message`, stored under the request's stream as the transport's router stores it."""
    store = transport._event_store  # pyright: ignore[reportPrivateUsage]
    return EventMessage(message, await store.store_event(stream, message) if store is not None else None)


def event_data(transport: StreamableHTTPServerTransport, event: EventMessage) -> SSEEvent:
    """The SSE event the transport writes for `event`."""
    return transport._create_event_data(event)  # pyright: ignore[reportPrivateUsage]


def open_request_stream(
    transport: StreamableHTTPServerTransport, stream: str
) -> tuple[MemoryObjectSendStream[EventMessage], MemoryObjectReceiveStream[EventMessage]]:
    """From now until `close_request_stream`, what the session sends for request `stream` (its
    requests to the client, their cancellations) is stored and delivered here by the transport's
    router, as for a request the transport dispatched itself."""
    pair = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
    transport._request_streams[stream] = pair  # pyright: ignore[reportPrivateUsage]
    return pair


def close_request_stream(
    transport: StreamableHTTPServerTransport,
    stream: str,
    pair: tuple[MemoryObjectSendStream[EventMessage], MemoryObjectReceiveStream[EventMessage]],
) -> None:
    streams = transport._request_streams  # pyright: ignore[reportPrivateUsage]
    if streams.get(stream) is pair:
        del streams[stream]
    pair[0].close()
    pair[1].close()


async def ask_related(
    connection: Connection, related: RequestId, version: str, method: str, params: dict[str, Any] | None
) -> dict[str, Any]:
    """Send the client a request on the stream of its request `related`, as a handler's request
    context sends one (`ServerSession.send_request`), and check its result as that does."""
    result: dict[str, Any] = await cast(Any, connection.outbound).send_raw_request(
        method, params, None, _related_request_id=related
    )
    with suppress(KeyError):  # a method the SDK has no result type for is passed as it came
        validate_client_result(method, version, result)
    return result


__all__ = [
    "MCP_HTTP_TIMEOUT",
    "MODERN_SSE_HEADERS",
    "ReadStream",
    "Transport",
    "TransportStreams",
    "answer_server_request",
    "ask_related",
    "claimed_stdio",
    "close_request_stream",
    "create_platform_compatible_process",
    "deliver_notification",
    "drain_stdout",
    "event_data",
    "event_store_per_session",
    "front_of_sessions",
    "holding",
    "http_session",
    "modern_answer",
    "modern_sse_event",
    "modern_write",
    "open_request_stream",
    "parse_line",
    "priming_event",
    "restamp_capabilities",
    "server_connection",
    "stamp_request",
    "stop_server_process",
    "stored",
]
