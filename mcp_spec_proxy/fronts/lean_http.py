"""The lean HTTP read path: a read on an established session answered at the session manager's door.

The stdio front takes a read off the wire before the SDK parses it (`stdio._LeanReads`); this is
the same for streamable HTTP. `LeanHttp` sits where the SDK's session manager takes a request:
past Starlette's routing, the bearer middleware of `auth:` (a forged token is refused there, as
for every request) and the SDK's body size limit. A POST that is one JSON-RPC `tools/call` the lean
path claims (`FastRead.claim`: a catalog read, no progress token, no idempotency key, no answers
or request state of a suspended call) is answered here — no memory streams, no dispatcher task, no
per-request task group, no SSE machinery (a handshake-era client that can be asked: one task group,
and a stream once its backend asks) — with the bytes and headers the SDK writes for it:

* handshake era: a known, initialized `Mcp-Session-Id` whose owner is the caller (the manager's
  own check), the transport's DNS-rebinding, Content-Type and Accept checks passed (the client
  accepts `application/json` and, unless the manager answers JSON, `text/event-stream`). A read
  that is one answer and nothing before it is answered as the transport answers in JSON mode: one
  `application/json` body with its length, the bytes of `_create_json_response` — the protocol lets
  a server answer a POST either way, and a single answer framed as an SSE stream (a priming event,
  chunked encoding, the client's event parser) costs both ends a quarter of a read's CPU. A client
  that declared roots, sampling or elicitation is served too (on a session answered in SSE): what
  its backend asks during the read goes on the read's own SSE stream, opened at the first question
  as the transport opens it (its events stored for resumption, `Last-Event-ID`), and the client's
  answer comes back through its session (`fronts/lean_asks.py`); a session answered in JSON, which
  has no wire for a question, keeps the SDK's path for such a client. A posted
  `notifications/cancelled` naming a read in flight here cancels it (the backend is told), and
  the read's stream ends with the SDK's -32800, as for a request the SDK cancels.
* 2026-07-28: the SDK's own checks in its order (DNS rebinding, Accept, the routing headers,
  the `_meta` envelope, `Mcp-Param-*` against the tool's schema), the session the request names
  (`Mcp-Spec-Proxy-Session`, each principal's own), and the answer through the SDK's own writer:
  plain JSON with the status its table maps an error to, as the SDK answers a handler that
  emitted nothing; on a front that answers SSE, a read that outlasts the SDK's deferral window
  gets its SSE stream, pings and all (`fronts/lean_modern.py`). A client that declared sampling,
  elicitation or roots is served too: its read runs as the SDK's path runs it, a call the front's
  `Suspensions` host (a task of theirs), which comes back `input_required` with the questions if
  its backend asks; the client's retry carries the `requestState`, takes the SDK's path and
  resumes that very call.

Everything else — another method, a batch, a write, a request any check would refuse — goes on to
the SDK untouched, its body replayed. The read itself is the gate's, as on every path: the same
lookup, argument validation and audit line (`Barrier.read_json`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

import anyio
import anyio.abc
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.connection import Connection
from mcp.server.streamable_http import CONTENT_TYPE_JSON, REQUEST_CANCELLED, check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import (
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    ClientCapabilities,
    ErrorData,
    InputRequiredResult,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCResponse,
    RequestId,
)
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.backends.era import speaking
from mcp_spec_proxy.backends.relay import CALLER, ClientLink
from mcp_spec_proxy.backends.session_legs import serving
from mcp_spec_proxy.calls.access import viewing
from mcp_spec_proxy.fronts.client_sessions import established
from mcp_spec_proxy.fronts.fast_read import Read, input_schema
from mcp_spec_proxy.fronts.lean_asks import AskingAnswer, LaneLink
from mcp_spec_proxy.fronts.mcp import SESSION_KEY, McpFront
from mcp_spec_proxy.fronts.relay import call_binding, declares_any, mute_link
from mcp_spec_proxy.principal import principal_of
from mcp_spec_proxy.sdk import front_of_sessions, holding, http_session
from mcp_spec_proxy.sessions.barrier import Session
from mcp_spec_proxy.sessions.named_sessions import session_name

logger = logging.getLogger(__name__)

_SESSION_ID = "mcp-session-id"
_VERSION = "mcp-protocol-version"
_PARAM_PREFIX = "mcp-param-"
_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_SSE_SEP = "\r\n"


def install(front: McpFront, manager: StreamableHTTPSessionManager) -> None:
    """Answer the reads `manager` is asked for on the lean path; everything else as before."""
    front_of_sessions(manager, lambda app: LeanHttp(app, front, manager))


class LeanHttp:
    """An ASGI app in front of the SDK's session handling: takes the reads it can answer as the
    SDK would, passes everything else on with its body."""

    def __init__(self, app: ASGIApp, front: McpFront, manager: StreamableHTTPSessionManager) -> None:
        self._app = app
        self._front = front
        self._fast = front.fast_read
        self._manager = manager
        self._security = TransportSecurityMiddleware(manager.security_settings)
        self._inflight: dict[tuple[str, RequestId], anyio.CancelScope] = {}  # (session id, request id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or self._front.stdio_session is not None:
            await self._app(scope, receive, send)
            return
        first = await receive()
        body = first.get("body", b"") if first["type"] == "http.request" else b""
        if (
            first["type"] != "http.request"
            or first.get("more_body")
            or not await self._took(scope, body, send, receive)
        ):
            await self._app(scope, _replaying(first, receive), send)

    async def _took(self, scope: Scope, body: bytes, send: Send, receive: Receive) -> bool:
        request = Request(scope)
        if await self._security.validate_request(request, is_post=True) is not None:
            return False  # the SDK refuses it, in its own words
        version = request.headers.get(_VERSION)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return version in MODERN_PROTOCOL_VERSIONS and await self._modern(
                request, body, (request.scope, receive, send)
            )
        return await self._handshake(request, body, send)

    # -- the handshake era: an established session --------------------------------------------

    async def _handshake(self, request: Request, body: bytes, send: Send) -> bool:
        session_id = request.headers.get(_SESSION_ID)
        found = http_session(self._manager, session_id) if session_id is not None else None
        connection = self._fast.http_connections.get(session_id) if session_id is not None else None
        if session_id is None or found is None or connection is None or not connection.initialize_accepted:
            return False
        transport, owner = found
        user = request.scope.get("user")
        caller = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if transport.is_terminated or owner != caller:
            return False  # the SDK answers 404, as for a session it does not know
        has_json, has_sse = check_accept_headers(request)
        json_body = self._manager.json_response
        if not has_json or not (json_body or has_sse):
            return False  # the SDK's 406
        if not _json_content(request):
            return False  # the SDK's 415: it takes exactly `application/json`, where the security check takes a prefix
        data = _request_of(body, pydantic_core.from_json)  # the transport's parser
        if data is None:
            self._cancelled(session_id, body)
            return False
        session = connection.state.get(SESSION_KEY)
        ref = established(connection)
        if not isinstance(session, Session) or (ref is None and self._front.client_sessions.needed):
            return False  # the first call of a session makes them, on the SDK's path
        asks = declares_any(connection.client_capabilities)
        if asks and json_body:
            return False  # a JSON body has no wire for a backend's question: the SDK's path says what it says
        principal = principal_of(request)
        version = connection.protocol_version
        # The priming event follows the version the request's header names, as the transport's does.
        named = request.headers.get(_VERSION, DEFAULT_NEGOTIATED_VERSION)
        with speaking(version), viewing(self._front.view_of(request)), serving(ref, principal):
            read = self._fast.claim(data["params"], version, initialized=True)
            if read is None:
                return False
            request_id: RequestId = data["id"]
            if (session_id, request_id) in self._inflight:
                return False  # the same id twice at once: the SDK says what it says to that
            async with _hosting(asks) as host:
                answer = AskingAnswer(transport, send, request_id, named, _sse_headers(session_id), host)
                link = self._link(session, connection, answer) if asks else mute_link(session)
                message: JSONRPCMessage | None = None
                with holding(transport), self._cancellable(session_id, request_id):
                    message = await self._answer(read, session, request_id, link)
                if message is None:  # cancelled: the transport's answer to a request that settled unanswered
                    message = JSONRPCError(
                        jsonrpc="2.0",
                        id=request_id,
                        error=ErrorData(code=REQUEST_CANCELLED, message="Request cancelled"),
                    )
                if await answer.settle(message):  # a backend asked: the stream is open, the answer ends it
                    return True
        # One answer and nothing before it: the transport's `_create_json_response`.
        body = message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        await _send_whole(send, 200, _json_headers(session_id, len(body)), body)
        return True

    def _link(self, session: Session, connection: Connection, answer: AskingAnswer) -> ClientLink:
        """This client, asked on the read's own stream (opened at the first question)."""
        front = self._front
        return LaneLink(
            session, connection, answer, front.audit_relay(session), front.proxy.config.review.timeout, front.asked
        )

    async def _answer(self, read: Read, session: Session, request_id: RequestId, link: ClientLink) -> JSONRPCMessage:
        token = CALLER.set(link)  # what its backend asks reaches this client, on this read's stream
        try:
            result = await self._fast.run(read, session)
        except MCPError as exc:  # the backend's own error as it sent it, or the proxy's own
            return JSONRPCError(jsonrpc="2.0", id=request_id, error=exc.error)
        except Exception as exc:  # boundary: as the SDK's dispatcher answers a handler's fault
            logger.exception("lean read of %s failed", read.tool.name)
            return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=0, message=str(exc)))
        finally:
            CALLER.reset(token)
        return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)

    @contextmanager
    def _cancellable(self, session_id: str, request_id: RequestId) -> Iterator[anyio.CancelScope]:
        """The read's cancel scope, which a posted `notifications/cancelled` naming it cancels."""
        key = (session_id, request_id)
        scope = self._inflight[key] = anyio.CancelScope()
        try:
            with scope:
                yield scope
        finally:
            self._inflight.pop(key, None)

    def _cancelled(self, session_id: str, body: bytes) -> None:
        """A posted `notifications/cancelled` naming a read of this session in flight here cancels it
        (it goes on to the SDK too, which knows no such request and drops it)."""
        if b"notifications/cancelled" not in body or not self._inflight:
            return
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return
        cancel = isinstance(data, dict) and data.get("method") == "notifications/cancelled"
        params = data.get("params") if cancel else None
        request_id = params.get("requestId") if isinstance(params, dict) else None
        scope = self._inflight.get((session_id, request_id)) if isinstance(request_id, str | int) else None
        if scope is not None:
            scope.cancel()

    # -- 2026-07-28: a self-contained request ------------------------------------------------

    async def _modern(self, request: Request, body: bytes, exchange: tuple[Scope, Receive, Send]) -> bool:
        has_json, has_sse = check_accept_headers(request)
        if not has_json or not (self._manager.json_response or has_sse):
            return False
        data = _request_of(body, json.loads)  # the 2026-07-28 entry's parser
        if data is None or find_duplicated_routing_header(request.headers.items()) is not None:
            return False
        route = classify_inbound_request(data, headers=dict(request.headers))
        if isinstance(route, InboundLadderRejection):
            return False
        params = data["params"]
        if not isinstance(params, Mapping) or _param_rejected(self._front, request, params):
            return False
        capabilities = _capabilities(route.client_capabilities)
        asks = declares_any(capabilities)  # a backend may ask this client: its read is a suspendable call
        version = route.protocol_version
        principal = principal_of(request)
        meta = params.get("_meta")
        front = self._front
        ref = front.client_sessions.modern(request, meta, capabilities) if front.client_sessions.needed else None
        try:
            with speaking(version), viewing(front.view_of(request)), serving(ref, principal):
                read = self._fast.claim(params, version, initialized=True, suspendable=asks)
                if read is None:
                    return False
                session = front.named.session(request, meta, principal)
                if asks:
                    unnamed = session_name(request, meta, None) is None  # a session of its own
                    bound = call_binding(unnamed, session.id, params["name"], read.arguments)
                    running = self._run_suspendable(read, session, capabilities, bound)
                else:
                    running = self._run_muted(read, session)
                sse = not self._manager.json_response  # the SDK's SSE mode: a slow read's answer streams
                await self._fast.modern_answers.write(data["id"], running, sse, exchange)
        finally:
            if ref is not None and ref.ephemeral:
                ref.end()  # a request that named no session was its own session: its pooled legs go back
        return True

    async def _run_suspendable(
        self, read: Read, session: Session, capabilities: ClientCapabilities | None, bound: tuple[str, str, str]
    ) -> dict[str, Any]:
        """The read as the SDK's path runs a 2026-07-28 call of a client that can be asked: a call the
        front's `Suspensions` host, which comes back `input_required` if its backend asks, and which the
        client's retry (on the SDK's path: it carries a `requestState`) resumes."""
        front = self._front
        # Unstamped: a call resumed on the SDK's path ends there, and its runner stamps what it returns.
        run = functools.partial(self._fast.run, read, session, stamp=False)
        outcome = await front.suspensions.call(session, capabilities, bound, run, front.audit_relay(session))
        if isinstance(outcome, InputRequiredResult):
            return self._fast.waiting(outcome, read.version)
        return self._fast.stamped(cast(dict[str, Any], outcome))

    async def _run_muted(self, read: Read, session: Session) -> dict[str, Any]:
        token = CALLER.set(mute_link(session))  # only a suspended call can ask this era
        try:
            return await self._fast.run(read, session)
        finally:
            CALLER.reset(token)


