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
* a request the server refused for want of a login that then failed (`auth:` on the server: the
  person did not log in within `login_timeout`, the authorization server refused the login) is
  answered with a marked error, *unauthorized*: the server ran nothing, and the next request asks
  for a login again (a handshake's failed login still ends its connection attempt, in the login's words);
* a notification or a response the proxy POSTs (nothing waits for an answer) is taken as
  delivered (202) and the loss logged, so the session goes on.

The mark is a key this client made (`claim` takes it back once), which no backend can send: only
what the proxy saw becomes its own error. An SSE stream is passed on one whole event at a time,
each as it arrives (`backends/events.py`), so a marked answer never lands inside half an event. A
stream whose events carry ids can be resumed, and its drop is left to the SDK, which resumes it
with a GET that carries Last-Event-ID.

No answer is held in memory past `limit` bytes (the transport's bound on one message): a JSON
body or an SSE event over it is read to its end without being kept, and its request is answered
with an error marked the same way, which `restore` turns into the `raw.Oversized` the proxy's
stdio transport gives (the call then fails with the proxy's own ResultTooLarge). So is an event
of a resumed stream (a GET that carries Last-Event-ID): the SDK gives what that stream carries
to the call it resumes, whatever id an answer names.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp.client.auth import OAuthFlowError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.backends.events import Events, Lines
from mcp_spec_proxy.backends.oauth import login_failure
from mcp_spec_proxy.backends.raw import Oversized
from mcp_spec_proxy.errors import RESULT_TOO_LARGE, BackendClosed, BackendError, BackendUnavailable
from mcp_spec_proxy.wire_types import RpcError

logger = logging.getLogger(__name__)

LOST_KEY = "mcp-spec-proxy/lost"
"""The key of the mark in a lost request's error `data`."""
OVERSIZED_KEY = "mcp-spec-proxy/oversized"
"""The key of the mark in the error `data` of a request whose answer was over the bound."""

# Nothing was written: no connection was made, or none was free.
_UNSENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)
_HANDSHAKE = frozenset({"initialize", "server/discover"})
_SAID = {"unsent": "not sent", "dropped": "dropped", "unauthorized": "refused: no login"}
_LAST_EVENT_ID = "last-event-id"
# The headers of a body that was read here: what is passed on is that body, decoded.
_READ_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})


LostKind = Literal["unsent", "dropped", "unauthorized"]


@dataclass(frozen=True)
class Lost:
    """What happened to one request's connection (`unauthorized`: the login it needed failed, so the
    server refused it and ran nothing)."""

    kind: LostKind
    detail: str

    def error(self, server: str, what: str) -> BackendError | None:
        """What the call `what` to `server` is told where the session goes on (None: no connection could be
        made, which the session's owner answers, as it must also end the transport)."""
        if self.kind == "unauthorized":  # the server refused it; the next request asks for a login again
            return BackendUnavailable(
                server,
                f"could not log in for {what}: {self.detail}; it was not run — call again to be asked to log in"
                f" (the approval console's 'Log in to {server}'), or run `mcp-spec-proxy login {server}`",
            )
        if self.kind == "dropped":
            ran = ", so it may have run; the proxy did not send it again" if what.startswith("tools/call") else ""
            return BackendClosed(
                server, f"lost the HTTP connection carrying {what} before answering ({self.detail}){ran}"
            )
        return None


