"""How a backend is reached: the transport `mcp.Client` connects over, and EOF detection.

`open_transport(name, config, errlog, on_end, on_exit)` turns a `ServerConfig` into a
`WatchedTransport` over one of: a stdio client whose lines are bounded by the server's result cap
(`backends/stdio.py`), a streamable HTTP transport with the configured headers whose lost
connections stay with their request and whose answers are bounded by the same cap
(`backends/http.py`), or an SSE transport. The read side is
wrapped so the supervisor learns the moment a backend's stream ends (a stdio server that exited,
an HTTP session that was dropped) instead of discovering it on the next call. A stdio transport
also carries the fast path's reads (`WatchedTransport.raw`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self, TextIO

import anyio
import httpx2
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import SessionMessage

from mcp_spec_proxy.backends.http import GuardedClient
from mcp_spec_proxy.backends.raw import RawCalls
from mcp_spec_proxy.backends.stdio import bounded_stdio_client
from mcp_spec_proxy.config.commands import resolve_command  # also used before the SDK loads: one place
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.prespawn import Prespawned
from mcp_spec_proxy.sdk import MCP_HTTP_TIMEOUT, ReadStream, Transport, TransportStreams


class _WatchedReadStream:
    """Passes messages through and sets `ended` when the backend's stream ends; with `guard`, an
    answer it marked as over the bound is passed as `guard.restore` makes it."""

    def __init__(
        self, inner: ReadStream[SessionMessage | Exception], ended: _EndSignal, guard: GuardedClient | None = None
    ) -> None:
        self._inner = inner
        self._ended = ended
        self._guard = guard

    def __getattr__(self, name: str) -> Any:
        # `last_context` and friends: whatever the dispatcher looks for on the real stream.
        return getattr(self._inner, name)

    async def receive(self) -> SessionMessage | Exception:
        try:
            message = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._ended.set()
            raise
        return message if self._guard is None else self._guard.restore(message)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._ended.set()
        await self._inner.aclose()
        return None


class WatchedTransport:
    """A `Transport` whose `ended` event fires when the backend stops talking; `raw` is the fast
    path's channel on the same connection where the transport has one (stdio), `guard` the HTTP
    client that marks a streamable HTTP request whose connection was lost."""

    def __init__(
        self,
        inner: Transport,
        on_end: Callable[[], None],
        raw: RawCalls | None = None,
        guard: GuardedClient | None = None,
    ) -> None:
        self._inner = inner
        self.ended = _EndSignal(on_end)
        self.raw = raw
        self.guard = guard  # a streamable HTTP connection's: it marks the requests whose connection was lost

    async def __aenter__(self) -> TransportStreams:
        read, write = await self._inner.__aenter__()
        return _WatchedReadStream(read, self.ended, self.guard), write

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self.ended.set()
        return await self._inner.__aexit__(exc_type, exc, tb)


class _EndSignal:
    """A one-way flag that also wakes the supervisor."""

    def __init__(self, on_end: Callable[[], None]) -> None:
        self._event = anyio.Event()
        self._on_end = on_end

    def set(self) -> None:
        if not self._event.is_set():
            self._event.set()
            self._on_end()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


def message_bound(config: ServerConfig) -> int:
    """The most bytes one message from a backend may have: the result cap, with a margin for the
    JSON-RPC envelope and escaping. A result within it is measured by the caller; one past it is
    never held (`raw.Oversized`)."""
    return int(config.max_result_bytes * 1.5) + 65_536


@asynccontextmanager
async def _http(url: str, http: GuardedClient) -> AsyncIterator[TransportStreams]:
    # The SDK's own cap on an SSE event (1 MiB by default) is raised to the bound: `http` refuses
    # a request's own events over it with the proxy's error first, and the SDK's cap still bounds
    # the streams `http` passes as they are (a resumed stream's GET, a compressed body).
    async with http, streamable_http_client(url, http_client=http, max_sse_event_size=http.limit) as streams:
        yield streams


def open_transport(
    name: str,
    config: ServerConfig,
    errlog: TextIO,
    on_end: Callable[[], None],
    on_exit: Callable[[int | None], None] | None = None,
    early: Prespawned | None = None,
    auth: httpx2.Auth | None = None,
) -> WatchedTransport:
    """The transport for one backend; raises `BackendError` if a stdio command cannot be found.
    A stdio backend's first connection may adopt its process in `early` (the launcher's); a URL
    backend's requests carry `auth` (its OAuth client, `backends/oauth.py`), else its `headers` alone."""
    if config.transport == "stdio":
        assert config.command is not None  # the config validator guarantees command or url
        params = StdioServerParameters(
            command=resolve_command(name, config.command),
            args=config.args,
            env=config.env or None,
            cwd=config.cwd,
        )
        raw = RawCalls()
        bounded = bounded_stdio_client(params, errlog, message_bound(config), on_exit, raw, name, early)
        return WatchedTransport(bounded, on_end, raw)
    assert config.url is not None
    if config.transport == "sse":
        return WatchedTransport(sse_client(config.url, headers=config.headers or None, auth=auth), on_end)
    # The SDK's own client settings (its timeouts; redirects it follows itself), lost connections
    # kept with their request and answers bounded as on stdio (`backends/http.py`).
    http = GuardedClient(
        limit=message_bound(config),
        endpoint=config.url,
        headers=config.headers or None,
        timeout=MCP_HTTP_TIMEOUT,
        auth=auth,
    )
    return WatchedTransport(_http(config.url, http), on_end, guard=http)


__all__ = ["WatchedTransport", "open_transport", "resolve_command"]
