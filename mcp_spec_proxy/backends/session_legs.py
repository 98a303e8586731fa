"""Each client session's own backend session, where the backend keeps per-session state.

A handshake-era server keeps state per session: the roots and capabilities its client declared,
the resources it made for that session, what it asked the client. Shared by every client of the
proxy, one client would see another's state, be refused what its own capabilities allow, and a
server's question during a call could not be told apart from another client's. So under
`isolation: per_session` (the default for URL backends) each handshake-era client session of the
HTTP front gets a backend session of its own, opened on its first request that reaches the server
and kept until the client's session ends (`SessionRef.ended`), it goes unused for `IDLE_S`, or more
than `MAX_LEGS` sessions want one (the least recently used goes first). Its handshake declares only
the sampling, elicitation and roots its client declared, and what the backend asks on it goes to
that client alone (its own `Relay`). A leg is opened once per client session, never per request.

Under `auth:` on the backend and at the front, a principal's sessions carry that principal's own
tokens, never the operator's login nor another person's: a principal with no login is refused in one
line naming the URL to log in at, and the login completes in the background (`BackendAuth.for_principal`).

A 2026-07-28 request that names no session (`SessionRef.ephemeral`) is a session of its own, but
opening a backend session for each one costs a handshake a read. Such requests take a *pooled*
leg instead: one of a few warm sessions kept per (principal, capabilities the client declared),
lent to one request at a time and given back when the request ends (`SessionRef.end`). A leg
lent to one request serves no other, so what the backend asks during a call (sampling,
elicitation) reaches that request's own client; one given back with a call still in flight (a
call suspended for the client's answer) is closed once that call ends, never lent again. A call
that outlives its request (suspended, then resumed by the client's retry) and reaches a backend
only then is lent a leg for that call alone, given back when the call ends. A
principal's pooled legs carry their own tokens and are never lent to anyone else. A client that
declared roots keeps a leg of its own per request: a server may keep the roots it was told for
the whole session.

The stdio front's one client, and every 2026-07-28 client of a backend that speaks that era (it
keeps no session state on the server), use the backend's shared legs: a desktop client costs
nothing extra.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import math
import secrets
import sys
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.client import Client
from mcp.client.session import IncomingMessage

from mcp_spec_proxy.backends.era import CLIENT_ERA
from mcp_spec_proxy.backends.notices import LogMessage, Notice, request_logs
from mcp_spec_proxy.backends.oauth import BackendAuth
from mcp_spec_proxy.backends.relay import CALLER, CLIENT_ANSWERS, ClientLink, Kind, Relay, as_declared
from mcp_spec_proxy.backends.transports import WatchedTransport, open_transport
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.errors import BackendUnavailable
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.sdk import restamp_capabilities

logger = logging.getLogger(__name__)

MAX_LEGS = 256
"""Backend sessions of one server at once; past it the least recently used is closed."""
IDLE_S = 600.0
"""A backend session unused this long is closed (its client's next request opens another)."""
POOL_IDLE = 4
"""Pooled legs kept idle per (principal, capabilities); one given back past it is closed."""
BUSY_CHECK_S = 1.0
"""How often a session whose client has gone, with a call still in flight, looks again."""


@dataclass(eq=False)
class SessionRef:
    """A client session of the front, as the backends see it: who, what it declared, when it ends."""

    id: str
    capabilities: types.ClientCapabilities | None
    ended: anyio.Event = field(default_factory=anyio.Event)
    link: ClientLink | None = None  # its client, for what a backend asks outside any call
    hear: Callable[[Notice], Awaitable[None]] | None = None  # its client alone, for what its sessions log
    ephemeral: bool = False  # one request's (a 2026-07-28 request that named no session)
    principal: Principal | None = None  # who the front verified it as (under `auth:`); None: nobody identified
    on_end: list[Callable[[], None]] = field(default_factory=list)  # what `end` gives back (its pooled legs)

    def end(self) -> None:
        """The client session is over: its own legs close, the pooled legs it was lent go back."""
        self.ended.set()
        given, self.on_end[:] = list(self.on_end), []
        for give_back in given:
            give_back()


CLIENT_SESSION: contextvars.ContextVar[SessionRef | None] = contextvars.ContextVar(
    "mcp_spec_proxy.client_session", default=None
)


ASKING: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("mcp_spec_proxy.asking", default=None)
"""Who the front verified the request as (under `auth:`); None where it identifies nobody."""


@contextmanager
def serving(ref: SessionRef | None, principal: Principal | None = None) -> Iterator[None]:
    """Around one request of the client session `ref` (None: one that has no backend sessions),
    asked by `principal`."""
    token, asking = CLIENT_SESSION.set(ref), ASKING.set(principal)
    try:
        yield
    finally:
        ASKING.reset(asking)
        CLIENT_SESSION.reset(token)


def declared_kinds(capabilities: types.ClientCapabilities | None) -> frozenset[Kind]:
    if capabilities is None:
        return frozenset()
    wanted: tuple[tuple[Kind, object], ...] = (
        ("sampling", capabilities.sampling),
        ("elicitation", capabilities.elicitation),
        ("roots", capabilities.roots),
    )
    return frozenset(kind for kind, declared in wanted if declared is not None)


@dataclass(eq=False)
class _Leg:
    ref: SessionRef
    relay: Relay
    ready: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)  # set to close it (evicted, idle, backend gone)
    client: Client | None = None
    transport: WatchedTransport | None = None
    failure: str | None = None
    used: float = field(default_factory=anyio.current_time)
    auth: BackendAuth | None = None  # whose tokens it carries: its principal's own, or the backend's one login
    startup: anyio.CancelScope | None = None  # its handshake's clock, stopped while its principal's login waits
    pool: str | None = None  # the pool it is lent from (requests that name no session), else None
    lent: bool = False  # lent to a request now: never evicted, never lent again until given back


