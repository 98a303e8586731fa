"""A client session of the front as the backends see it (`backends/session_legs.py`): who it is,
what it declared, how to ask it something outside any call, and when it ends.

A handshake-era HTTP client session gets a `SessionRef` on its first request after the handshake,
kept in its connection's state and ended with it; its backend sessions are its own. A 2026-07-28
client gets one per named session, or per request, ended with it (`ClientSessions`): it is used only where such a
client reaches a backend in the handshake era. The stdio front's one client has none: the backends'
shared sessions are its own. A
client's `notifications/roots/list_changed` is passed to its own backend sessions, or, for the
stdio front's one client, to the shared handshake-era ones (which then ask it for its roots).
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.backends.session_legs import SessionRef
from mcp_spec_proxy.fronts.relay import connection_link
from mcp_spec_proxy.principal import principal_of
from mcp_spec_proxy.sdk import server_connection
from mcp_spec_proxy.sessions.named_sessions import MAX_NAMED_SESSIONS, session_name
from mcp_spec_proxy.tools.catalog import digest

if TYPE_CHECKING:
    from mcp_spec_proxy.fronts.mcp import McpFront

logger = logging.getLogger(__name__)

_SESSION_REF = "mcp-spec-proxy/session-ref"


class ClientSessions:
    """The front's 2026-07-28 client sessions as the backends see them, by session name (and principal).

    A 2026-07-28 client reaches a backend that speaks only the handshake era on a handshake-era
    session, which keeps state per session: it gets one of its own, as a handshake-era client
    does. A named session's is kept while the name is (the least recently used forgotten past
    `MAX_NAMED_SESSIONS`); a request that names none is a session of its own, lent a warm
    backend session of its principal's pool until it ends (`SessionLegs`; a call it left suspended
    keeps that session to itself until the call ends)."""

    def __init__(self, needed: bool) -> None:
        self.needed = needed  # some backend keeps a session per client session: else none is made
        self._named: OrderedDict[str, SessionRef] = OrderedDict()

    def modern(self, request: object, meta: object, capabilities: types.ClientCapabilities | None) -> SessionRef:
        """The session a 2026-07-28 request (its HTTP request, `_meta` and declared capabilities) names."""
        principal = principal_of(request)
        name = session_name(request, meta, principal)
        if name is None:
            return SessionRef(f"request-{secrets.token_hex(8)}", capabilities, ephemeral=True, principal=principal)
        ref = self._named.pop(name, None) or SessionRef(f"named-{digest(name)[:16]}", capabilities, principal=principal)
        self._named[name] = ref
        while len(self._named) > MAX_NAMED_SESSIONS:
            self._named.popitem(last=False)[1].end()
        return ref


def session_ref(front: McpFront, ctx: ServerRequestContext[Any, Any]) -> SessionRef | None:
    """The HTTP client session a request belongs to, as the backends see it (made once per
    session, ended with it); None for the stdio front's one client."""
    if not front.client_sessions.needed or front.stdio_session is not None or ctx.request_id is None:
        return None
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return front.client_sessions.modern(ctx.request, ctx.meta, ctx.session.client_capabilities)
    connection = server_connection(ctx)
    if connection.session_id is None or not connection.initialize_accepted:
        return None
    ref = connection.state.get(_SESSION_REF)
    if not isinstance(ref, SessionRef):
        session = front.session_for(ctx)
        ttl = front.proxy.config.review.timeout
        link = connection_link(session, connection, front.audit_relay(session), ttl, front.asked)
        hear = partial(front.notices.notice, only=connection)
        principal = principal_of(ctx.request)  # the session answers only the principal that opened it
        ref = SessionRef(
            connection.session_id, connection.client_capabilities, link=link, hear=hear, principal=principal
        )
        connection.state[_SESSION_REF] = ref
        connection.exit_stack.callback(ref.end)
    return ref


def established(connection: Connection) -> SessionRef | None:
    """The client session of a handshake-era connection, once a request of its own has made it."""
    ref = connection.state.get(_SESSION_REF)
    return ref if isinstance(ref, SessionRef) else None


def adopt_stdio(front: McpFront) -> None:
    """The stdio front's one client is the client of every shared backend session: what a backend
    asks outside any call (its roots after the handshake) is asked of it."""
    session, connection = front.stdio_session, front.stdio_connection
    if session is None or connection is None:
        return
    link = connection_link(
        session, connection, front.audit_relay(session), front.proxy.config.review.timeout, front.asked
    )
    for backend in front.proxy.backends.backends.values():
        backend.relay.fallback = link


def install(front: McpFront) -> ClientSessions:
    """Pass each client's `notifications/roots/list_changed` to the backend sessions that serve it;
    the front's 2026-07-28 sessions as the backends see them."""

    async def roots_changed(ctx: ServerRequestContext[Any, Any], params: types.NotificationParams) -> None:
        ref = server_connection(ctx).state.get(_SESSION_REF)
        for backend in front.proxy.backends.connected():
            try:
                if isinstance(ref, SessionRef) and backend.sessions is not None:
                    await backend.sessions.roots_changed(ref)
                elif front.stdio_session is not None:  # the one client: the shared sessions are its own
                    await backend.roots_changed()
            except Exception:  # boundary: one backend that cannot be told must not keep it from the others
                logger.debug("could not tell backend %r the client's roots changed", backend.name, exc_info=True)
            await anyio.lowlevel.checkpoint()

    front.server.add_notification_handler("notifications/roots/list_changed", types.NotificationParams, roots_changed)
    return ClientSessions(any(backend.sessions is not None for backend in front.proxy.backends.backends.values()))


__all__ = ["ClientSessions", "adopt_stdio", "install", "session_ref"]
