"""The MCP front over streamable HTTP at `/mcp`, both protocol eras.

DNS-rebinding protection is always on (the Host and Origin must name this server; `allowed_hosts`
adds names). With a token every request must carry `Authorization: Bearer <token>`; with the
config's `auth:` the front is an OAuth resource server instead (`identity.py`): each request
carries its principal's JWT, and each session belongs to the principal that opened it.

SSE streams can be resumed (`ResumableEvents`): each stream is primed with an event id and a
`retry` field, and a client that reconnects with `Last-Event-ID` gets what it missed, as the
servers behind the proxy offer. Resumption is bound to the session that owns the stream: each
session's transport stores and replays through its own view (`SessionEvents`), so an event id of
another session names nothing there — a client with a session of its own cannot read another
session's results by their event ids, even when it learns one — and two sessions' streams of the
same request id stay apart. Event ids are random besides, and the store is bounded: the most
recent `MAX_EVENTS`, `MAX_EVENT_BYTES` and `EVENT_TTL_S`, over all sessions.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import OrderedDict

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.transport_security import TransportSecuritySettings
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.calls.drain import Drain
from mcp_spec_proxy.errors import SHUTTING_DOWN
from mcp_spec_proxy.fronts import lean_http
from mcp_spec_proxy.fronts.asgi import BearerToken, host_names
from mcp_spec_proxy.fronts.identity import auth_settings, metadata_routes
from mcp_spec_proxy.fronts.introspection import token_verifier
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.fronts.probes import Door
from mcp_spec_proxy.sdk import event_store_per_session

logger = logging.getLogger(__name__)

MAX_EVENTS = 4096
MAX_EVENT_BYTES = 32 * 1024 * 1024
EVENT_TTL_S = 300.0
RETRY_MS = 1000  # what a primed stream tells its client to wait before it reconnects


class ResumableEvents:
    """The SSE events of the last few minutes, so a dropped stream can be resumed (bounded). Each
    session reaches only its own events, through the view `session()` gives it."""

    def __init__(self) -> None:
        # event id -> (its stream: (session view, stream id), message, its size, when); oldest first.
        self._events: OrderedDict[str, tuple[_Stream, types.JSONRPCMessage | None, int, float]] = OrderedDict()
        self._streams: dict[_Stream, list[str]] = {}  # each stream's event ids, in order
        self._bytes = 0

    def session(self) -> SessionEvents:
        """A new session's view of the store: what it stores, only it can replay."""
        return SessionEvents(self)

    def store(self, stream: _Stream, message: types.JSONRPCMessage | None) -> EventId:
        event_id = secrets.token_urlsafe(16)
        size = len(message.model_dump_json(by_alias=True, exclude_none=True)) if message is not None else 0
        self._events[event_id] = (stream, message, size, time.monotonic())
        self._streams.setdefault(stream, []).append(event_id)
        self._bytes += size
        self._trim()
        return event_id

    async def replay(self, owner: SessionEvents, last_event_id: EventId, send: EventCallback) -> StreamId | None:
        event = self._events.get(last_event_id)
        if event is None or event[0][0] is not owner:
            return None  # unknown, forgotten, or another session's: nothing to resume
        stream = event[0]
        ids = self._streams.get(stream, [])
        for event_id in ids[ids.index(last_event_id) + 1 :]:
            message = self._events[event_id][1]
            if message is not None:
                await send(EventMessage(message, event_id))
        return stream[1]

    def _trim(self) -> None:
        horizon = time.monotonic() - EVENT_TTL_S
        while self._events and (
            len(self._events) > MAX_EVENTS
            or self._bytes > MAX_EVENT_BYTES
            or next(iter(self._events.values()))[3] < horizon
        ):
            event_id, (stream, _message, size, _when) = self._events.popitem(last=False)
            self._bytes -= size
            ids = self._streams.get(stream)
            if ids:
                ids.remove(event_id)  # the oldest of its stream: at the front
                if not ids:
                    del self._streams[stream]


