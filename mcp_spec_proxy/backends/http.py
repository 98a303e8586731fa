"""A streamable HTTP backend's lost connections, kept with the one request they carried.

The SDK's streamable HTTP client sends each request on a POST of its own. When that POST's
connection fails (the server, a middlebox or the network closed it before the answer was read),
the exception escapes into the transport's task group and ends the whole session: every call in
flight on it fails, though one connection was lost and the session lives on at the server.
`GuardedClient` is the httpx client under the SDK's transport that keeps such a failure with its
own request:

* a request that never left (no connection could be made: refused, timed out, no free pooled
  connection) is answered with a marked error, *unsent*;
* a request whose connection ended after it was written — before the response, inside a JSON
  body, inside its SSE stream — is answered with a marked error, *dropped*: the backend may have
  run it;
* a notification or a response the proxy POSTs (nothing waits for an answer) is taken as
  delivered (202) and the loss logged, so the session goes on.

The mark is a key this client made (`claim` takes it back once), which no backend can send: only
what the proxy saw becomes its own error. An SSE stream is passed on up to its last complete
event, so a marked answer never lands inside half an event. A stream whose events carry ids can
be resumed, and its drop is left to the SDK, which resumes it with Last-Event-ID.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx2
from mcp_types import CONNECTION_CLOSED

from mcp_spec_proxy.wire_types import RpcError

logger = logging.getLogger(__name__)

LOST_KEY = "mcp-spec-proxy/lost"
"""The key of the mark in a lost request's error `data`."""

# Nothing was written: no connection was made, or none was free.
_UNSENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
# Two line ends in a row (`\r\n`, `\r` or `\n` each) always contain one of these: an event's end.
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\n\r")
_ID_FIELD = re.compile(rb"(?:^|[\r\n])id:")


@dataclass(frozen=True)
class Lost:
    """What happened to one request's connection."""

    kind: Literal["unsent", "dropped"]
    detail: str


class GuardedClient(httpx2.AsyncClient):
    """An `httpx2.AsyncClient` whose lost POSTs become marked JSON-RPC errors of their request."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lost: dict[str, Lost] = {}

    def claim(self, data: object) -> Lost | None:
        """The loss an error's `data` marks, when this client marked it (once); else None."""
        key = data.get(LOST_KEY) if isinstance(data, dict) else None
        return self._lost.pop(key, None) if isinstance(key, str) else None

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        message = _message(request)
        if message is None:
            return await super().send(request, **kwargs)
        request_id = message.get("id") if "method" in message else None
        try:
            response = await super().send(request, **kwargs)
        except _UNSENT as exc:
            return self._lost_answer(request, request_id, "unsent", exc)
        except httpx2.TransportError as exc:
            return self._lost_answer(request, request_id, "dropped", exc)
        if request_id is None or response.status_code >= 300:
            return response
        kind = response.headers.get("content-type", "").lower()
        if kind.startswith("application/json"):
            try:
                await response.aread()  # the SDK reads it whole too; a drop in it is this request's
            except httpx2.TransportError as exc:
                await response.aclose()
                return self._lost_answer(request, request_id, "dropped", exc)
        elif (
            kind.startswith("text/event-stream")
            and isinstance(response.stream, httpx2.AsyncByteStream)
            and response.headers.get("content-encoding", "identity") == "identity"  # its events are read raw here
        ):
            response.stream = _Events(response.stream, lambda exc: self._lost_event(request_id, exc))
        return response

    def _mark(self, kind: Literal["unsent", "dropped"], exc: Exception, request_id: object) -> dict[str, Any]:
        detail = _detail(exc)
        key = secrets.token_hex(16)
        self._lost[key] = Lost(kind, detail)
        logger.warning("HTTP request %r %s: %s", request_id, "not sent" if kind == "unsent" else "dropped", detail)
        error: RpcError = {"code": CONNECTION_CLOSED, "message": f"connection lost ({detail})", "data": {LOST_KEY: key}}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}

    def _lost_answer(
        self, request: httpx2.Request, request_id: object, kind: Literal["unsent", "dropped"], exc: Exception
    ) -> httpx2.Response:
        if request_id is None:  # a notification or a response: nothing waits for it
            logger.warning("HTTP message to %s lost (%s); the session goes on", request.url, _detail(exc))
            return httpx2.Response(202, request=request)
        body = json.dumps(self._mark(kind, exc, request_id)).encode()
        return httpx2.Response(502, headers={"content-type": "application/json"}, content=body, request=request)

    def _lost_event(self, request_id: object, exc: Exception) -> bytes:
        return b"event: message\ndata: " + json.dumps(self._mark("dropped", exc, request_id)).encode() + b"\n\n"


class _Events(httpx2.AsyncByteStream):
    """An SSE body passed on whole events at a time; a drop ends it with `on_drop`'s event."""

    def __init__(self, inner: httpx2.AsyncByteStream, on_drop: Callable[[Exception], bytes]) -> None:
        self._inner = inner
        self._on_drop = on_drop

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        resumable = False
        try:
            async for chunk in self._inner:
                start = max(0, len(pending) - 1)  # an event's end may straddle the chunks
                pending += chunk
                ends = [at + 2 for mark in _EVENT_ENDS if (at := pending.rfind(mark, start)) >= 0]
                if ends:
                    whole, pending = pending[: max(ends)], pending[max(ends) :]
                    resumable = resumable or _ID_FIELD.search(whole) is not None
                    yield whole
        except httpx2.TransportError as exc:
            if resumable:
                raise  # the SDK resumes it with Last-Event-ID
            yield self._on_drop(exc)  # half an event is dropped with the connection
            return
        if pending:
            yield pending

    async def aclose(self) -> None:
        await self._inner.aclose()


def _detail(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _message(request: httpx2.Request) -> dict[str, Any] | None:
    """The single JSON-RPC message a POST carries, or None (another method, a batch, a stream)."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content)
    except (httpx2.RequestNotRead, ValueError):
        return None
    return body if isinstance(body, dict) else None


__all__ = ["LOST_KEY", "GuardedClient", "Lost"]