@asynccontextmanager
async def _hosting(needed: bool) -> AsyncIterator[anyio.abc.TaskGroup | None]:
    """Where a read's SSE stream is written once its backend asks (a client that can be asked)."""
    if not needed:
        yield None
        return
    async with anyio.create_task_group() as host:
        yield host


def _request_of(body: bytes, parse: Callable[[bytes], Any]) -> dict[str, Any] | None:
    """The body, read by the parser the SDK's path would read it with, as one well-formed `tools/call`
    request; or None."""
    if b'"tools/call"' not in body:
        return None
    try:
        data = parse(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.keys() != _REQUEST_KEYS or data["jsonrpc"] != "2.0":
        return None
    if data["method"] != "tools/call" or not _is_id(data["id"]) or not isinstance(data["params"], dict):
        return None
    return data


def _is_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _capabilities(declared: object) -> ClientCapabilities | None:
    if isinstance(declared, ClientCapabilities) or declared is None:
        return declared
    try:
        return ClientCapabilities.model_validate(declared)
    except ValueError:
        return None


def _param_rejected(front: McpFront, request: Request, params: Mapping[str, Any]) -> bool:
    """Whether the SDK would refuse this call's `Mcp-Param-*` headers (checked as it checks them)."""
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, Mapping):
        return True
    if not arguments and not any(name.startswith(_PARAM_PREFIX) for name in request.headers):
        return False
    name = params.get("name")
    schema = input_schema(front, name) if isinstance(name, str) else None
    if schema is None:
        return False
    return validate_mcp_param_headers(schema, arguments or {}, request.headers) is not None