class SessionEvents(EventStore):
    """One session's events in the shared store: stored under this view, replayed only through it
    (its transport holds it; `sdk.event_store_per_session` gives each session's transport one)."""

    def __init__(self, store: ResumableEvents) -> None:
        self._store = store

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        return self._store.store((self, stream_id), message)

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        return await self._store.replay(self, last_event_id, send_callback)


_Stream = tuple[SessionEvents, StreamId]


def http_app(front: McpFront, *, host: str, token: str | None, allowed_hosts: list[str] | None = None) -> ASGIApp:
    """The streamable HTTP app at `/mcp`, with DNS-rebinding protection always on, and the
    resource server's checks and metadata where the config has `auth:` (never with a token too)."""
    hosts = [f"{name}:*" for name in host_names(host, allowed_hosts or [])]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts],
    )
    events = ResumableEvents()
    auth = front.proxy.config.auth
    if auth is not None and token:
        raise ValueError("give either a bearer token or `auth:`, not both")  # the command line says so first
    app: ASGIApp = front.server.streamable_http_app(
        host=host,
        transport_security=security,
        event_store=events.session(),
        retry_interval=RETRY_MS,
        auth=auth_settings(auth) if auth is not None else None,
        token_verifier=token_verifier(auth, front.proxy.auth_secret) if auth is not None else None,
        custom_starlette_routes=metadata_routes(auth) if auth is not None else None,
    )
    event_store_per_session(front.server.session_manager, events.session)
    lean_http.install(front, front.server.session_manager)  # reads answered at the manager's door
    app = NoNewSessions(app, front.proxy.gate.drain)
    return BearerToken(app, token) if token else app


class NoNewSessions:
    """While the replica drains, an `initialize` (a new session) is refused: 503, Retry-After, and
    the proxy's -32016, so the client connects again and its load balancer picks another replica.
    A session already open goes on (its held calls, their answers, its own new calls refused one
    by one). Only a POST that names no session is read ahead, and only while draining."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self._app = app
        self._drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._drain.draining or scope["type"] != "http" or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        if any(name == b"mcp-session-id" for name, _ in scope.get("headers") or []):
            await self._app(scope, receive, send)
            return
        received: list[Message] = []
        body = b""
        while True:
            message = await receive()
            received.append(message)
            body += message.get("body", b"") if message["type"] == "http.request" else b""
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        request_id = _initialize_id(body)
        if request_id is not _NOT_INITIALIZE:
            why = (
                "this replica is shutting down and takes no new sessions — connect again"
                " (a load balancer routes you to another replica)"
            )
            error = {"jsonrpc": "2.0", "id": request_id, "error": {"code": SHUTTING_DOWN, "message": why}}
            await JSONResponse(error, status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
            return

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        await self._app(scope, replay, send)


_NOT_INITIALIZE = object()


def _initialize_id(body: bytes) -> object:
    """The id of the `initialize` request `body` holds, or `_NOT_INITIALIZE`."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return _NOT_INITIALIZE
    if isinstance(data, dict) and data.get("method") == "initialize":
        return data.get("id")
    return _NOT_INITIALIZE


async def serve_http(
    front: McpFront,
    host: str,
    port: int,
    *,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    door: Door | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve streamable HTTP until cancelled; `task_status.started(port)` once `/mcp` answers.

    `door` is the port's app already listening (the command opens it before the proxy starts, so
    `/readyz` answers "starting" meanwhile; `port` is then the port it bound); without one it is
    opened here. The probes and `/metrics` are served beside `/mcp` (`probes.py`)."""
    app = http_app(front, host=host, token=token, allowed_hosts=allowed_hosts)
    async with anyio.create_task_group() as tg:
        if door is None:
            door = Door(token=token, hosts=host_names(host, allowed_hosts or []))
            port = await tg.start(door.serve, host, port)
        # The 2026-07-28 calls waiting for their client's answers are hosted while `/mcp` serves, and
        # the pings of the lean lane's 2026-07-28 reads that outlast the SDK's window.
        async with (
            front.suspensions.hosting(),
            front.fast_read.modern_answers.hosting(),
            door.mounted(app, front.proxy),
        ):
            logger.info("serving streamable HTTP on http://%s:%d/mcp", host, port)
            task_status.started(port)
            await anyio.sleep_forever()
