"""The MCP front: the proxy as an MCP server, in both protocol eras.

`McpFront(proxy).server` is a low-level `mcp.server.Server` whose handlers serve the catalog:
tools (through the write barrier), the proxy's own tools (`own_tools.py`), and the backends'
prompts and resources, namespaced. Errors become wire errors in one place (`wire.wire_error`),
on every handler: a backend's own JSON-RPC error as the backend's, the proxy's own with its own
codes. `stdio.py` (`serve_stdio`) and `http.py` (`serve_http`, `http_app`) serve it.

Sessions (the trajectory a reviewer sees: the reads that led to a write):
* stdio: the one client on this process's stdin is one session, whatever its era;
* HTTP, handshake era: one session per `Mcp-Session-Id`;
* HTTP, 2026-07-28 era: the session the client names with the `Mcp-Spec-Proxy-Session` header
  (or `_meta["mcp-spec-proxy/session"]`); a request that names none is a session of its own
  (`named_sessions.py`).

Under `auth:` each session carries its principal (`principal.principal_of`: the verified token's).

Human review reaches the user by elicitation (handshake era) or by `input_required` with a
single-use approval ticket (2026-07-28 era): `approvals.py`.

Each backend tool's result names its call in `_meta["mcp-spec-proxy/call"]` (the id its audit
lines carry), and so does the `data` of the proxy's own error about it. A call may carry an
idempotency key in `_meta["mcp-spec-proxy/idempotency-key"]`, bound to its tool and arguments: its
replays in the session get its outcome (`replays.py`), and the gate forwards one write per key.
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, cast

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.runner import serve_dual_era_loop
from mcp.server.subscriptions import InMemorySubscriptionBus
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ServerEvent, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.backends.notices import request_logs
from mcp_spec_proxy.backends.relay import CALLER
from mcp_spec_proxy.calls.access import View, shown
from mcp_spec_proxy.calls.results import CALL_META, new_call_id
from mcp_spec_proxy.errors import BackendError, CallReplayed, ProxyError, ShuttingDown, StateError, ToolNotFound
from mcp_spec_proxy.fronts import client_sessions, fast_read, relay
from mcp_spec_proxy.fronts.approvals import Approvals, UserChannel, approval_of
from mcp_spec_proxy.fronts.notices import Notices
from mcp_spec_proxy.fronts.own_tools import OwnTools
from mcp_spec_proxy.fronts.relay import Asked, Suspensions, answering, connection_link, mute_link, request_link
from mcp_spec_proxy.fronts.replays import Bound, Replays, Served, idempotency_key
from mcp_spec_proxy.fronts.wire import wire_error
from mcp_spec_proxy.principal import principal_of, who
from mcp_spec_proxy.proxy import Proxy
from mcp_spec_proxy.review import InputNeeded
from mcp_spec_proxy.sdk import server_connection
from mcp_spec_proxy.sessions.barrier import Report, Session
from mcp_spec_proxy.sessions.named_sessions import SESSION_HEADER as SESSION_HEADER  # where tests look for it
from mcp_spec_proxy.sessions.named_sessions import NamedSessions, session_name

if TYPE_CHECKING:
    from mcp_spec_proxy.fronts.catalog_search import CatalogSearch

logger = logging.getLogger(__name__)

SESSION_KEY = "mcp_spec_proxy.session"

Ctx = ServerRequestContext[Any, Any]

_EVENTS: dict[str, ServerEvent] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


class ProxyServer(Server[Any]):
    """Announces list_changed for tools, prompts and resources on every transport, and computes
    what depends on the backends connected when a client arrives: the instructions (the proxy's
    own, then each server's) and `resources.subscribe` (while some backend's session of its era offers it)."""

    live: McpFront | None = None

    @property  # the SDK's plain attribute, computed here per client
    def instructions(self) -> str | None:
        own = self._own_instructions
        return self.live.instructions(own) if self.live is not None else own

    @instructions.setter
    def instructions(self, value: str | None) -> None:
        self._own_instructions = value

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        if caps.resources is not None:
            subscribe = self.live is not None and self.live.subscribable(protocol_version)
            caps = caps.model_copy(update={"resources": caps.resources.model_copy(update={"subscribe": subscribe})})
        return caps

    async def run_live(
        self,
        read_stream: MemoryObjectReceiveStream[SessionMessage | Exception],
        write_stream: MemoryObjectSendStream[SessionMessage],
    ) -> None:
        """`run`, with the initialize result built when each client arrives (not once at start)."""
        async with self.lifespan(self) as lifespan_state:
            await serve_dual_era_loop(self, read_stream, write_stream, lifespan_state=lifespan_state)

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        options = notification_options or NotificationOptions(True, True, True)
        return super().create_initialization_options(options, experimental_capabilities, extensions)


class McpFront:
    def __init__(self, proxy: Proxy, *, name: str = "mcp-spec-proxy", version: str = "") -> None:
        self.proxy = proxy
        self.own_tools = OwnTools(proxy)
        self.catalog_search: CatalogSearch | None = None
        if proxy.config.catalog.mode == "search":  # numpy and the encoders: paid for only in search mode
            from mcp_spec_proxy.fronts.catalog_search import CatalogSearch

            self.catalog_search = CatalogSearch(proxy)
        self.connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._approvals = Approvals(proxy.config.review.timeout, proxy.store.approvals)
        self.named = NamedSessions(lambda name, principal: self.proxy.barrier.new_session(name, principal))
        self.stdio_session: Session | None = None  # set while serving stdio: one client, one session
        self.stdio_connection: Connection | None = None  # its connection, from its `initialize` on
        self.suspensions, self.asked = Suspensions(proxy.config.review.timeout), Asked()  # what waits for clients
        self.replays = Replays()
        self._bus = InMemorySubscriptionBus()  # 2026-07-28 clients hear of changes on subscriptions/listen
        self.notices = Notices(proxy, self._bus)
        proxy.listeners.append(self._broadcast)
        self.server = ProxyServer(
            name,
            version=version,
            instructions=(
                f"Tools of several MCP servers, named <server>{proxy.config.separator}<tool>. Read-only tools run at"
                " once; tools that may"
                " change state are reviewed before they run. Write tools take an optional `intent` argument: say"
                " what the user asked for and why this call serves it."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscriptions_listen=self.notices.listen,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_completion=self._complete,
        )
        # Registered past the constructor, which warns of the deprecated logging capability.
        self.server.add_request_handler("logging/setLevel", types.SetLevelRequestParams, self._set_level)
        self.server.live = self
        self.fast_read = fast_read.install(self)  # reads skip the SDK's handler machinery (fast_read.py)
        self.client_sessions = client_sessions.install(self)  # its client sessions as the backends see them

    # -- sessions and notifications ----------------------------------------------------------

    def instructions(self, own: str | None) -> str:
        """The proxy's own instructions, then each connected server's, headed by its name."""
        sep = self.proxy.config.separator
        parts = [own or ""]
        for backend in self.proxy.backends.connected():
            text = (backend.instructions or "").strip()
            # A server hidden from this client is not named to it, where its initialize has a view.
            if text and shown(backend.name):
                names = f"{backend.name}{sep}<tool>" if backend.config.namespace else "their own names"
                parts.append(f"Instructions of server {backend.name!r} (its tools are {names}):\n{text}")
        return "\n\n".join(part for part in parts if part)

    def view_of(self, request: object) -> View | None:
        """The view (`calls/access.py`) of the principal `request` comes from: the verified token's, else
        nobody identified (stdio, a front without `auth:`)."""
        return self.proxy.access.view(principal_of(request)) if self.proxy.access else None

    def subscribable(self, protocol_version: str | None) -> bool:
        return any(backend.subscribable_to(protocol_version) for backend in self.proxy.backends.connected())

    def session_for(self, ctx: Ctx) -> Session:
        self.notices.hear(server_connection(ctx))
        if self.stdio_session is not None:
            if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                # The one stdio client still hears list changes pushed, as every handshake-era client does.
                self.connections.add(server_connection(ctx))
            return self.stdio_session
        principal = principal_of(ctx.request)  # only a token the front verified names one
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self.named.session(ctx.request, ctx.meta, principal)  # named_sessions.py
        connection = server_connection(ctx)
        session = connection.state.get(SESSION_KEY)
        if not isinstance(session, Session):
            session = self.proxy.barrier.new_session(connection.session_id, principal)  # the SDK binds it to them
            connection.state[SESSION_KEY] = session
            self.connections.add(connection)
        return session

    async def _broadcast(self, what: str) -> None:
        if what == "tools" and self.catalog_search is not None:
            return  # in search mode the listed tools never change (see fronts/catalog_search.py)
        await self._bus.publish(_EVENTS[what])
        method = f"notifications/{what}/list_changed"
        for connection in list(self.connections):
            if connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
                continue  # that era learns of changes through subscriptions/listen, not pushed notifications
            try:
                with anyio.move_on_after(2):
                    await connection.outbound.notify(method, None)
            except Exception:  # boundary: a client that went away must not stop the others hearing
                logger.debug("could not notify a client of %s", method, exc_info=True)
                self.connections.discard(connection)

    # -- tools -------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        self.session_for(ctx)
        if self.catalog_search is not None:
            return types.ListToolsResult(tools=self.catalog_search.definitions() + self.own_tools.definitions())
        tools = [tool.definition for tool in self.proxy.catalog.tools()]
        return types.ListToolsResult(tools=tools + self.own_tools.definitions())

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if self.own_tools.owns(params.name):
            try:
                caller = self.session_for(ctx)
                with self.proxy.gate.admitted(caller.id, params.name, None, caller.principal):  # `delegate`'s too
                    return await self.own_tools.call(
                        params.name,
                        dict(params.arguments or {}),
                        session=lambda: self.session_for(ctx),
                        report=_reporter(ctx),
                        user=UserChannel(ctx, params, None),
                    )
            except ShuttingDown as exc:
                raise wire_error(exc) from exc
        if self.catalog_search is not None:  # search mode: a search, or the tools/call a call_tool stands for
            routed = await self.catalog_search.route(params)
            if isinstance(routed, types.CallToolResult):
                return routed
            params = routed
        session = self.session_for(ctx)
        arguments = dict(params.arguments or {})
        binding = self._binding(ctx, session, params.name, arguments)
        key = idempotency_key(ctx.meta)
        call = new_call_id()
        log_route = request_logs.set(self.notices.route(ctx))
        try:
            ticket = None
            if params.input_responses and not self.suspensions.owns(params.request_state):
                ticket = await self._approvals.take(params.request_state, binding)
            user = UserChannel(ctx, params, ticket)

            async def run() -> types.CallToolResult:
                # The id is stamped here, inside the call: a suspended call's resumed answer names it too.
                # A retry with a valid approval goes on with a call admitted before any drain: let in.
                resumed = self.proxy.gate.drain.continuing() if ticket is not None else nullcontext()
                try:
                    with resumed:
                        if ticket is not None:  # counted in flight now: the drain stops waiting for its approval
                            self.proxy.gate.drain.back(approval_of(params.request_state))
                        done = await self.proxy.barrier.call(
                            session, params.name, arguments, user, _reporter(ctx), call=call, key=key
                        )
                except (BackendError, StateError, CallReplayed) as exc:
                    raise wire_error(exc, call) from exc
                return done.model_copy(update={"meta": {**(done.meta or {}), CALL_META: call}})

            async def serve() -> Served:
                return cast(Served, await self._served(ctx, session, binding, params, run))

            if key is None or self.suspensions.owns(params.request_state):
                return await serve()  # a suspended call's resumption is that call, not a replay
            bound = Bound.of(self.proxy.catalog, params.name, arguments)
            holder = functools.partial(self.proxy.gate.key_holder, session.id, key)
            return await self.replays.run(session.id, key, call, serve, self._replayed(session, call), bound, holder)
        except InputNeeded as need:
            form = types.ElicitRequestFormParams(message=need.message, requested_schema=need.schema)
            request = types.ElicitRequest(params=form)
            state = await self._approvals.issue(binding, need)
            # Out with the client until its retry: a drain waits for that (bounded by the ticket's expiry).
            self.proxy.gate.drain.awaiting(approval_of(state), self.proxy.config.review.timeout)
            return types.InputRequiredResult(input_requests={need.key: request}, request_state=state)
        except (ProxyError, MCPError) as exc:
            raise wire_error(exc, call) from exc
        finally:
            request_logs.reset(log_route)

    def _replayed(self, session: Session, call: str) -> Callable[[str], None]:
        def audit(first: str) -> None:
            self.proxy.gate.note("replayed", call=call, session=session.id, first=first, **who(session.principal))

        return audit

    # -- the relay of a backend's requests to the client (fronts/relay.py) ---------------------

    async def _served(
        self,
        ctx: Ctx,
        session: Session,
        binding: tuple[str, str, str],
        params: types.CallToolRequestParams | types.GetPromptRequestParams | types.ReadResourceRequestParams,
        run: Callable[[], Awaitable[Any]],
    ) -> Any:
        """`run()` for this client, so that what its backend asks reaches it: on the handshake era
        on the request's stream; on the 2026-07-28 era by suspending the call (`Suspensions`),
        which a retry carrying the suspended call's `request_state` resumes."""
        if self.suspensions.owns(params.request_state):  # the answer a suspended call waits for
            return await self.suspensions.resume(params.request_state, binding, params.input_responses)
        run = answering(self._answered(params), params.input_responses, run)  # a fresh call's answers: its tool
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            capabilities = ctx.session.client_capabilities
            return await self.suspensions.call(session, capabilities, binding, run, self.audit_relay(session))
        with self.calling(session, ctx):
            return await run()

    def _answered(self, params: object) -> tuple[str, str] | None:
        """The backend tool (server, its own name) a call's own answers are for; None: not a tool's."""
        if not isinstance(params, types.CallToolRequestParams):
            return None
        try:
            tool = self.proxy.catalog.lookup(params.name)
        except ToolNotFound:
            return None
        return tool.server, tool.original

    def _binding(self, ctx: Ctx, session: Session, what: str, arguments: Any) -> tuple[str, str, str]:
        """What a `request_state` is bound to (`relay.call_binding`)."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and self.stdio_session is None
        unnamed = modern and session_name(ctx.request, ctx.meta, None) is None
        return relay.call_binding(unnamed, session.id, what, arguments)

    @contextmanager
    def calling(self, session: Session, ctx: Ctx | None) -> Iterator[None]:
        """Around a call served for this client: what its backend asks reaches this client."""
        ttl = self.proxy.config.review.timeout
        if ctx is None:  # a stdio read taken off the wire: the one connection is the stream
            link = connection_link(session, self.stdio_connection, self.audit_relay(session), ttl, self.asked)
        elif ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            link = mute_link(session)  # only a suspended call (`Suspensions`) can ask this era
        else:
            link = request_link(session, ctx, self.audit_relay(session), ttl, self.asked)
        token = CALLER.set(link)
        try:
            yield
        finally:
            CALLER.reset(token)

    def audit_relay(self, session: Session) -> Callable[[str, str], Awaitable[None]]:
        async def audit(server: str, method: str) -> None:
            named = {"session": session.id, "server": server, "method": method, **who(session.principal)}
            await self.proxy.gate.record("relayed", **named)

        return audit

    # -- prompts and resources ---------------------------------------------------------------

    async def _list_prompts(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[prompt.model_copy(update={"name": entry.name}) for entry, prompt in self.proxy.catalog.prompts()]
        )

    async def _get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        try:
            entry = self.proxy.catalog.prompt(params.name)
            session = self.session_for(ctx)

            async def run() -> types.GetPromptResult:
                got: types.GetPromptResult = await self.proxy.gate.reads.get_prompt(
                    session.id, entry.server, entry.original, params.arguments, session.principal
                )
                return got

            binding = self._binding(ctx, session, f"prompts/get {params.name}", params.arguments)
            prompt: types.GetPromptResult | types.InputRequiredResult = await self._served(
                ctx, session, binding, params, run
            )
            return prompt
        except (ProxyError, MCPError) as exc:
            raise wire_error(exc) from exc

    async def _list_resources(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        catalog = self.proxy.catalog
        return types.ListResourcesResult(
            resources=[r.model_copy(update={"name": catalog.labelled(s, r.name)}) for s, r in catalog.resources()]
        )

    async def _list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        catalog = self.proxy.catalog
        return types.ListResourceTemplatesResult(
            resource_templates=[
                t.model_copy(update={"name": catalog.labelled(s, t.name)}) for s, t in catalog.resource_templates()
            ]
        )

    async def _read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        try:
            owner = self.proxy.catalog.resource_owner(params.uri)
            session = self.session_for(ctx)

            async def run() -> types.ReadResourceResult:
                read: types.ReadResourceResult = await self.proxy.gate.reads.read_resource(
                    session.id, owner, params.uri, session.principal
                )
                return read

            binding = self._binding(ctx, session, f"resources/read {params.uri}", None)
            resource: types.ReadResourceResult | types.InputRequiredResult = await self._served(
                ctx, session, binding, params, run
            )
            return resource
        except (ProxyError, MCPError) as exc:
            raise wire_error(exc) from exc

    async def _subscribe(self, ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
        try:
            session = self.session_for(ctx)
            await self.notices.subscribe(server_connection(ctx), session.id, params.uri, session.principal)
        except (ProxyError, MCPError) as exc:
            raise wire_error(exc) from exc
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        try:
            session = self.session_for(ctx)
            await self.notices.unsubscribe(server_connection(ctx), session.id, params.uri, session.principal)
        except (ProxyError, MCPError) as exc:
            raise wire_error(exc) from exc
        return types.EmptyResult()

    # -- completions and logging -------------------------------------------------------------

    async def _complete(self, ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
        """A prompt's (namespaced name) or a resource template's argument, completed by its server."""
        try:
            ref = params.ref
            if isinstance(ref, types.PromptReference):
                entry = self.proxy.catalog.prompt(ref.name)
                server, ref = entry.server, ref.model_copy(update={"name": entry.original})
            else:
                server = self.proxy.catalog.template_owner(ref.uri)
            session = self.session_for(ctx)
            with self.calling(session, ctx):  # a server may ask its client's model for completions
                asked = params.model_copy(update={"ref": ref})
                return await self.proxy.gate.reads.complete(session.id, server, asked, session.principal)
        except (ProxyError, MCPError) as exc:
            raise wire_error(exc) from exc

    async def _set_level(self, ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        session = self.session_for(ctx)
        await self.notices.set_level(server_connection(ctx), session.id, params.level, session.principal)
        return types.EmptyResult()


def _reporter(ctx: Ctx) -> Report | None:
    meta = ctx.meta or {}
    if meta.get("progress_token") is None and meta.get("progressToken") is None:
        return None
    session = ctx.session

    async def report(progress: float, total: float | None, message: str | None) -> None:
        await session.report_progress(progress, total, message)

    return report
