"""What the backends tell the clients unasked, relayed in each client's era: log messages and
resource updates, and the subscriptions that ask for the updates.

Log messages (`notifications/message`), `logger` set to the server's name (`<server>` or
`<server>/<its logger>`), level and data as the backend sent them:
* handshake era: to every client connection the front has served, once it admits the level
  (the level its own `logging/setLevel` asked for; every level before it asked);
* 2026-07-28 era: on the client's own request, when that request opted in with `_meta`
  `io.modelcontextprotocol/logLevel`: the opt-in travels on the forwarded call, and the
  backend's messages while that call is in flight come back on the request (`route`). A
  backend's log stream is one per backend, so a message one call caused reaches every request
  in flight at that backend that asked for logs at its level.

Resource updates: a client subscribes (`resources/subscribe` in the handshake era, a
`subscriptions/listen` with `resourceSubscriptions` in the 2026-07-28 era) to a URI the catalog
gives one owner (`Catalog.resource_owner`); the proxy subscribes once at that backend while any
client listens, and relays the backend's `notifications/resources/updated` for that URI to the
clients subscribed to it. An update for a URI that backend does not own is dropped: a backend
cannot make clients re-read another server's resources.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, SubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.backends import LogMessage, LogRoute, Notice, ResourceUpdate
from mcp_spec_proxy.backends.era import CLIENT_ERA
from mcp_spec_proxy.backends.notices import LEVELS, admits
from mcp_spec_proxy.errors import ProxyError, ToolNotFound
from mcp_spec_proxy.principal import Principal, principal_of

if TYPE_CHECKING:
    from mcp_spec_proxy.proxy import Proxy

logger = logging.getLogger(__name__)

Ctx = ServerRequestContext[Any, Any]
NOTIFY_TIMEOUT_S = 2.0  # a client that does not read must not hold up the backend's messages to the others


class Notices:
    def __init__(self, proxy: Proxy, bus: SubscriptionBus) -> None:
        self._proxy = proxy
        self._bus = bus
        self._listen = ListenHandler(bus)
        self._hearing: weakref.WeakSet[Connection] = weakref.WeakSet()  # handshake-era clients
        self._levels: weakref.WeakKeyDictionary[Connection, types.LoggingLevel] = weakref.WeakKeyDictionary()
        self._subscribers: dict[str, weakref.WeakSet[Connection]] = {}  # handshake era, by URI
        self._listeners: dict[str, int] = {}  # 2026-07-28 listen streams, by URI
        self._owners: dict[str, str] = {}  # the server each watched URI is subscribed at
        proxy.notices.append(self.notice)

    # -- clients -----------------------------------------------------------------------------

    def hear(self, connection: Connection) -> None:
        """Let a handshake-era connection hear the backends' log messages."""
        if connection.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._hearing.add(connection)

    async def set_level(
        self, connection: Connection, session: str, level: types.LoggingLevel, principal: Principal | None = None
    ) -> None:
        self.hear(connection)
        self._levels[connection] = level
        await self._proxy.gate.reads.set_logging_level(session, level, principal)

    def route(self, ctx: Ctx) -> LogRoute | None:
        """Where a 2026-07-28 request's log messages go, when it opted in; None otherwise."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        level = (ctx.meta or {}).get(LOG_LEVEL_META_KEY)
        if level not in LEVELS:
            return None
        session = ctx.session
        request_id = ctx.request_id

        async def deliver(message: LogMessage) -> None:
            notification = types.LoggingMessageNotification(params=_relayed(message))
            try:
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    await session.send_notification(notification, related_request_id=request_id)
            except Exception:  # boundary: a request that has finished or whose client went away
                logger.debug("could not relay a log message to a request", exc_info=True)

        return LogRoute(level, deliver)

    # -- subscriptions -----------------------------------------------------------------------

    async def subscribe(
        self, connection: Connection, session: str, uri: str, principal: Principal | None = None
    ) -> None:
        subscribers = self._subscribers.setdefault(uri, weakref.WeakSet())
        if connection in subscribers:
            return
        await self._watch(session, uri, principal)
        subscribers.add(connection)

    async def unsubscribe(
        self, connection: Connection, session: str, uri: str, principal: Principal | None = None
    ) -> None:
        subscribers = self._subscribers.get(uri)
        if subscribers is None or connection not in subscribers:
            return
        subscribers.discard(connection)
        await self._unwatch(session, uri, principal)

    async def listen(self, ctx: Ctx, params: types.SubscriptionsListenRequestParams) -> types.SubscriptionsListenResult:
        """`subscriptions/listen`: the SDK's stream, with the proxy subscribed at the owning backend
        of each resource the stream asks for while it is open."""
        watched: list[str] = []
        principal = principal_of(ctx.request)  # only a token the front verified names one
        try:
            for uri in params.notifications.resource_subscriptions or []:
                try:
                    await self._watch("listen", uri, principal)
                except (ProxyError, MCPError) as exc:
                    logger.info("listen: not watching %s: %s", uri[:500], exc)
                    continue
                self._listeners[uri] = self._listeners.get(uri, 0) + 1
                watched.append(uri)
            return await self._listen(ctx, params)
        finally:
            with anyio.CancelScope(shield=True):
                for uri in watched:
                    self._listeners[uri] -= 1
                    await self._unwatch("listen", uri, principal)

    def _watchers(self, uri: str) -> int:
        return len(self._subscribers.get(uri, ())) + self._listeners.get(uri, 0)

    async def _watch(self, session: str, uri: str, principal: Principal | None) -> None:
        if self._watchers(uri):
            return  # the proxy is subscribed there already
        owner = self._proxy.catalog.resource_owner(uri)
        if not self._proxy.backends.get(owner).subscribable_in(CLIENT_ERA.get()):
            raise ToolNotFound(f"server {owner!r}, which serves {uri!r}, does not support subscriptions")
        await self._proxy.gate.reads.subscribe(session, owner, uri, principal)
        self._owners[uri] = owner

    async def _unwatch(self, session: str, uri: str, principal: Principal | None) -> None:
        if self._watchers(uri) or uri not in self._owners:
            return
        self._subscribers.pop(uri, None)
        owner = self._owners.pop(uri)
        try:
            await self._proxy.gate.reads.unsubscribe(session, owner, uri, principal)
        except Exception as exc:  # boundary: the client is unsubscribed whatever the backend says
            logger.info("backend %r: resources/unsubscribe %s failed: %s", owner, uri[:500], exc)

    # -- what the backends send --------------------------------------------------------------

    async def notice(self, notice: Notice, only: Connection | None = None) -> None:
        """`notice` to the clients that hear it; `only`: to that client alone (a log line of its own
        backend session)."""
        if isinstance(notice, LogMessage):
            params = _relayed(notice).model_dump(by_alias=True, mode="json", exclude_none=True)
            hearing = [c for c in self._hearing if only is None or c is only]
            await self._notify(
                [c for c in hearing if admits(self._levels.get(c), notice.params.level)],
                "notifications/message",
                params,
            )
        elif isinstance(notice, ResourceUpdate):
            await self._updated(notice)

    async def _updated(self, update: ResourceUpdate) -> None:
        if self._owners.get(update.uri) != update.server:
            logger.debug("dropped an update of %s from %r: not its subscription", update.uri[:500], update.server)
            return
        if self._listeners.get(update.uri):
            await self._bus.publish(ResourceUpdated(uri=update.uri))
        await self._notify(
            list(self._subscribers.get(update.uri, ())), "notifications/resources/updated", {"uri": update.uri}
        )

    async def _notify(self, connections: list[Connection], method: str, params: dict[str, Any]) -> None:
        for connection in connections:
            try:
                with anyio.move_on_after(NOTIFY_TIMEOUT_S):
                    await connection.outbound.notify(method, params)
            except Exception:  # boundary: a client that went away must not stop the others hearing
                logger.debug("could not send %s to a client", method, exc_info=True)
                self._hearing.discard(connection)


def _relayed(message: LogMessage) -> types.LoggingMessageNotificationParams:
    return message.params.model_copy(update={"logger": message.logger})
