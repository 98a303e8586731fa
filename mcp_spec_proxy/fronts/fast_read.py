"""The lean read path: a client's read served without the SDK's handler machinery.

A read needs only this: validate the request, classify the tool, forward, return. `FastRead` is
a server middleware (it sees each request before the SDK's lookup, validation and handler) that
does just that for `tools/call` of a tool the catalog holds as a read, and hands the backend's
result back as wire JSON — no model built for it, no span where no tracer is installed
(`telemetry.tracing_configured`). The read is still the barrier's and the gate's: the same
lookup, argument validation and audit line (`Barrier.read_tool`, `Barrier.read_json`). The
stdio front goes one step further and takes such a call off the wire before the SDK parses it
(`stdio._LeanReads`, through `FastRead.claim` and `run`).

Everything else takes the SDK's path, unchanged: another method, an own tool or a search-mode
meta-tool (whatever backend tool shares its name), a call with a progress token (it may stream),
a modern retry carrying input responses, a legacy call before the handshake, a request the SDK's
own check refuses, and every call `Barrier.read_tool` declines — a write, an unknown tool, a
tool held for its new or changed definition.

What goes out: a backend's JSON-RPC error as it sent it, the proxy's own failures with its own
codes (`fronts/wire.py`); a result of the plain shape (text blocks, a boolean `isError`, an object of
structured content, `_meta`) as the backend sent it; any other shape through the SDK's own
per-version check and sieve, and one that fails it as the backend's error. Each era gets what
the SDK would give it: 2026-07-28 results carry `resultType` and the server's `serverInfo`
stamp, handshake-era results carry neither key of that era. Every result names its call in
`_meta` (`results.CALL_META`), as the SDK's path does; a call that carries an idempotency key takes
the SDK's path, which keeps its outcome for replays (`replays.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import CLIENT_CAPABILITIES_META_KEY, LOG_LEVEL_META_KEY, InputRequiredResult, methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mcp_spec_proxy.backends.era import speaking
from mcp_spec_proxy.backends.raw import WireResult, plain
from mcp_spec_proxy.backends.session_legs import serving
from mcp_spec_proxy.calls.access import viewing
from mcp_spec_proxy.calls.results import CALL_FAILED, CALL_META, as_wire, error_result, new_call_id
from mcp_spec_proxy.errors import ShuttingDown, ToolNotFound
from mcp_spec_proxy.fronts.client_sessions import adopt_stdio, session_ref
from mcp_spec_proxy.fronts.lean_modern import LeanAnswers
from mcp_spec_proxy.fronts.relay import declares_any
from mcp_spec_proxy.fronts.replays import KEY_META
from mcp_spec_proxy.fronts.wire import wire_error
from mcp_spec_proxy.observe.telemetry import tracing_configured
from mcp_spec_proxy.principal import principal_of
from mcp_spec_proxy.sdk import server_connection
from mcp_spec_proxy.sessions.barrier import Session
from mcp_spec_proxy.tools.catalog import CatalogTool

if TYPE_CHECKING:
    from mcp_spec_proxy.fronts.mcp import McpFront

_PARAMS = frozenset({"name", "arguments", "_meta"})
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


def install(front: McpFront) -> FastRead:
    """Put the lean read path in front of the SDK's; drop the SDK's span middleware when no
    tracer provider is installed (its spans would be no-ops that still cost their setup).

    Also give the SDK the one tool's input schema it needs to check a 2026-07-28 HTTP call's
    `Mcp-Param-*` headers: without it, the SDK runs the whole tools/list handler for every call.
    """
    server = front.server
    kept = list(server.middleware) if tracing_configured() else []
    fast = FastRead(front)
    server.middleware = [*kept, fast]
    server.get_tool_input_schema = lambda name: input_schema(front, name)
    return fast


def input_schema(front: McpFront, name: str) -> Mapping[str, Any] | None:
    """The input schema the client was shown for `name` (intent included), or None if unknown."""
    if front.own_tools.owns(name):
        return next((tool.input_schema for tool in front.own_tools.definitions() if tool.name == name), None)
    try:
        return front.proxy.catalog.lookup(name).definition.input_schema
    except ToolNotFound:
        return None


@dataclass(frozen=True)
class Read:
    """A `tools/call` the lean path has taken on: a read of `tool`, for a client of `version`."""

    tool: CatalogTool
    arguments: dict[str, Any]
    version: str
    modern: bool


class FastRead:
    """Serves `tools/call` of a read straight from the barrier; passes everything else on.

    As a server middleware it sees each request the SDK has parsed; the stdio front also asks it
    directly (`claim`, then `run`) for the lines it reads, before the SDK parses anything.
    """

    def __init__(self, front: McpFront) -> None:
        self._front = front
        # Each handshake-era HTTP session's connection, by its session id, while it lives (`lean_http.py`).
        self.http_connections: dict[str, Connection] = {}
        # Where the HTTP lane's 2026-07-28 reads are answered (their pings, past the SDK's window, hosted).
        self.modern_answers = LeanAnswers()

    @property
    def front(self) -> McpFront:
        return self._front

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        # The client's era (its listing, its era's backend legs) and its session (its own backend sessions).
        # And what its principal may see (`calls/access.py`): every request, whatever its method.
        ref = session_ref(self._front, ctx)
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and self._front.stdio_session is None:
            self._know(server_connection(ctx))
        try:
            with (
                speaking(ctx.protocol_version),
                viewing(self._front.view_of(ctx.request)),
                serving(ref, principal_of(ctx.request)),
            ):
                return await self._serve(ctx, call_next)
        finally:
            if ref is not None and ref.ephemeral:
                ref.end()  # a request that named no session was its own session: its pooled legs go back

    def _know(self, connection: Connection) -> None:
        session_id = connection.session_id
        if session_id is not None and session_id not in self.http_connections:
            self.http_connections[session_id] = connection
            connection.exit_stack.callback(self.http_connections.pop, session_id, None)

    async def _serve(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method == "tools/call":
            version = ctx.protocol_version
            modern = version in MODERN_PROTOCOL_VERSIONS
            # Before the handshake the SDK answers a legacy call with its own error.
            initialized = modern or (ctx.request_id is not None and server_connection(ctx).initialize_accepted)
            # A 2026-07-28 client that a backend could ask something is served by a suspended call
            # (`fronts/relay.py`), which only the SDK's path runs.
            askable = modern and declares_any(ctx.session.client_capabilities)
            read = None if askable else self.claim(ctx.params, version, initialized=initialized)
            if read is not None:
                session = self._front.session_for(ctx)
                with self._front.calling(session, ctx):
                    return await self.run(read, session)
        elif ctx.method == "initialize" and self._front.stdio_session is not None:
            self._front.stdio_connection = server_connection(ctx)  # what a lean read's backend may ask goes there
            adopt_stdio(self._front)  # and what a backend asks outside any call: the shared sessions are its
        return await call_next(ctx)

    def claim(self, params: Any, version: str, *, initialized: bool, suspendable: bool = False) -> Read | None:
        """The read these `tools/call` params ask for, or None: the SDK's path takes the call.
        `suspendable`: the caller runs a 2026-07-28 client's read as a call its backend may suspend
        (`Suspensions`), so a client that can be asked is claimed too."""
        if not initialized or not isinstance(params, Mapping) or not params.keys() <= _PARAMS:
            return None  # input responses, request state, a task: the SDK's path knows them
        name = params.get("name")
        arguments = params.get("arguments")
        arguments = {} if arguments is None else arguments
        front = self._front
        if not isinstance(name, str) or not isinstance(arguments, dict) or front.own_tools.owns(name):
            return None
        if front.catalog_search is not None and front.catalog_search.owns(name):
            return None  # a meta-call of search mode, even where a backend tool's public name is the same
        meta = params.get("_meta")
        if isinstance(meta, Mapping) and ("progressToken" in meta or "progress_token" in meta):
            return None  # progress may be streamed: the SDK's path reports it
        if version in MODERN_PROTOCOL_VERSIONS and not suspendable and isinstance(meta, Mapping) and _askable(meta):
            return None  # a backend could ask this client something: only a suspendable call can
        if isinstance(meta, Mapping) and LOG_LEVEL_META_KEY in meta:
            return None  # the call opted in to log messages on its request: the SDK's path relays them
        if isinstance(meta, Mapping) and KEY_META in meta:
            return None  # an idempotency key: the SDK's path keeps the outcome for its replays
        try:
            methods.validate_client_request("tools/call", version, params)
        except (KeyError, ValueError, ValidationError):
            return None  # the SDK's path refuses it, with its own error
        tool = front.proxy.barrier.read_tool(name)
        if tool is None:
            return None  # a write, a held or unknown tool: the barrier's `call`
        return Read(tool, dict(arguments), version, version in MODERN_PROTOCOL_VERSIONS)

    async def run(self, read: Read, session: Session, *, stamp: bool = True) -> dict[str, Any]:
        """The read's result, shaped for its client's era; a call that got none raises its wire
        error (`MCPError`): the backend's as it sent it, or the proxy's own. `stamp=False`: a
        2026-07-28 result without the server's `serverInfo`, for the SDK's runner to stamp."""
        call = new_call_id()
        try:
            result = await self._front.proxy.barrier.read_json(session, read.tool, read.arguments, call)
        except (*CALL_FAILED, ShuttingDown) as exc:  # draining: nothing ran
            raise wire_error(exc, call) from exc
        out = self._for_client(result, read.version, read.modern, call)
        return self.stamped(out) if stamp and read.modern else out

    def _for_client(self, result: WireResult, version: str, modern: bool, call: str) -> dict[str, Any]:
        out: dict[str, Any]
        if plain(result):
            out = dict(result)
            out.pop("resultType", None)
        else:
            # The 2026-07-28 surface requires `resultType`, which a handshake-era backend never sends.
            shaped: dict[str, Any] = {**result, "resultType": "complete"} if modern else dict(result)
            try:
                out = methods.serialize_server_result("tools/call", version, shaped)
            except ValidationError:
                out = dict(as_wire(error_result("the backend answered with something that is not a tool result")))
        meta = out.get("_meta")
        meta = {**meta, CALL_META: call} if isinstance(meta, dict) else {CALL_META: call}
        out["_meta"] = meta
        if not modern:
            out.pop("resultType", None)
            return out
        out["resultType"] = "complete"
        return out

    def stamped(self, out: dict[str, Any]) -> dict[str, Any]:
        """A 2026-07-28 result with the server's `serverInfo` where it names none, stamped last, as the
        SDK's runner stamps what a handler returns."""
        meta = out.get("_meta")
        if meta is None or (isinstance(meta, dict) and meta.get(SERVER_INFO_META) is None):
            out["_meta"] = {**(meta or {}), SERVER_INFO_META: self._front.server.server_info_stamp}
        return out

    def waiting(self, result: InputRequiredResult, version: str) -> dict[str, Any]:
        """A suspended read's `input_required` result, as the SDK's runner writes a handler's: dumped,
        sieved for the era, and stamped."""
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return self.stamped(methods.serialize_server_result("tools/call", version, dumped))


def _askable(meta: Mapping[str, Any]) -> bool:
    declared = meta.get(CLIENT_CAPABILITIES_META_KEY)
    if not isinstance(declared, Mapping):
        return False
    return any(declared.get(kind) is not None for kind in ("sampling", "elicitation", "roots"))


__all__ = ["FastRead", "Read", "install"]
