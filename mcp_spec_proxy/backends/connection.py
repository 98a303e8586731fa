"""One supervised connection to one wrapped MCP server.

`Backend.run()` connects — in the handshake era (`protocol: legacy`, the default: a server's own
requests to the client, which the proxy relays, need its back-channel, and so do servers written
for it), or in 2026-07-28 where the server offers it (`protocol: auto`, and a server that refuses
the handshake) — lists its tools, prompts and resources, publishes them
through `on_listing`, and then waits for the connection to end. When it ends (the process exited,
the HTTP session died) calls in flight fail with `BackendClosed` and it reconnects (a stdio server
is started again): its listing stays published meanwhile, and a call that arrives waits for the
new connection on its own clock, so a reconnect is no window of "unknown tool". When an attempt
fails (it would not start, refused the handshake, timed out) the listing is withdrawn and it
tries again with exponential backoff. A backend never raises into its siblings: every failure is
logged with the fix and turned into "unavailable". A streamable HTTP request whose own connection
was lost fails alone, and the session goes on (`backends/http.py`).

Errors: a backend's own JSON-RPC error is raised as the `MCPError` it sent, whatever its code
(a backend may well answer -32000 or -32001 itself). Only what the proxy observed becomes its
own `BackendError`: its own clock running out (`anyio.fail_after` around the call — the SDK's
read timeout is not used, since it reports with the same code a backend may send), the
transport really ending or one HTTP request's connection lost (`http.GuardedClient`'s mark), the
transport's size bound (`raw.Oversized`): marks no backend can send.

Shutdown contract: cancelling `run()` closes the client, which closes the child's stdin, waits,
terminates and kills its process tree, all bounded and shielded inside the SDK's stdio
transport, so no child outlives the proxy.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from contextlib import AsyncExitStack
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp.client.auth import OAuthFlowError
from mcp.client.client import Client
from mcp.client.session import IncomingMessage
from mcp.client.subscriptions import ListenNotSupportedError, Subscription, SubscriptionLost
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import (
    CONNECTION_CLOSED,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.backends.era import era_of
from mcp_spec_proxy.backends.listing import Listing, OnListing, list_all
from mcp_spec_proxy.backends.notices import LogMessage, LogRoute, OnNotice, ResourceUpdate, admits
from mcp_spec_proxy.backends.oauth import BackendAuth, login_failure
from mcp_spec_proxy.backends.other_era import LIST_OF, OtherEra
from mcp_spec_proxy.backends.raw import (
    RawCalls,
)
from mcp_spec_proxy.backends.relay import Relay, as_declared
from mcp_spec_proxy.backends.requests import Requests
from mcp_spec_proxy.backends.session_legs import SessionLegs
from mcp_spec_proxy.backends.transports import WatchedTransport, open_transport
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.errors import (
    BackendError,
)
from mcp_spec_proxy.observe.stderr_log import StderrLog, last_error_line
from mcp_spec_proxy.prespawn import Prespawned
from mcp_spec_proxy.sdk import restamp_capabilities

logger = logging.getLogger(__name__)

BACKOFF_START = 0.5
REFRESH_INTERVAL_S = 0.25
BACKOFF_MAX = 30.0
OTHER_LEG_WAIT_S = 10.0
"""How long a backend's first listing waits for its other era's leg to come up (or not)."""
BACKOFF_MAX_UNCHANGED = 300.0
"""The retry interval's cap once attempts keep failing the same way (a command that does not
exist): such a backend is retried every few minutes, not every 30 s for ever."""


class Backend(Requests):
    """A wrapped server, kept connected. Build with `Backend(name, config, ...)`, then `run()`."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        on_listing: OnListing,
        *,
        log_dir: Path | None = None,
        in_process: Server[Any] | None = None,
        on_notice: OnNotice | None = None,
        early: Prespawned | None = None,
        auth: BackendAuth | None = None,
    ) -> None:
        self.name = name
        self.auth = auth  # its OAuth client (`auth:`): every session it opens carries it
        self._early = early  # the launcher's processes: this backend's first connection may adopt its own
        self.config = config
        self._on_listing = on_listing
        self._log_dir = log_dir
        self._in_process = in_process  # the in-memory twin: tests hand a Server instead of a command
        self._no_handshake = False  # it refused `initialize`: reached in the 2026-07-28 era from then on
        self.relay = Relay(name, config.relay.kinds())  # its requests to the client, to the calling client
        # Each client session's own backend session (`isolation: per_session`, URL backends' default).
        self.sessions = (
            SessionLegs(name, config, in_process, lambda: self._wake.set(), auth) if config.per_session else None
        )
        self._client: Client | None = None
        self._raw: RawCalls | None = None  # the fast path's channel while a stdio connection is up
        self._transport: WatchedTransport | None = None  # the current connection's, when not in-process
        # The other era's leg, where the server speaks both (URL backends, in-process twins): a
        # client is served in its own era (`backends/era.py`); its listing is kept beside the first's.
        self.other_era = OtherEra(name, config, in_process, self.relay, self._on_message, self._announce, auth)
        self._listing: Listing | None = None
        self._announced: set[str] = set()  # lists the server said changed since the last refresh
        self._wake = anyio.Event()  # set by a list_changed notification or the end of the stream
        self.connected = anyio.Event()
        self.first_attempt = anyio.Event()  # set once the first connect has succeeded or failed
        # Then "connected", "reconnecting" (it was, and will be), "login" (it waits for a person) or "unavailable".
        self.status = "starting"
        self._startup_left: float | None = None  # the startup clock's seconds left while a login stops it
        self._back = anyio.Event()  # set when a reconnect settles: connected again, or the attempt failed
        self._served = False  # whether the current attempt connected (its end is then no failed attempt)
        self.last_error: str | None = None
        self.restarts = 0
        self._exit_code: int | None = None  # of the last stdio process, once it has ended
        self._log_start = 0  # where the current attempt's stderr begins in its log file
        self._on_notice = on_notice
        # Kept across reconnects and applied to each new connection: the clients' last
        # logging/setLevel, and the URIs clients are subscribed to here.
        self.log_level: types.LoggingLevel | None = None
        self._watched: set[str] = set()
        self._rewatch = anyio.Event()  # set when `_watched` changes: a 2026-07-28 listen stream reopens
        self._heard: frozenset[str] = frozenset()  # the URIs the open listen stream's ack honoured
        self._heard_changed = anyio.Event()
        self._routes: set[LogRoute] = set()  # 2026-07-28 requests in flight here that opted in to logs

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What the connected server declared; None while it is not connected."""
        return self._client.server_capabilities if self._client is not None else None

    @property
    def instructions(self) -> str | None:
        """The connected server's own `instructions` (initialize or server/discover result)."""
        return self._client.instructions if self._client is not None else None

    @property
    def subscribable(self) -> bool:
        caps = self.capabilities
        return bool(caps is not None and caps.resources is not None and caps.resources.subscribe)

    # -- supervision -------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the backend connected until cancelled."""
        failures = 0
        told: str | None = None  # the failure last logged as a warning: a repeat is not logged again
        while True:
            self._served = False
            unchanged = False
            try:
                await self._session()
            except Exception as exc:  # boundary: any failure of one backend stays with that backend
                if self._served:  # it ran and its connection ended: its listing stays, calls wait
                    self.last_error = self._explain(exc)
                    logger.warning("%s — reconnecting; calls wait for it", self.last_error)
                else:
                    message = self._explain(exc)
                    unchanged = message == told
                    self._down(message, quiet=unchanged)
                    told = message
                    await self._on_listing(self.name, None)
            if self._served:
                failures = 0  # it ran; a later crash starts the backoff afresh
                told = None
            cap = BACKOFF_MAX_UNCHANGED if unchanged else BACKOFF_MAX
            delay = min(cap, BACKOFF_START * math.pow(2, failures))
            failures = min(failures + 1, 64)  # past the cap anyway; 2.0 ** 1024 overflows a float
            self.restarts += 1
            # The failure was said (once, while it stays the same), with what happens next: the schedule is detail.
            logger.debug("backend %r: reconnecting in %.1fs", self.name, delay)
            await anyio.sleep(delay)

    async def _session(self) -> None:
        # The handshake's deadline lives on a scope around the whole connection (lifted once
        # connected), because the client's own task groups must nest inside it.
        with anyio.CancelScope(deadline=anyio.current_time() + self.config.startup_timeout) as startup:
            async with AsyncExitStack() as stack:
                transport: WatchedTransport | None = None
                if self._in_process is not None:
                    target: Any = self._in_process
                else:
                    errlog = self._errlog(stack)
                    self._exit_code = None
                    if self.auth is not None:
                        self.auth.renew()  # reads the kept tokens again: a `login` may have run meanwhile
                        self.auth.on_login = partial(self._logging_in, startup)
                    transport = open_transport(
                        self.name,
                        self.config,
                        errlog,
                        on_end=lambda: self._wake.set(),
                        on_exit=self._exited,
                        early=self._early,
                        auth=self.auth.provider if self.auth is not None else None,
                    )
                    target = transport
                mode = "auto" if self._no_handshake else self.config.protocol
                client = Client(target, mode=mode, message_handler=self._on_message, **self.relay.callbacks())
                try:
                    await stack.enter_async_context(client)
                except MCPError as exc:
                    if mode != "legacy" or exc.code == CONNECTION_CLOSED:
                        raise
                    # A server with no initialize handshake (2026-07-28 only) is reached in its era.
                    self._no_handshake = True
                    raise BackendError(
                        self.name, f"refused the initialize handshake ({exc}); reconnecting in the 2026-07-28 era"
                    ) from None
                restamp_capabilities(client, as_declared)
                listing = await list_all(client)
                startup.deadline = math.inf
                await self._serve(client, transport, listing)
        if startup.cancelled_caught:
            raise BackendError(
                self.name,
                f"did not finish its handshake within {self.config.startup_timeout:g}s"
                f" — check that it starts by hand, or raise `startup_timeout`{self._log_hint()}",
            )

    async def _serve(self, client: Client, transport: WatchedTransport | None, listing: Listing) -> None:
        """Publish the listing (with the other era's leg's beside it, where the server has one),
        then keep it fresh until the connection ends; the listing outlives it (`run` withdraws it
        when an attempt to connect again fails)."""
        async with anyio.create_task_group() as legs:
            if self.sessions is not None:
                await legs.start(self.sessions.host)
            if self._in_process is not None or self.config.transport == "http":
                settled = anyio.Event()
                legs.start_soon(self.other_era.run, client, settled, self._republish)
                # Both eras' tools are first seen together (one seen later is held as new); a leg
                # slower than this joins later.
                with anyio.move_on_after(min(self.config.startup_timeout, OTHER_LEG_WAIT_S)):
                    await settled.wait()
            try:
                await self._connected(client, transport, listing)
            finally:
                legs.cancel_scope.cancel()

    async def _connected(self, client: Client, transport: WatchedTransport | None, listing: Listing) -> None:
        self._served = True
        self._client = client
        self._transport = transport
        self._raw = transport.raw if transport is not None else None
        self.status = "connected"
        self.last_error = None
        self.connected.set()
        self.first_attempt.set()
        logger.info(
            "backend %r connected (%s, protocol %s, %d tools)",
            self.name,
            self.config.transport,
            client.protocol_version,
            len(listing.tools),
        )
        try:
            await self._publish(listing)
            await self._restore(client)
            self._back.set()  # calls that waited for this connection go out on it
            async with anyio.create_task_group() as tg:
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    tg.start_soon(self._listen, client)
                last_refresh = -math.inf
                while True:
                    await self._wake.wait()
                    if transport is not None and transport.ended.is_set():
                        raise BackendError(self.name, f"exited or closed its connection{self._log_hint()}")
                    # A flood of list_changed notifications becomes at most a few refreshes a second.
                    pause = last_refresh + REFRESH_INTERVAL_S - anyio.current_time()
                    if pause > 0:
                        with anyio.move_on_after(pause):
                            await (transport.ended.wait() if transport is not None else anyio.sleep_forever())
                    self._wake = anyio.Event()
                    if transport is not None and transport.ended.is_set():
                        raise BackendError(self.name, f"exited or closed its connection{self._log_hint()}")
                    last_refresh = anyio.current_time()
                    announced, self._announced = frozenset(self._announced), set()
                    with anyio.fail_after(self.config.timeout):
                        listing = await list_all(client, refresh=True)
                        await self.other_era.relist()
                    await self._publish(listing, announced)
        finally:
            self._client = None
            self._listing = None
            self._transport = None
            self._raw = None
            self.connected = anyio.Event()
            self.status = "reconnecting"
            self._back = anyio.Event()

    async def _publish(self, listing: Listing, announced: frozenset[str] = frozenset()) -> None:
        """Publish the first leg's listing, with what only the other era's leg lists beside it;
        `announced`: the lists the server said changed (clients are told, changed here or not)."""
        self._listing = listing
        other, other_listing = self.other_era.client, self.other_era.listing
        client = self._client
        if other is not None and other_listing is not None and client is not None:
            era, other_era = era_of(client.protocol_version), era_of(other.protocol_version)
            listing = listing.beside(other_listing, era, other_era)
        if announced:
            listing = dataclasses.replace(listing, announced=announced)
        await self._on_listing(self.name, listing)

    async def _republish(self) -> None:
        if self._listing is not None and self._client is not None:
            await self._publish(self._listing)

    def _announce(self, what: str) -> None:
        self._announced.add(what)
        self._wake.set()

    async def _restore(self, client: Client) -> None:
        """Give a fresh connection the log level and the handshake-era subscriptions the clients
        asked for before it (a 2026-07-28 server's subscriptions ride `_listen`'s stream)."""
        try:
            await self._apply_level(client)
            if client.protocol_version not in MODERN_PROTOCOL_VERSIONS and self.subscribable:
                for uri in sorted(self._watched):
                    await client.session.send_request(
                        types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult
                    )
        except MCPError as exc:
            logger.warning("backend %r: could not restore its log level or subscriptions: %s", self.name, exc)

    async def _listen(self, client: Client) -> None:
        """2026-07-28 servers announce list changes and resource updates on a listen stream
        instead of notifications: one stream, reopened whenever the watched URIs change."""
        lists = _announces_changes(client)
        while True:
            rewatch = self._rewatch = anyio.Event()
            uris = sorted(self._watched) if self.subscribable else []
            if not lists and not uris:
                await rewatch.wait()
                continue
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_on, rewatch, tg.cancel_scope)
                    async with client.listen(
                        tools_list_changed=lists,
                        prompts_list_changed=lists,
                        resources_list_changed=lists,
                        resource_subscriptions=uris,
                    ) as subscription:
                        self._heard = frozenset(subscription.honored.resource_subscriptions or ())
                        self._heard_changed.set()
                        self._heard_changed = anyio.Event()
                        await self._hear(subscription)
                    tg.cancel_scope.cancel()
            except (MCPError, SubscriptionLost, ListenNotSupportedError, TimeoutError) as exc:
                logger.info("backend %r: no change subscription (%s); its lists refresh on reconnect", self.name, exc)
            if not rewatch.is_set():
                await rewatch.wait()  # the stream ended by itself: reopen only when there is something new

    async def _hear(self, subscription: Subscription) -> None:
        async for event in subscription:
            if not isinstance(event, ResourceUpdated):  # updates arrive as notifications too (`_on_message`)
                self._announce(LIST_OF[type(event)])

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(
            message,
            types.ToolListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceListChangedNotification,
        ):
            logger.info("backend %r: %s", self.name, message.method)
            self._announced.add(message.method.split("/")[1])
            self._wake.set()
        elif isinstance(message, types.LoggingMessageNotification):
            log = LogMessage(self.name, message.params)
            for route in list(self._routes):
                if admits(route.level, log.params.level):
                    await route.deliver(log)
            if self._on_notice is not None:
                await self._on_notice(log)
        elif isinstance(message, types.ResourceUpdatedNotification) and self._on_notice is not None:
            await self._on_notice(ResourceUpdate(self.name, message.params.uri))
        await anyio.lowlevel.checkpoint()

    def _logging_in(self, startup: anyio.CancelScope, waiting: bool) -> None:
        """A login began (True) or ended: the startup clock stops while a person logs in, and the
        pool stops waiting for this backend (its tools come as a list change once it connects)."""
        if waiting:
            self._startup_left = startup.deadline - anyio.current_time()
            startup.deadline = math.inf
            if self._client is None:
                self.status = "login"
                self.first_attempt.set()
        elif self._startup_left is not None:
            startup.deadline = anyio.current_time() + self._startup_left
            self._startup_left = None

    def _explain(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]  # the SDK's task groups wrap the one failure that matters
        if isinstance(exc, BackendError):
            return str(exc)
        if isinstance(exc, OAuthFlowError):
            told = login_failure(exc)
            return f"backend '{self.name}' could not log in: {told} — `mcp-spec-proxy login {self.name}` logs in anew"
        if isinstance(exc, OSError):
            return f"backend '{self.name}' failed to start: {exc.strerror or exc}{self._log_hint()}"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED and self._exit_code is not None:
            # The process ended during the handshake: say how, not "refused".
            how = f"with code {self._exit_code}" if self._exit_code >= 0 else f"on signal {-self._exit_code}"
            said = self._last_stderr_line()
            said = f"; its {said}" if said else ""
            return f"backend '{self.name}' exited {how} during startup{said}{self._log_hint()}"
        if isinstance(exc, MCPError):
            return f"backend '{self.name}' refused the connection: {exc}{self._log_hint()}"
        return f"backend '{self.name}' failed: {type(exc).__name__}: {exc}{self._log_hint()}"

    def _down(self, message: str, *, quiet: bool = False) -> None:
        self.first_attempt.set()
        self.status = "unavailable"
        self._back.set()  # calls that waited for a reconnect learn it failed
        if self.config.hint:
            message = f"{message} — {self.config.hint}"
        self.last_error = message
        if quiet:  # said already: the same failure again
            logger.debug("%s (again)", message)
            return
        logger.warning(
            "%s — its tools are unavailable until it connects; retrying in the background, less and less often"
            " (up to every %.0f min), and saying so again only if the failure changes",
            message,
            BACKOFF_MAX_UNCHANGED / 60,
        )

    def _errlog(self, stack: AsyncExitStack) -> TextIO:
        if self._log_dir is None:
            return sys.stderr
        self._log_dir.mkdir(parents=True, exist_ok=True)
        path = self._log_dir / f"{self.name}.log"
        self._log_start = path.stat().st_size if path.exists() else 0
        handle = StderrLog(path)
        stack.push_async_callback(_close_stderr, handle)
        return handle

    def _exited(self, code: int | None) -> None:
        self._exit_code = code

    def _last_stderr_line(self) -> str:
        return last_error_line(self._log_path, self._log_start) if self._log_path is not None else ""

    @property
    def _log_path(self) -> Path | None:
        return self._log_dir / f"{self.name}.log" if self._log_dir is not None else None

    def _log_hint(self) -> str:
        return f" (its stderr is in {self._log_path})" if self._log_path is not None else ""


async def _close_stderr(log: StderrLog) -> None:
    log.close()  # at once, cancelled or not: the pipe's write end must not outlive the attempt
    with anyio.CancelScope(shield=True):  # the attempt's last lines reach the file before it is read back
        await anyio.to_thread.run_sync(log.drain)


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _announces_changes(client: Client) -> bool:
    caps = client.server_capabilities
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS and any(
        cap is not None and cap.list_changed for cap in (caps.tools, caps.prompts, caps.resources)
    )
