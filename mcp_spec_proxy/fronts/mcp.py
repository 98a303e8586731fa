"""The MCP front: the proxy as an MCP server, over stdio and streamable HTTP, in both eras.

`build_server(proxy)` makes a low-level `mcp.server.Server` whose handlers serve the catalog:
tools (through the write barrier), and the backends' prompts and resources, namespaced. This is
the one place where proxy exceptions become wire errors (`_wire_error`).

Sessions (the trajectory a reviewer sees: the reads that led to a write):
* stdio: the one client on this process's stdin is one session, whatever its era;
* HTTP, handshake era: one session per `Mcp-Session-Id`;
* HTTP, 2026-07-28 era: the session the client names with the `Mcp-Spec-Proxy-Session` header
  (or `_meta["mcp-spec-proxy/session"]` of the request); a request that names none is a session
  of its own.

Human review reaches the user by elicitation (`elicitation/create`, handshake era) or by
returning `input_required` (2026-07-28 era). Each `input_required` carries a fresh approval
ticket as its `request_state`: single-use, bound (by HMAC) to the session, the tool and its
arguments, and expiring with `review.timeout`; a replayed or forged ticket counts for nothing and
the user is asked again. What the reviewers decided before asking (the strong verdict under
`strong_then_human`) rides with the ticket, so a retry does not ask the model twice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import sys
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.abc
import mcp_types as types
from mcp import MCPError
from mcp.server import Server
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.models import InitializationOptions
from mcp.server.stdio import (  # the SDK's stdio claim, so fd 0/1 behave as in its own server
    _claim_fd,
    _open_stdin_diversion,
    _open_stdout_diversion,
    _UnownedTextWrapper,
    stdio_server,
)
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ServerEvent, ToolsListChanged
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp

from mcp_spec_proxy.barrier import Report, Session, error_result
from mcp_spec_proxy.catalog import digest
from mcp_spec_proxy.engine import MODES
from mcp_spec_proxy.errors import ProxyError, ToolNotFound
from mcp_spec_proxy.fronts.asgi import BearerToken, host_names, serve_asgi
from mcp_spec_proxy.proxy import Proxy
from mcp_spec_proxy.reviewers import InputNeeded

logger = logging.getLogger(__name__)

_SESSION_KEY = "mcp_spec_proxy.session"
_APPROVAL_KEY = "mcp-spec-proxy/approval"
SESSION_HEADER = "mcp-spec-proxy-session"
SESSION_META = "mcp-spec-proxy/session"
MAX_NAMED_SESSIONS = 4096  # 2026-07-28 sessions kept by name; the least recently used goes first
MAX_PENDING_APPROVALS = 4096

Ctx = ServerRequestContext[Any, Any]

DELEGATE = "delegate"
DELEGATE_TOOL = types.Tool(
    name=DELEGATE,
    title="Delegate a task to the proxy's agent",
    description=(
        "Run a whole task with the proxy's own agent over these tools: a weak model drafts the steps, reads"
        " run at once, and a strong model verifies every segment before anything changes. Returns the final"
        " answer and a compact trace."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "task": {"type": "string", "description": "The user's request, in words."},
            "mode": {"type": "string", "enum": list(MODES), "default": "spec"},
            "max_steps": {"type": "integer", "minimum": 1},
        },
        "required": ["task"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
)

REPORT_OUTCOME = "report_outcome"
REPORT_OUTCOME_TOOL = types.Tool(
    name=REPORT_OUTCOME,
    title="Report whether a task succeeded",
    description=(
        "Tell the proxy whether the user's task was done right, so it learns when to trust the weak model:"
        " give `task_id` for a delegate run, or leave it out to label this session's work."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "success": {"type": "boolean"},
            "task_id": {"type": "string", "description": "The run's id from a delegate trace."},
            "task": {"type": "string", "description": "The task in words, when labelling this session."},
        },
        "required": ["success"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
)

_EVENTS: dict[str, ServerEvent] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}


class ProxyServer(Server[Any]):
    """Announces list_changed for tools, prompts and resources on every transport."""

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        options = notification_options or NotificationOptions(True, True, True)
        return super().create_initialization_options(options, experimental_capabilities, extensions)


def _connection(ctx: Ctx) -> Connection:
    # The SDK hands handlers the connection only through the session; `Context.connection`
    # exists but is not what the runner builds yet.
    return ctx.session._connection  # pyright: ignore[reportPrivateUsage]


class McpFront:
    def __init__(self, proxy: Proxy, *, name: str = "mcp-spec-proxy", version: str = "") -> None:
        self.proxy = proxy
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._approvals = Approvals(proxy.config.review.timeout)
        self._named: OrderedDict[str, Session] = OrderedDict()
        self.stdio_session: Session | None = None  # set while serving stdio: one client, one session
        self._bus = InMemorySubscriptionBus()  # 2026-07-28 clients hear of changes on subscriptions/listen
        proxy.listeners.append(self._broadcast)
        self.server = ProxyServer(
            name,
            version=version,
            instructions=(
                f"Tools of several MCP servers, named <server>{proxy.config.separator}<tool>. Read-only tools run at"
                " once; tools that may"
                " change state are reviewed before they run. Write tools take an `intent` argument: say what the"
                " user asked for and why this call serves it."
            ),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_prompts=self._list_prompts,
            on_get_prompt=self._get_prompt,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscriptions_listen=ListenHandler(self._bus),
        )

    # -- sessions and notifications ----------------------------------------------------------

    def session_for(self, ctx: Ctx) -> Session:
        if self.stdio_session is not None:
            return self.stdio_session
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            name = _session_name(ctx)
            if name is None:
                return self.proxy.barrier.new_session()  # a request that names no session is its own
            named = self._named.pop(name, None) or self.proxy.barrier.new_session("named-" + digest(name)[:12])
            self._named[name] = named
            while len(self._named) > MAX_NAMED_SESSIONS:
                self._named.popitem(last=False)
            return named
        connection = _connection(ctx)
        session = connection.state.get(_SESSION_KEY)
        if not isinstance(session, Session):
            session = self.proxy.barrier.new_session(connection.session_id)
            connection.state[_SESSION_KEY] = session
            self._connections.add(connection)
        return session

    async def _broadcast(self, what: str) -> None:
        await self._bus.publish(_EVENTS[what])
        method = f"notifications/{what}/list_changed"
        for connection in list(self._connections):
            if connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
                continue  # that era learns of changes through subscriptions/listen, not pushed notifications
            try:
                with anyio.move_on_after(2):
                    await connection.outbound.notify(method, None)
            except Exception:  # boundary: a client that went away must not stop the others hearing
                logger.debug("could not notify a client of %s", method, exc_info=True)
                self._connections.discard(connection)

    # -- tools -------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        self.session_for(ctx)
        tools = [tool.definition for tool in self.proxy.catalog.tools()]
        if self.proxy.engine is not None:
            tools.append(DELEGATE_TOOL)
        if self._outcomes_open():
            tools.append(REPORT_OUTCOME_TOOL)
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: Ctx, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        if params.name == DELEGATE and self.proxy.engine is not None:
            return await self._delegate(ctx, params)
        if params.name == REPORT_OUTCOME and self._outcomes_open():
            return await self._report_outcome(ctx, params)
        session = self.session_for(ctx)
        arguments = dict(params.arguments or {})
        # A 2026-07-28 request that names no session is a session of its own: its ticket binds
        # to the call alone; everywhere else, to the session too.
        unnamed = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and self.stdio_session is None
        unnamed = unnamed and _session_name(ctx) is None
        binding = ("" if unnamed else session.id, params.name, digest(arguments))
        ticket = self._approvals.take(params.request_state, binding) if params.input_responses else None
        user = _UserChannel(ctx, params, ticket)
        try:
            return await self.proxy.barrier.call(session, params.name, arguments, user, _reporter(ctx))
        except InputNeeded as need:
            request = types.ElicitRequest(
                params=types.ElicitRequestFormParams(message=need.message, requested_schema=need.schema)
            )
            state = self._approvals.issue(binding, need)
            return types.InputRequiredResult(input_requests={need.key: request}, request_state=state)
        except ProxyError as exc:
            raise _wire_error(exc) from exc

    def _outcomes_open(self) -> bool:
        """`report_outcome` for clients: only where the operator opened it (the agent under review
        must not label its own work)."""
        leash = self.proxy.config.leash
        return self.proxy.leash is not None and leash is not None and bool(getattr(leash, "client_outcomes", False))

    async def _delegate(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        """Run a whole task with the SpecAgent engine; progress per step, cancellation honoured."""
        engine = self.proxy.engine
        assert engine is not None
        arguments = params.arguments or {}
        task, mode, max_steps = arguments.get("task"), arguments.get("mode", "spec"), arguments.get("max_steps")
        if not isinstance(task, str) or not task.strip():
            return error_result("delegate needs `task`: the user's request, in words")
        if mode not in MODES:
            return error_result(f"delegate: mode must be one of {', '.join(MODES)}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            return error_result("delegate: max_steps must be a positive integer")
        report = _reporter(ctx)
        count = 0

        async def progress(message: str) -> None:
            nonlocal count
            count += 1
            if report is not None:
                await report(float(count), None, message)

        user = _UserChannel(ctx, params, None)
        try:
            result = await engine.run(task, mode, progress=progress, max_steps=max_steps, user=user)
        except ProxyError as exc:
            return error_result(str(exc))
        text = result.answer or f"(no answer: {result.status}{': ' + result.error if result.error else ''})"
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text=text),
                types.TextContent(type="text", text="Trace:\n" + result.trace()),
            ],
            is_error=result.status != "answered",
        )

    async def _report_outcome(self, ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        """Label a task for LEASH: a `delegate` run by its task id, or else this session's own work."""
        leash = self.proxy.leash
        assert leash is not None
        arguments = params.arguments or {}
        success = arguments.get("success")
        if not isinstance(success, bool):
            return error_result("report_outcome needs `success`: true if the task was done right, else false")
        task_id = arguments.get("task_id")
        if isinstance(task_id, str) and task_id:
            if not await leash.report_outcome(task_id, success):
                return error_result(f"report_outcome: no run {task_id!r} is remembered (see the delegate trace)")
            text = f"recorded: run {task_id} {'succeeded' if success else 'failed'}"
        else:
            session = self.session_for(ctx)
            steps = session.history.committed + session.history.open
            intents = [step.intent for step in steps if step.intent]
            task = str(arguments.get("task") or (intents[0] if intents else f"session {session.id}"))
            await leash.label_task(task, success, meta={"session": session.id})
            if success and steps:
                await leash.label_steps(steps, ["success"] * len(steps), source="outcome")
            text = f"recorded: this session's task {'succeeded' if success else 'failed'}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    # -- prompts and resources ---------------------------------------------------------------

    async def _list_prompts(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
        return types.ListPromptsResult(
            prompts=[prompt.model_copy(update={"name": entry.name}) for entry, prompt in self.proxy.catalog.prompts()]
        )

    async def _get_prompt(self, ctx: Ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        try:
            entry = self.proxy.catalog.prompt(params.name)
            session = self.session_for(ctx).id
            prompt: types.GetPromptResult = await self.proxy.gate.get_prompt(
                session, entry.server, entry.original, params.arguments
            )
            return prompt
        except ProxyError as exc:
            raise _wire_error(exc) from exc

    async def _list_resources(self, ctx: Ctx, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
        sep = self.proxy.config.separator
        return types.ListResourcesResult(
            resources=[r.model_copy(update={"name": f"{s}{sep}{r.name}"}) for s, r in self.proxy.catalog.resources()]
        )

    async def _list_templates(
        self, ctx: Ctx, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        sep = self.proxy.config.separator
        return types.ListResourceTemplatesResult(
            resource_templates=[
                t.model_copy(update={"name": f"{s}{sep}{t.name}"}) for s, t in self.proxy.catalog.resource_templates()
            ]
        )

    async def _read_resource(self, ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        try:
            owner = self.proxy.catalog.resource_owner(params.uri)
            resource: types.ReadResourceResult = await self.proxy.gate.read_resource(
                self.session_for(ctx).id, owner, params.uri
            )
            return resource
        except ProxyError as exc:
            raise _wire_error(exc) from exc


@dataclass
class Ticket:
    """One `input_required` approval waiting for its retry."""

    binding: tuple[str, str, str]  # session, tool, arguments digest
    expires: float  # time.monotonic()
    question: str  # digest of what the user was shown: the answer settles that question only
    memo: dict[str, Any] = field(default_factory=dict)


class Approvals:
    """Approval tickets of the 2026-07-28 era: issued with `input_required`, taken once by the retry.

    The `request_state` a client holds is `<nonce>.<hmac>`; the HMAC covers the nonce and the
    binding, so a ticket cannot be moved to another session, tool or argument set, and the nonce
    is forgotten the first time it is used (or when it expires), so it cannot be used twice.
    """

    def __init__(self, ttl: float) -> None:
        self._key = secrets.token_bytes(32)
        self._ttl = ttl
        self._pending: OrderedDict[str, Ticket] = OrderedDict()

    def issue(self, binding: tuple[str, str, str], need: InputNeeded) -> str:
        self._expire()
        nonce = secrets.token_hex(16)
        self._pending[nonce] = Ticket(binding, time.monotonic() + self._ttl, question(need.message), dict(need.memo))
        while len(self._pending) > MAX_PENDING_APPROVALS:
            self._pending.popitem(last=False)
        return f"{nonce}.{self._mac(nonce, binding)}"

    def take(self, state: str | None, binding: tuple[str, str, str]) -> Ticket | None:
        """The ticket `state` names, once, if it is genuine, unexpired and bound to `binding`."""
        self._expire()
        nonce, _, mac = (state or "").partition(".")
        if not hmac.compare_digest(mac, self._mac(nonce, binding)):
            return None
        ticket = self._pending.pop(nonce, None)
        return ticket if ticket is not None and ticket.binding == binding else None

    def _mac(self, nonce: str, binding: tuple[str, str, str]) -> str:
        message = "\0".join((nonce, *binding)).encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            nonce, ticket = next(iter(self._pending.items()))
            if ticket.expires > now:
                break
            del self._pending[nonce]


class _UserChannel:
    """Asks the person behind this call's client, in whichever way its era allows."""

    def __init__(self, ctx: Ctx, params: types.CallToolRequestParams, ticket: Ticket | None) -> None:
        self._ctx = ctx
        self._params = params
        self._ticket = ticket
        self.memo: dict[str, Any] = ticket.memo if ticket is not None else {}

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        ctx = self._ctx
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            return None
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            answer = (self._params.input_responses or {}).get(_APPROVAL_KEY)
            # An answer counts only with a genuine, unused ticket of this very call, and only for
            # the question it answered: a retry that would ask something else (another substitute,
            # other arguments) asks again.
            ticket = self._ticket
            if isinstance(answer, types.ElicitResult) and ticket is not None and ticket.question == question(message):
                self._ticket = None  # one answer, one decision
                return answer.model_dump(mode="json", exclude_none=True)
            raise InputNeeded(_APPROVAL_KEY, message, schema)
        try:
            result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        except NoBackChannelError:
            return None
        return result.model_dump(mode="json", exclude_none=True)


def question(message: str) -> str:
    return hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()


def _session_name(ctx: Ctx) -> str | None:
    """The session a 2026-07-28 request names: its header, else its `_meta`; None when it names none."""
    request = ctx.request
    headers = getattr(request, "headers", None)
    name = headers.get(SESSION_HEADER) if headers is not None else None
    if not name:
        meta = ctx.meta or {}
        value = meta.get(SESSION_META) if isinstance(meta, Mapping) else getattr(meta, SESSION_META, None)
        name = value if isinstance(value, str) else None
    return name[:256] if name else None


def _reporter(ctx: Ctx) -> Report | None:
    meta = ctx.meta or {}
    if meta.get("progress_token") is None and meta.get("progressToken") is None:
        return None
    session = ctx.session

    async def report(progress: float, total: float | None, message: str | None) -> None:
        await session.report_progress(progress, total, message)

    return report


def _wire_error(exc: ProxyError) -> MCPError:
    """The one place proxy errors become JSON-RPC errors."""
    code = INVALID_PARAMS if isinstance(exc, ToolNotFound) else INTERNAL_ERROR
    return MCPError(code=code, message=str(exc))


# -- transports ------------------------------------------------------------------------------


async def serve_stdio(front: McpFront) -> None:
    """Serve one client on this process's stdin/stdout until it closes them.

    As the SDK's stdio server does, fd 0 and 1 point elsewhere while serving (stray prints and
    children cannot touch the wire). Unlike it, a line that is not a valid message is answered
    (JSON-RPC 2.0: -32700 or -32600, with the request's id where one can be read) instead of
    leaving the client to wait forever on that id.
    """
    front.stdio_session = front.proxy.barrier.new_session()
    wire_in, release_in = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
    wire_out, release_out = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
    try:
        lines = _RecordedLines(anyio.wrap_file(_UnownedTextWrapper(wire_in, encoding="utf-8", errors="replace")))
        stdout = anyio.wrap_file(_UnownedTextWrapper(wire_out, encoding="utf-8"))
        async with stdio_server(stdin=cast(Any, lines), stdout=stdout) as (read, write):
            answering = _AnswerMalformed(read, write, lines.taken)
            await front.server.run(answering, write, front.server.create_initialization_options())
    finally:
        for release in (release_out, release_in):
            if release is not None:
                release()


class _RecordedLines:
    """Lines of stdin as the SDK reads them, kept until the matching message is taken."""

    def __init__(self, file: anyio.AsyncFile[str]) -> None:
        self._file = file
        self.taken: deque[str] = deque()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        async for line in self._file:
            self.taken.append(line)
            yield line


class _AnswerMalformed:
    """The server's read stream; a line that failed to parse gets its JSON-RPC error answered."""

    def __init__(self, inner: Any, write: Any, lines: deque[str]) -> None:
        self._inner = inner
        self._write = write
        self._lines = lines

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def receive(self) -> Any:
        while True:
            item = await self._inner.receive()
            line = self._lines.popleft() if self._lines else ""
            if not isinstance(item, Exception):
                return item
            error = malformed_answer(line)
            if error is not None:
                await self._write.send(SessionMessage(error))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _AnswerMalformed:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _AnswerMalformed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._inner.aclose()


_ANY_ID = re.compile(r'"id"\s*:\s*(-?\d{1,19}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')


def malformed_answer(line: str) -> types.JSONRPCError | None:
    """The JSON-RPC error a line that is not a valid message deserves, or None (a notification)."""
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        # JSON-RPC 2.0: when the id cannot be detected (a parse error), the answer's id is null.
        return types.JSONRPCError(
            jsonrpc="2.0", id=None, error=types.ErrorData(code=PARSE_ERROR, message="Parse error")
        )
    except (RecursionError, ValueError) as exc:
        # Nested too deep, or an integer past Python's digit limit: the id may still be legible.
        found = _ANY_ID.search(line[:4096])
        request_id = json.loads(found.group(1)) if found else None
        why = "nested too deep" if isinstance(exc, RecursionError) else "a number is too long"
        return types.JSONRPCError(
            jsonrpc="2.0", id=request_id, error=types.ErrorData(code=INVALID_REQUEST, message=f"Invalid Request: {why}")
        )
    if isinstance(data, dict) and "method" in data and "id" not in data:
        return None  # a malformed notification: nobody waits for an answer
    raw_id = data.get("id") if isinstance(data, dict) else None
    request_id = (
        raw_id if isinstance(raw_id, str) or (isinstance(raw_id, int) and not isinstance(raw_id, bool)) else None
    )
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a valid JSON-RPC 2.0 message"),
    )


def http_app(front: McpFront, *, host: str, token: str | None, allowed_hosts: list[str] | None = None) -> ASGIApp:
    """The streamable HTTP app at `/mcp`, with DNS-rebinding protection always on."""
    hosts = [f"{name}:*" for name in host_names(host, allowed_hosts or [])]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts],
    )
    app: ASGIApp = front.server.streamable_http_app(host=host, transport_security=security)
    return BearerToken(app, token) if token else app


async def serve_http(
    front: McpFront,
    host: str,
    port: int,
    *,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve streamable HTTP until cancelled; `task_status.started(port)` once listening."""
    app = http_app(front, host=host, token=token, allowed_hosts=allowed_hosts)
    async with anyio.create_task_group() as tg:
        bound = await tg.start(lambda task_status: serve_asgi(app, host, port, task_status=task_status))
        logger.info("serving streamable HTTP on http://%s:%d/mcp", host, bound)
        task_status.started(bound)
