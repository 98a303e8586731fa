"""A read over an established handshake-era streamable HTTP session, past the SDK's client session.

The SDK client sends a request through its session (a model built and checked, a dispatcher
entry, a memory stream to the transport's writer task, a task per POST, the answer parsed into a
model and back). A read needs a POST and its answer: `LeanLeg.request` writes the JSON-RPC request
itself, on the same `GuardedClient` (its auth, its lost connections and its bound on an answer) with
the session's id and protocol version headers, and reads the answer directly, JSON or SSE.

What the server sends on that POST before its answer is handled as the SDK would: a notification
goes to the session's own handlers (`sdk.deliver_notification`), a request (ping; a question the
session declared it can be asked) is answered through the session's callbacks and the answer is
POSTed back. A status the SDK turns into an error becomes the same error here. Only the
handshake era takes this path (its session is the id and the version header); a 2026-07-28 leg
takes the SDK's. Cancelled while waiting (the proxy's clock, a client that left), the backend is
told with `notifications/cancelled`, as the SDK client tells it.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import anyio
import httpx2
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mcp_spec_proxy.backends.events import event_end
from mcp_spec_proxy.backends.http import GuardedClient, Lost
from mcp_spec_proxy.backends.raw import Answer, Oversized
from mcp_spec_proxy.sdk import answer_server_request, deliver_notification
from mcp_spec_proxy.wire_types import RpcRequest

logger = logging.getLogger(__name__)

_IDS = itertools.count(1)
PREFIX = "mcp-spec-proxy-lean-"
MAX_RESUMES = 2
"""How many times one read's stream is resumed (`Last-Event-ID`), as the SDK's transport tries."""
MAX_RETRY_S = 10.0
"""The longest a server's `retry:` makes a resumption wait."""
CANCEL_S = 5.0
"""How long telling the backend of a cancelled read may take."""