class SessionLegs:
    """The per-session backend sessions of one server; see the module docstring."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        in_process: Any,
        on_change: Callable[[], None],
        auth: BackendAuth | None = None,
    ) -> None:
        self._name = name
        self._auth = auth  # the backend's OAuth client: each client session's own session carries its tokens
        self._config = config
        self._in_process = in_process
        self._on_change = on_change  # a list change one of them announced: the shared listing is refreshed
        self._legs: OrderedDict[str, _Leg] = OrderedDict()
        self._idle: dict[str, list[_Leg]] = {}  # pooled legs waiting for a request, by pool
        self._lent: dict[str, _Leg] = {}  # pooled legs lent now, by the id of the request's session
        self._personal: dict[tuple[str, str], BackendAuth] = {}  # each principal's own login, by (issuer, sub)
        self._host: anyio.abc.TaskGroup | None = None
        self.opened = 0  # backend sessions opened so far (the tests count them)

    @property
    def open(self) -> int:
        return sum(1 for leg in self._legs.values() if leg.client is not None)

    async def host(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the legs while the backend's first leg is connected; they all close when it ends."""
        try:
            async with anyio.create_task_group() as tg:
                self._host = tg
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._host = None
            for leg in self._legs.values():
                leg.done.set()
            self._legs.clear()

    async def roots_changed(self, ref: SessionRef) -> None:
        """Tell `ref`'s own backend session that its client's roots changed (it asks for them anew)."""
        leg = self._legs.get(ref.id)
        if leg is not None and leg.client is not None and "roots" in leg.relay.kinds:
            with anyio.move_on_after(self._config.timeout):
                await leg.client.session.send_notification(types.RootsListChangedNotification())

    def relay_of(self, client: Client) -> Relay | None:
        return next((leg.relay for leg in self._legs.values() if leg.client is client), None)

    def transport_of(self, client: Client) -> WatchedTransport | None:
        return next((leg.transport for leg in self._legs.values() if leg.client is client), None)

    def owns(self, client: Client) -> bool:
        return any(leg.client is client for leg in self._legs.values())

    async def client_for(self, ref: SessionRef, deadline: float) -> Client:
        """`ref`'s own backend session, opened on first use (waiting for it until `deadline`); for a
        request that names no session, a pooled one lent to it until it ends."""
        if self._host is None:
            raise BackendUnavailable(self._name, "is not connected; nothing was sent")
        leg = self._lend(ref) if ref.ephemeral and self._poolable(ref) else self._own(ref)
        self._legs.move_to_end(leg.ref.id)
        leg.used = anyio.current_time()
        personal = leg.auth if leg.auth is not None and leg.auth.person is not None else None
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            await (leg.ready.wait() if personal is None else _first_of(leg.ready, personal.asking))
        if personal is not None and personal.asking_url is not None:  # a first login, or a step-up under a call
            raise BackendUnavailable(
                self._name,
                f"needs your own login: open {personal.asking_url} in a browser that reaches this proxy's"
                f" 127.0.0.1:{personal.settings.callback_port}, then call again; nothing was sent",
            )
        if leg.client is None:
            why = leg.failure or "it did not open in time"
            raise BackendUnavailable(self._name, f"could not open a session for this client ({why}); nothing was sent")
        return leg.client

    def _own(self, ref: SessionRef) -> _Leg:
        leg = self._legs.get(ref.id)
        return leg if leg is not None and not leg.done.is_set() else self._open(ref)

    def _open(self, ref: SessionRef, pool: str | None = None) -> _Leg:
        assert self._host is not None
        relay = Relay(self._name, self._kinds(ref), ref.link)
        leg = self._legs[ref.id] = _Leg(ref, relay, auth=self._auth_for(ref), pool=pool, lent=pool is not None)
        if len(self._legs) > MAX_LEGS and not self._evict():
            del self._legs[ref.id]
            raise BackendUnavailable(
                self._name,
                f"has {MAX_LEGS} client sessions' own sessions open, each with a call in flight;"
                " nothing was sent — try again when one ends",
            )
        self._host.start_soon(self._run, leg, name=f"backend:{self._name}:session")
        return leg

    def _kinds(self, ref: SessionRef) -> frozenset[Kind]:
        return self._config.relay.kinds() & declared_kinds(ref.capabilities)

    def _poolable(self, ref: SessionRef) -> bool:
        """Roots are session state a server may keep: a client that declared them has legs of its own."""
        return "roots" not in self._kinds(ref)

    def _lend(self, ref: SessionRef) -> _Leg:
        """A warm leg of `ref`'s pool lent to `ref` until it ends (the same one for all its requests)."""
        lent = self._lent.get(ref.id)
        if lent is not None and not lent.done.is_set():
            return lent
        pool = _pool_key(ref, self._kinds(ref))
        idle = self._idle.get(pool, [])
        while idle and (idle[-1].done.is_set() or idle[-1].client is None):
            idle.pop()  # closed while it waited (idle, evicted, its backend session gone)
        if idle:
            leg = idle.pop()
            leg.lent = True
        else:
            own = SessionRef(f"pool-{secrets.token_hex(8)}", ref.capabilities, principal=ref.principal)
            leg = self._open(own, pool)
        self._lent[ref.id] = leg
        give_back = partial(self._give_back, ref.id, leg)
        if ref.ended.is_set():  # a call that outlived its request (suspended for its client's answer)
            leg.relay.when_idle(give_back)  # back when the call it is lent for ends: nothing else would
        else:
            ref.on_end.append(give_back)
        return leg

    def _give_back(self, lessee: str, leg: _Leg) -> None:
        """`lessee`'s request ended: its leg waits for the next one, or closes when a call it left
        is still in flight there (a suspended call: nobody else's calls may share the leg with it)."""
        if self._lent.get(lessee) is leg:
            del self._lent[lessee]
        leg.lent = False
        if leg.done.is_set() or leg.pool is None:
            return
        idle = self._idle.setdefault(leg.pool, [])
        if leg.relay.busy or leg.client is None or len(idle) >= POOL_IDLE:
            leg.ref.end()  # closed once its calls are done (`_until_closed`)
        else:
            leg.used = anyio.current_time()
            idle.append(leg)

    def personal(self, principal: Principal | None) -> bool:
        """Whether `principal`'s requests carry a login of their own here (never the shared session's)."""
        return principal is not None and self._auth is not None and self._auth.interactive

    def _auth_for(self, ref: SessionRef) -> BackendAuth | None:
        """The tokens `ref`'s session carries: its principal's own where the front knows who asks and
        a person logs in (the backend's one login, the operator's, is never lent to a principal); else
        the backend's one (a machine's client credentials, or a front that identifies nobody)."""
        auth, principal = self._auth, ref.principal
        if auth is None or principal is None or not auth.interactive:
            return auth
        key = (principal.issuer, principal.sub)
        personal = self._personal.get(key)
        if personal is None:
            personal = self._personal[key] = auth.for_principal(principal.issuer, principal.sub)
            personal.on_login = partial(self._login_waits, personal)
        return personal

    def _login_waits(self, auth: BackendAuth, waiting: bool) -> None:
        """A principal's login began (its sessions' handshake clocks stand still) or ended (they run again)."""
        for leg in self._legs.values():
            if leg.auth is auth and leg.startup is not None and leg.client is None:
                leg.startup.deadline = math.inf if waiting else anyio.current_time() + self._config.startup_timeout

    def _evict(self) -> bool:
        """Close the least recently used session with no call in flight; False when every one has one."""
        for key, leg in self._legs.items():
            if leg.client is not None and not leg.relay.busy and not leg.lent:
                del self._legs[key]
                leg.done.set()
                return True
        return False

    async def _run(self, leg: _Leg) -> None:
        # The task outlives the request that opened it: none of that request's context is its.
        for var in (ASKING, CALLER, CLIENT_ANSWERS, CLIENT_ERA, CLIENT_SESSION, request_logs):
            var.set(None)
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self._config.startup_timeout) as startup:
                leg.startup = startup
                async with AsyncExitStack() as stack:
                    target: Any = self._in_process
                    if target is None:
                        auth = leg.auth.provider if leg.auth is not None else None
                        leg.transport = open_transport(
                            self._name, self._config, sys.stderr, on_end=leg.done.set, auth=auth
                        )
                        target = leg.transport
                    handler = partial(self._on_leg_message, leg)
                    client = Client(target, mode="legacy", message_handler=handler, **leg.relay.callbacks())
                    await stack.enter_async_context(client)
                    restamp_capabilities(client, as_declared)
                    startup.deadline = math.inf
                    leg.client = client
                    self.opened += 1
                    leg.ready.set()
                    logger.debug("backend %r: a session of its own for client session %s", self._name, leg.ref.id)
                    await self._until_closed(leg)
            if startup.cancelled_caught:
                leg.failure = f"no handshake within {self._config.startup_timeout:g}s"
        except Exception as exc:  # boundary: one client's backend session failing is that client's
            while isinstance(exc, ExceptionGroup) and exc.exceptions:  # the transport's task group: its first cause
                exc = exc.exceptions[0]
            leg.failure = str(exc) or type(exc).__name__
            logger.info("backend %r: a client session's own session failed: %s", self._name, leg.failure)
        finally:
            leg.client = None
            leg.done.set()
            leg.ready.set()
            if self._legs.get(leg.ref.id) is leg:
                del self._legs[leg.ref.id]
            idle = self._idle.get(leg.pool) if leg.pool is not None else None
            if idle is not None and leg in idle:
                idle.remove(leg)
            for lessee in [lessee for lessee, lent in self._lent.items() if lent is leg]:
                del self._lent[lessee]  # (a request whose lease no end gives back: a call that outlived it)

    async def _on_leg_message(self, leg: _Leg, message: IncomingMessage) -> None:
        """What a client session's own backend session sends: its log lines go to that client alone
        (never to every client, as a shared session's do); list changes refresh the shared listing;
        resource updates are dropped (subscriptions ride the shared session)."""
        if isinstance(message, types.LoggingMessageNotification):
            if leg.ref.hear is not None:
                await leg.ref.hear(LogMessage(self._name, message.params))
        elif isinstance(message, _LIST_CHANGES):
            self._on_change()  # refreshed, and announced to clients only if the shared listing changed

    @staticmethod
    async def _until_closed(leg: _Leg) -> None:
        """Until its client's session ends, it is evicted, or it goes unused for `IDLE_S` (a call
        in flight on it is use: it is never closed under one as unused)."""
        while not leg.done.is_set():
            ended = leg.ref.ended.is_set()
            wait = BUSY_CHECK_S if ended else max(0.0, leg.used + IDLE_S - anyio.current_time())
            with anyio.move_on_after(wait):
                await (leg.done.wait() if ended else _first_of(leg.done, leg.ref.ended))
            if leg.relay.busy:
                leg.used = anyio.current_time()
            elif leg.ref.ended.is_set() or anyio.current_time() - leg.used >= IDLE_S:
                break


def _pool_key(ref: SessionRef, kinds: frozenset[Kind]) -> str:
    """Whose pooled legs `ref`'s request may take: the same principal (their tokens), with the same
    capabilities declared to the backend at the handshake."""
    declared = ref.capabilities.model_dump(mode="json", by_alias=True, exclude_none=True) if ref.capabilities else {}
    said = json.dumps([ref.principal.key if ref.principal else None, sorted(kinds), declared], sort_keys=True)
    return hashlib.sha256(said.encode()).hexdigest()


async def _first_of(*events: anyio.Event) -> None:
    async with anyio.create_task_group() as tg:
        for event in events:
            tg.start_soon(_cancel_when, event, tg.cancel_scope)


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


_LIST_CHANGES = (
    types.ToolListChangedNotification,
    types.PromptListChangedNotification,
    types.ResourceListChangedNotification,
)

__all__ = [
    "ASKING",
    "CLIENT_SESSION",
    "IDLE_S",
    "MAX_LEGS",
    "POOL_IDLE",
    "SessionLegs",
    "SessionRef",
    "declared_kinds",
    "serving",
]