class GuardedClient(httpx2.AsyncClient):
    """An `httpx2.AsyncClient` whose lost POSTs, and answers over `limit` bytes, become marked
    JSON-RPC errors of their request."""

    def __init__(self, *, limit: int, endpoint: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.limit = limit
        self.endpoint = endpoint  # the MCP endpoint's URL: the lean read path posts there (`lean_http.py`)
        self.session_id: str | None = None  # the established session's, as the SDK's transport last sent them
        self.version: str | None = None
        self._lost: dict[str, Lost] = {}
        self._oversized: dict[str, Oversized] = {}

    def claim(self, data: object) -> Lost | None:
        """The loss an error's `data` marks, when this client marked it (once); else None."""
        key = data.get(LOST_KEY) if isinstance(data, dict) else None
        return self._lost.pop(key, None) if isinstance(key, str) else None

    def restore(self, message: SessionMessage | Exception) -> SessionMessage | Exception:
        """`message` as the SDK session should see it: an error this client marked as over the
        bound carries its `raw.Oversized` (once), as the stdio transport's does."""
        if not isinstance(message, SessionMessage) or not isinstance(message.message, types.JSONRPCError):
            return message
        error = message.message.error
        oversized = self.oversized(error.data)
        if oversized is None:
            return message
        marked = types.ErrorData(code=error.code, message=error.message, data=oversized)
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=message.message.id, error=marked))

    def oversized(self, data: object) -> Oversized | None:
        """The `raw.Oversized` an error's `data` marks, when this client marked it (once); else None."""
        key = data.get(OVERSIZED_KEY) if isinstance(data, dict) else None
        return self._oversized.pop(key, None) if isinstance(key, str) else None

    async def send(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        response = await self._guarded(request, **kwargs)
        if response.status_code < 300 and (session := request.headers.get("mcp-session-id")) is not None:
            # The session is established once the server has taken a message on it (the SDK's
            # first: `notifications/initialized`): a request sent past the SDK then follows it.
            self.session_id, self.version = session, request.headers.get("mcp-protocol-version")
        return response

    async def _guarded(self, request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
        message = _message(request)
        if message is None:
            response = await super().send(request, **kwargs)
            resumed = request.method == "GET" and _LAST_EVENT_ID in request.headers
            if resumed and (events := _events(response)) is not None:
                response.stream = Events(events, self.limit, None, partial(self._too_large_event, None))
            return response
        request_id = message.get("id") if "method" in message else None
        try:
            response = await super().send(request, **kwargs)
        except _UNSENT as exc:
            return self._lost_answer(request, request_id, "unsent", exc)
        except httpx2.TransportError as exc:
            return self._lost_answer(request, request_id, "dropped", exc)
        except OAuthFlowError as exc:  # the server refused it, and the login that would let it in failed
            if message.get("method") in _HANDSHAKE:
                raise  # no session yet: the connection fails, in its login's words (`backends/connection.py`)
            return self._lost_answer(request, request_id, "unauthorized", exc)
        if request_id is None or 300 <= response.status_code < 400:
            return response
        kind = response.headers.get("content-type", "").lower()
        plain = response.status_code < 300 and response.headers.get("content-encoding", "identity") == "identity"
        listen = kind.startswith("application/json") and message.get("method") == "subscriptions/listen"
        if listen and plain and isinstance(response.stream, httpx2.AsyncByteStream):
            # A listen stream sent as JSON lines: passed on as the events each line is.
            response.headers["content-type"] = "text/event-stream"
            response.stream = Lines(response.stream, self.limit, partial(self._too_large_event, request_id))
            return response
        if kind.startswith("application/json"):
            return await self._json(request, request_id, response)
        if (events := _events(response)) is not None:
            on_drop = partial(self._lost_event, request_id)
            response.stream = Events(events, self.limit, on_drop, partial(self._too_large_event, request_id))
        return response

    async def _json(self, request: httpx2.Request, request_id: object, response: httpx2.Response) -> httpx2.Response:
        """A JSON answer read here, within the bound (the SDK reads it whole too): a drop in it is
        this request's, and one over the bound is read to its end but not kept."""
        body = bytearray()
        size = 0
        try:
            async for part in response.aiter_bytes():
                size += len(part)
                if size <= self.limit:
                    body += part
                elif body:
                    body.clear()
        except httpx2.TransportError as exc:
            return self._lost_answer(request, request_id, "dropped", exc)
        finally:
            await response.aclose()
        if size > self.limit:
            return self._answer(request, self._too_large(request_id, size))
        headers = [(key, value) for key, value in response.headers.multi_items() if key.lower() not in _READ_HEADERS]
        content = bytes(body)
        if response.status_code < 300:
            modern = request.headers.get("mcp-protocol-version", "") in MODERN_PROTOCOL_VERSIONS
            content, stream = _lenient(content, modern)
            if stream:  # several messages in one JSON body: passed on as the events they are
                headers = [(k, v) for k, v in headers if k.lower() != "content-type"]
                headers.append(("content-type", "text/event-stream"))
        return httpx2.Response(response.status_code, headers=headers, content=content, request=request)

    def _mark(self, kind: LostKind, exc: Exception, request_id: object) -> dict[str, Any]:
        detail = _detail(exc)
        key = secrets.token_hex(16)
        self._lost[key] = Lost(kind, detail)
        logger.warning("HTTP request %r %s: %s", request_id, _SAID[kind], detail)
        error: RpcError = {"code": CONNECTION_CLOSED, "message": f"connection lost ({detail})", "data": {LOST_KEY: key}}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}

    def _too_large(self, request_id: object, size: int) -> dict[str, Any]:
        key = secrets.token_hex(16)
        self._oversized[key] = Oversized(size, self.limit)
        message = f"response of {size} bytes is over the {self.limit}-byte bound"
        logger.warning("HTTP answer to request %r withheld: %s", request_id, message)
        error: RpcError = {"code": RESULT_TOO_LARGE, "message": message, "data": {OVERSIZED_KEY: key}}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}

    def _too_large_event(self, request_id: object, size: int) -> bytes:
        return self._event(self._too_large(request_id, size))

    @staticmethod
    def _answer(request: httpx2.Request, answer: dict[str, Any]) -> httpx2.Response:
        body = json.dumps(answer).encode()
        return httpx2.Response(502, headers={"content-type": "application/json"}, content=body, request=request)

    @staticmethod
    def _event(answer: dict[str, Any]) -> bytes:
        return b"event: message\ndata: " + json.dumps(answer).encode() + b"\n\n"

    def _lost_answer(
        self, request: httpx2.Request, request_id: object, kind: LostKind, exc: Exception
    ) -> httpx2.Response:
        if request_id is None:  # a notification or a response: nothing waits for it
            logger.warning("HTTP message to %s lost (%s); the session goes on", request.url, _detail(exc))
            return httpx2.Response(202, request=request)
        return self._answer(request, self._mark(kind, exc, request_id))

    def _lost_event(self, request_id: object, exc: Exception) -> bytes:
        return self._event(self._mark("dropped", exc, request_id))