class LeanLeg:
    """One established handshake-era session of a streamable HTTP backend, for reads."""

    open = True  # as `RawCalls.open`: a session that ended fails its request as a lost connection

    def __init__(self, guard: GuardedClient, url: str, session_id: str, version: str, client: Client) -> None:
        self._guard = guard
        self._url = url
        self._client = client
        self._headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-session-id": session_id,
            "mcp-protocol-version": version,
        }

    @classmethod
    def of(cls, guard: GuardedClient | None, client: Client) -> LeanLeg | None:
        """`client`'s session reached through `guard`, once it is established; None for any other."""
        if guard is None or guard.endpoint is None or guard.session_id is None or guard.version is None:
            return None
        if client.protocol_version is None or client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        return cls(guard, guard.endpoint, guard.session_id, guard.version, client)

    def lost(self, error: object) -> Lost | None:
        """The lost connection an answer's error marks (the guard's own mark), once; else None."""
        return self._guard.claim(error.get("data")) if isinstance(error, dict) else None

    async def request(self, message: RpcRequest) -> Answer:
        """Send `message` (a request; its id is set here) and return its answer as the backend sent
        it (or as the SDK's transport would have made it), or `Oversized` when it was over the bound."""
        key = f"{PREFIX}{next(_IDS)}"
        message["id"] = key
        try:
            return await self._exchange(key, json.dumps(message).encode())
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_S):
                cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": key}}
                try:
                    await self._post(cancelled)
                except Exception:  # boundary: the read's own failure is what its caller hears
                    logger.debug("could not tell the backend read %s was cancelled", key, exc_info=True)
            raise

    async def _exchange(self, key: str, body: bytes) -> Answer:
        request = self._guard.build_request("POST", self._url, content=body, headers=self._headers)
        response = await self._guard.send(request, stream=True)
        try:
            kind = response.headers.get("content-type", "").lower()
            if response.status_code == 202:
                return _error(key, INVALID_REQUEST, "server answered a request with 202 Accepted")
            if response.status_code >= 300:  # (the guard's marked answers too: a lost connection, one too large)
                return await self._refusal(key, response, kind)
            if kind.startswith("application/json"):
                try:
                    return self._own(key, json.loads(await response.aread()))
                except ValueError:
                    return _error(key, INTERNAL_ERROR, "Server returned a body that is not JSON")
            if kind.startswith("text/event-stream"):
                return await self._events(key, response)
            return _error(key, INVALID_REQUEST, f"Unexpected content type: {kind}")
        finally:
            await response.aclose()

    async def _events(self, key: str, response: httpx2.Response) -> Answer:
        """The answer on an SSE body; a stream that ends (or drops) after an event with an id is
        resumed with a GET carrying Last-Event-ID, as the SDK's transport resumes it."""
        stream = _Stream()
        for resumed in range(MAX_RESUMES + 1):
            try:
                answer = await self._read(key, response, stream, resumed=resumed > 0)
            except httpx2.TransportError:
                if stream.last_id is None:
                    raise
                answer = None
            finally:
                if resumed:
                    await response.aclose()
            if answer is not None or stream.last_id is None:
                return answer
            await anyio.sleep(min(stream.retry_s, MAX_RETRY_S))
            headers = {**self._headers, "last-event-id": stream.last_id}
            response = await self._guard.send(self._guard.build_request("GET", self._url, headers=headers), stream=True)
            if response.status_code >= 300 or "text/event-stream" not in response.headers.get("content-type", ""):
                await response.aclose()
                return None
        return None

    async def _read(self, key: str, response: httpx2.Response, stream: _Stream, *, resumed: bool) -> Answer:
        pending = bytearray()
        async for chunk in response.aiter_bytes():
            pending += chunk
            while end := event_end(pending):
                event, pending[:] = bytes(pending[:end]), pending[end:]
                message = stream.parse(event)
                if message is None:
                    continue  # a priming event, a comment
                if isinstance(message, dict) and "method" in message:
                    await self._hear(message)
                elif resumed or (isinstance(message, dict) and message.get("id") == key):
                    return self._own(key, message)  # (a resumed stream carries only this call's)
        return None  # the stream ended before the answer

    def _own(self, key: str, message: Any) -> Answer:
        """The answer to our request, with an answer over the bound as the stdio transport gives it."""
        if not isinstance(message, dict):
            return None
        error = message.get("error")
        oversized = self._guard.oversized(error.get("data")) if isinstance(error, dict) else None
        if oversized is not None:
            return oversized
        return {**message, "id": key}

    async def _hear(self, message: Any) -> None:
        """A message of the server's before its answer: a notification, or a request it asks."""
        if not isinstance(message, dict) or not isinstance(message.get("method"), str):
            return
        method, params = message["method"], message.get("params")
        if "id" not in message:
            try:
                await deliver_notification(self._client, method, params)
            except ValidationError:  # as the SDK's dispatcher: a malformed notification is dropped
                logger.debug("backend sent a malformed %s notification; dropped", method)
            return
        try:
            reply: dict[str, Any] = {"result": await answer_server_request(self._client, message["id"], method, params)}
        except (MCPError, ValidationError) as exc:  # the SDK's own mapping: a malformed request is INVALID_PARAMS
            error = handler_exception_to_error_data(exc)
            assert error is not None
            reply = {"error": error.model_dump(by_alias=True, mode="json", exclude_none=True)}
        await self._post({"jsonrpc": "2.0", "id": message["id"], **reply})

    async def _post(self, message: dict[str, Any]) -> None:
        """A notification or a response: nothing waits for an answer (the guard takes a loss as sent)."""
        request = self._guard.build_request(
            "POST", self._url, content=json.dumps(message).encode(), headers=self._headers
        )
        response = await self._guard.send(request)
        await response.aclose()

    async def _refusal(self, key: str, response: httpx2.Response, kind: str) -> Answer:
        """A status the SDK's transport turns into the request's error: the body's JSON-RPC error
        where it carries one, else the words it gives."""
        if response.status_code >= 400 and kind.startswith("application/json"):
            try:
                said = json.loads(await response.aread())
            except (httpx2.StreamError, ValueError):
                said = None
            if isinstance(said, dict) and isinstance(said.get("error"), dict):
                return self._own(key, said)
        if 300 <= response.status_code < 400:
            return _error(key, INVALID_REQUEST, f"redirect to {response.headers.get('location')} not followed")
        if response.status_code == 404:
            return _error(key, INVALID_REQUEST, "Session terminated")
        return _error(key, INTERNAL_ERROR, "Server returned an error response")


class _Stream:
    """What an SSE stream said of itself so far: the last event id, the retry interval."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self.retry_s = 1.0  # the SDK's transport's wait where the server names none

    def parse(self, event: bytes) -> Any:
        """The message an event carries, or None (an event with no data, or empty data)."""
        data: list[str] = []
        try:
            text = event.decode()
        except UnicodeDecodeError:
            logger.warning("an SSE event that is not UTF-8 was dropped")
            return None
        for line in text.splitlines():
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                data.append(value)
            elif field == "id":
                self.last_id = value
            elif field == "retry" and value.isdigit():
                self.retry_s = int(value) / 1000
        said = "\n".join(data)
        if not said.strip():
            return None  # a priming event (its id only), a keep-alive
        try:
            return json.loads(said)
        except ValueError:
            logger.warning("an SSE event that is not JSON was dropped")
            return None


def _error(key: str, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": key, "error": {"code": code, "message": message}}


__all__ = ["LeanLeg", "Oversized"]