def _sse_template() -> list[tuple[bytes, bytes]]:
    """The headers the transport's `EventSourceResponse` sends for a POST's stream, the session's id
    left empty (made once: building the response object for each read costs more than the read's JSON)."""
    headers = {
        "Cache-Control": "no-cache, no-transform",
        "Connection": "keep-alive",
        "Content-Type": "text/event-stream",
        _SESSION_ID: "",
    }
    return list(EventSourceResponse(content=iter(()), headers=headers).raw_headers)


_SSE_HEADERS = _sse_template()


def _sse_headers(session_id: str) -> list[tuple[bytes, bytes]]:
    named = session_id.encode("latin-1")
    return [(name, named if name == _SESSION_ID.encode() else value) for name, value in _SSE_HEADERS]


def _json_headers(session_id: str, length: int) -> list[tuple[bytes, bytes]]:
    """The headers Starlette's `Response` sends for the transport's JSON answer (made here: building the
    response object for each read costs more than the read's JSON)."""
    return [
        (b"content-type", CONTENT_TYPE_JSON.encode()),
        (_SESSION_ID.encode(), session_id.encode("latin-1")),
        (b"content-length", str(length).encode()),
    ]


async def _send_whole(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def _replaying(first: Message, receive: Receive) -> Receive:
    taken = [first]

    async def replay() -> Message:
        return taken.pop() if taken else await receive()

    return replay


def _json_content(request: Request) -> bool:
    """The handshake-era transport's own Content-Type check (`_check_content_type`): one of the type's
    comma-separated parts, before any parameter, is exactly `application/json`."""
    kind = request.headers.get("content-type", "").split(";")[0]
    return any(part.strip() == CONTENT_TYPE_JSON for part in kind.split(","))


__all__ = ["LeanHttp", "install"]