def _events(response: httpx2.Response) -> httpx2.AsyncByteStream | None:
    """The body of `response` when it is SSE this client can read event by event (a success, not
    compressed: its events are read raw here); else None."""
    stream = response.stream
    if (
        response.status_code < 300
        and response.headers.get("content-type", "").lower().startswith("text/event-stream")
        and response.headers.get("content-encoding", "identity") == "identity"
        and isinstance(stream, httpx2.AsyncByteStream)
    ):
        return stream
    return None


def _lenient(body: bytes, modern: bool) -> tuple[bytes, bool]:
    """A JSON answer as the SDK can read it, where what a client reads directly is looser: messages
    one per line in one body (some servers stream a call's notifications so) become SSE events
    (True), and a 2026-07-28 result with no `resultType` is complete, as the lean read path takes
    it (`raw.tool_result`). Anything else passes unchanged."""
    try:
        messages: list[Any] = [json.loads(body)]
        several = False
    except ValueError:
        lines = [line for line in body.splitlines() if line.strip()]
        try:
            messages = [json.loads(line) for line in lines]
        except ValueError:
            return body, False
        several = len(messages) > 1
    if modern:
        for message in messages:
            result = message.get("result") if isinstance(message, dict) else None
            if isinstance(result, dict) and "resultType" not in result:
                result["resultType"] = "complete"
    if several:
        return b"".join(b"event: message\ndata: " + json.dumps(m).encode() + b"\n\n" for m in messages), True
    return (json.dumps(messages[0]).encode() if modern else body), False


def _detail(exc: Exception) -> str:
    if isinstance(exc, OAuthFlowError):
        return login_failure(exc)  # in words that quote no token endpoint's answer
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


__all__ = ["LOST_KEY", "OVERSIZED_KEY", "GuardedClient", "Lost"]
