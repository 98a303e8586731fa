"""The OpenAI-compatible gateway: point any chat-completions agent at the SpecAgent engine.

`POST /v1/chat/completions` (plain and streaming) and `GET /v1/models`. The `model` field picks
the mode: `spec` (the default, also `mcp-spec-proxy`), `weak-only` or `strong-only`.

Each client conversation keeps its own session (`gateway_sessions.py` says which session a
request continues: never one whose messages are not an exact prefix of the request's, and never
by accident; `X-Session-Id` names one). A session runs the engine in a background task and talks
to it through a bridge:

* tools the client sent in the request are the client's: when the engine needs one run, the
  gateway answers the HTTP request with an ordinary `tool_calls` message, and the engine goes on
  when the client's next request brings the `tool` result. Which client tools are read-only is
  configured by name patterns (`gateway.client_read_only`); the others are writes, held for
  verification like any write before they are handed to the client;
* the backends' tools (unless `gateway.backend_tools: false`) are run by the gateway itself.

The models see the session's own transcript, not the client's: a rejected step the client
already ran stays in the client's transcript but is gone from the history the models see.
`--telemetry FILE` gets one line per request with the decision, verdicts and model calls (each
verdict on the line of the request that handed its call out, not of the one bringing its result).

At the door (`Gateway.app`): the Host, and the Origin when a browser sends one, must name this
server (DNS-rebinding protection; `--allow-host` adds names); with a token (`--token-env`) every
request must carry `Authorization: Bearer <token>`; under the config's `auth:` every request must
bear a token the issuer made for `auth.audience`, checked as the MCP front checks it
(`identity.ResourceServer`: 401 with `WWW-Authenticate` naming the protected resource metadata,
which the gateway serves too). Its principal opens and owns the session (`gateway_sessions.py`),
sees what `access:` shows it, and its run's calls meet `rules:` as its own, their audit lines
naming it. A POST must be `application/json`, which a
web page cannot send cross-site without a CORS preflight the gateway never grants.

One request's failure answers that request alone: a session's background task turns whatever
goes wrong into that session's failure, and `chat` turns any unexpected exception into a 500 for
that request. JSON goes out ASCII-escaped, so text that is not valid Unicode (a lone surrogate a
model wrote) still makes a valid answer.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import ExitStack, asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp_types as types
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from mcp_spec_proxy.backends.session_legs import ASKING
from mcp_spec_proxy.calls.access import viewing
from mcp_spec_proxy.engine import MODES, Engine, Mode
from mcp_spec_proxy.errors import ProxyError, ShuttingDown, ToolNotFound
from mcp_spec_proxy.fronts.asgi import BearerToken, HostGuard, host_names
from mcp_spec_proxy.fronts.chat_wire import AsciiJSON, chunks, error_response, message_text, rendered
from mcp_spec_proxy.fronts.gateway_sessions import (
    Action,
    Answer,
    Failure,
    GatewaySession,
    Sessions,
    ToolCallOut,
    prefix_digests,
)
from mcp_spec_proxy.fronts.identity import ResourceServer
from mcp_spec_proxy.fronts.introspection import token_verifier
from mcp_spec_proxy.fronts.own_tools import runnable_modes
from mcp_spec_proxy.fronts.probes import Door
from mcp_spec_proxy.observe.telemetry import Telemetry
from mcp_spec_proxy.principal import principal_of, who
from mcp_spec_proxy.proxy import Proxy
from mcp_spec_proxy.tools.arguments import check_arguments
from mcp_spec_proxy.tools.catalog import CLIENT, Catalog, CatalogTool
from mcp_spec_proxy.wire_types import AssistantMessage, ChatCompletion, Usage

if TYPE_CHECKING:
    import jsonschema

logger = logging.getLogger(__name__)

STOPPED_AT_A_LIMIT = ("max_steps", "max_segments", "timeout")
SESSION_HEADERS = ("x-session-id", "mcp-spec-proxy-session")
LET_GO_WAIT_S = 10.0  # how long a request waits for the runs of sessions it let go to unwind
MODEL_ALIASES: dict[str, Mode] = {"mcp-spec-proxy": "spec", **{mode: mode for mode in MODES}}


class BadRequest(ProxyError):
    def __init__(self, message: str, status: int = 400, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ClientToolView:
    """The catalog (optionally) plus tools an OpenAI-style client brought and will execute itself.

    A client tool is a read when its name matches one of `read_only` (globs), else a write; its
    name is used as given, so it must not collide with a catalog name (the catalog wins).
    """

    def __init__(self, catalog: Catalog | None, definitions: list[dict[str, Any]], read_only: list[str]) -> None:
        self._catalog = catalog
        self._client: dict[str, CatalogTool] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        for definition in definitions:
            function = definition.get("function") or {}
            name = function.get("name")
            if not isinstance(name, str) or (catalog is not None and name in {t.name for t in catalog.tools()}):
                continue
            schema = function.get("parameters") or {"type": "object", "properties": {}}
            read = any(fnmatch.fnmatchcase(name, pattern) for pattern in read_only)
            self._client[name] = CatalogTool(
                name=name,
                server=CLIENT,
                original=name,
                definition=types.Tool(name=name, description=function.get("description"), input_schema=schema),
                effect="read" if read else "write",
                reason="override" if read else "default",
                why="client tool " + ("matching a read-only pattern" if read else "not known to be read-only"),
                # The client runs its own tools; the proxy's part is SpecAgent's verification of them.
                review="strong",
                on_reject=None,
                fingerprint="",
                wants_intent=False,
            )

    def tools(self) -> list[CatalogTool]:
        return [*(self._catalog.tools() if self._catalog else []), *self._client.values()]

    def lookup(self, name: str) -> CatalogTool:
        if name in self._client:
            return self._client[name]
        if self._catalog is None:
            raise ToolNotFound(f"unknown tool {name!r}")
        return self._catalog.lookup(name)

    def validate(self, tool: CatalogTool, arguments: Mapping[str, Any]) -> None:
        if tool.server != CLIENT:
            assert self._catalog is not None
            self._catalog.validate(tool, arguments)
            return
        check_arguments(self._validators, tool, arguments)


class Gateway:
    def __init__(self, proxy: Proxy, *, clock: Callable[[], float] = time.monotonic) -> None:
        if proxy.engine is None:
            raise ProxyError(
                f"the gateway needs models.{proxy.config.review.model} (and models.weak for spec and weak-only)"
            )
        self.engine: Engine = proxy.engine
        self.proxy = proxy
        self.telemetry: Telemetry = proxy.telemetry
        settings = proxy.config.gateway
        self.sessions = Sessions(settings.max_sessions, settings.session_idle_s, clock)
        # A turn waiting for its client's tool result is in flight: a drain says it waits for the client.
        proxy.gate.drain.results_awaited = self.sessions.out_with_clients
        self._tg: anyio.abc.TaskGroup | None = None

    def app(
        self, *, host: str = "127.0.0.1", token: str | None = None, allowed_hosts: list[str] | None = None
    ) -> ASGIApp:
        """The API, behind the Host/Origin check for a server bound to `host`, and the token or `auth:`."""
        auth = self.proxy.config.auth
        if auth is not None and token:
            raise ValueError("give either a bearer token or `auth:`, not both")  # the command line says so first

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                yield
                tg.cancel_scope.cancel()

        app: ASGIApp = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
            ],
            lifespan=lifespan,
        )
        if token:
            app = BearerToken(app, token)
        elif auth is not None:
            app = ResourceServer(app, auth, token_verifier(auth, self.proxy.auth_secret))
        return HostGuard(app, host_names(host, allowed_hosts or []))

    async def models(self, request: Request) -> Response:
        """The names a request may give that can run here: `spec+leash` only with LEASH, `spec` and
        `weak-only` only with a weak model."""
        created = int(time.time())
        runnable = runnable_modes(self.engine)
        return AsciiJSON(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": created, "owned_by": "mcp-spec-proxy"}
                    for name, mode in MODEL_ALIASES.items()
                    if mode in runnable
                ],
            }
        )

    async def chat(self, request: Request) -> Response:
        """The one place where a request's failures become its HTTP error; no failure outlives it."""
        try:
            with ExitStack() as slot:  # the drain's slot, taken once the request's session is known
                return await self._chat(request, slot)
        except ShuttingDown as exc:
            refused = error_response(503, str(exc), "shutting_down")
            refused.headers["retry-after"] = "1"
            return refused
        except Exception:
            logger.exception("gateway: a chat request failed")
            message = "the gateway failed on this request (its log has the details); other requests are unaffected"
            return error_response(500, message, "internal_error")

    async def _chat(self, request: Request, slot: ExitStack) -> Response:
        try:
            _require_json(request)
            body = await _json(request)
            mode, messages, tools, stream, include_usage = _parse(body)
            name = next((request.headers[h] for h in SESSION_HEADERS if h in request.headers), None)
            principal = principal_of(request)  # under `auth:`, the verified token's; else nobody identified
            digests = await anyio.to_thread.run_sync(prefix_digests, messages)  # a long conversation is CPU work
            # From here to `took_in` nothing awaits: the session a request continues is claimed at
            # once, so a concurrent request with the same messages cannot continue it too.
            let_go = self.sessions.sweep()
            owner = principal.key if principal is not None else ""
            found = self.sessions.find(name, messages, digests, owner)
            session = found or GatewaySession(name, self.sessions.clock(), principal)
            if not session.running:
                # A new turn is a new call: refused once draining. A request that brings the tool results
                # a running turn waits for (`find`) goes on with that turn, which counts itself (`_start`).
                slot.enter_context(self.proxy.gate.admitted(session.key, "this chat completion", None, principal))
            start = _take_in(session, messages)
            let_go += self.sessions.took_in(session, messages, digests[-1])
            if start:
                self._start(session, mode, tools)
            session.busy += 1
            try:
                await _unwound(let_go)
                async with session.lock:
                    action = await self._receive(session)
                    events = session.drain()
            finally:
                session.busy -= 1
        except BadRequest as exc:
            return error_response(exc.status, str(exc), exc.code)
        response = _completion(action, events, str(body.get("model") or "spec"))
        await self.telemetry.record(
            "gateway_request",
            session=session.key,
            **({"session_name": session.name} if session.name is not None else {}),  # the client's X-Session-Id
            decision=_decision(action),
            verdicts=[data for kind, data in events if kind == "verdict"],
            model_calls=[data for kind, data in events if kind == "model_call"],
            **who(session.principal),
        )
        if isinstance(action, Failure):
            self.sessions.drop(session)  # the same request sent again starts the turn afresh
            failed = error_response(action.status, action.message, action.code)
            failed.headers["x-should-retry"] = "false"  # the openai SDK's own flag, for the 500s too
            return failed
        if stream:
            return StreamingResponse(chunks(response, include_usage), media_type="text/event-stream")
        return AsciiJSON(response)

    async def _receive(self, session: GatewaySession) -> Action:
        """The run's next action: the answer to this request."""
        try:
            with anyio.fail_after(self.engine.limits.max_wall_s + 5):
                action = await session.actions_out.receive()
        except anyio.EndOfStream:
            return Failure(
                "this conversation's session was let go before it answered (idle too long, or too many"
                " sessions at once); send the conversation again to start it afresh",
                code="session_let_go",
            )
        if isinstance(action, Answer):
            session.answer = action.text  # what the client echoes back before its next user message
        self.sessions.touch(session)
        return action

    def _start(self, session: GatewaySession, mode: Mode, tools: list[dict[str, Any]]) -> None:
        # Its clients see what `access:` shows the session's principal (the empty one without `auth:`),
        # and the run's task inherits that view (`calls/access.py`).
        with viewing(self.proxy.access.view(session.principal) if self.proxy.access else None):
            self._start_run(session, mode, tools)

    def _start_run(self, session: GatewaySession, mode: Mode, tools: list[dict[str, Any]]) -> None:
        assert self._tg is not None
        gateway = self.proxy.config.gateway
        view = ClientToolView(self.proxy.catalog if gateway.backend_tools else None, tools, gateway.client_read_only)
        session.running = True
        session.ended = anyio.Event()
        transcript = list(session.transcript)

        async def run() -> None:
            action: Action
            ASKING.set(session.principal)  # its backend requests are its principal's (a person's login is theirs)
            try:
                # In flight for the drain until it ends, between requests too (waiting for the client's tools).
                with session.scope, self.proxy.gate.drain.continuing():  # cancelled when the session is let go
                    try:
                        action = await self._turn(session, transcript, mode, view)
                    except Exception:
                        # This task's boundary: what escapes here would end the gateway's task group, and
                        # every later request from every client would fail. It ends this session's turn only.
                        logger.exception("gateway: session %s failed", session.key)
                        message = (
                            "the gateway failed on this turn (its log has the details); other sessions are unaffected"
                        )
                        action = Failure(message, 500, "internal_error")
                    finally:
                        session.running = False
                    with suppress(anyio.ClosedResourceError):  # let go meanwhile: no one will read it
                        await session.actions_in.send(action)
            finally:
                session.running = False
                session.ended.set()

        self._tg.start_soon(run, name=f"gateway:{session.key}")

    async def _turn(
        self, session: GatewaySession, transcript: list[dict[str, Any]], mode: Mode, view: ClientToolView
    ) -> Action:
        try:
            result = await self.engine.run(
                transcript, mode, tools=view, client=session, observe=session.observe, principal=session.principal
            )
        except ProxyError as exc:
            return Failure(f"the task failed: {exc}")
        session.transcript.extend(rendered(result))
        if result.answer is None and result.status in STOPPED_AT_A_LIMIT:
            # A clean stop, not an upstream failure: OpenAI's own word for it is finish_reason "length".
            steps = len(result.steps)
            text = f"[mcp-spec-proxy] stopped at a limit ({result.status}) before an answer; {steps} steps ran."
            return Answer(text, result, finish="length")
        if result.answer is None:
            return Failure(f"the task ended without an answer: {result.status} {result.error or ''}".strip())
        return Answer(result.answer, result)


def _take_in(session: GatewaySession, messages: list[dict[str, Any]]) -> bool:
    """Take the request's new messages into `session`; True when they start a run. A request the
    session cannot take is refused before anything in the session changes."""
    new = messages[session.consumed :]
    if session.running:
        if any(m.get("role") == "user" for m in new):
            raise BadRequest("a new user message arrived while the previous turn still waits for a tool result", 409)
        for message in new:
            pending = (
                session.pending.pop(str(message.get("tool_call_id")), None) if message.get("role") == "tool" else None
            )
            if pending is not None:
                pending.observation = message_text(message.get("content"))
                pending.is_error = False
                pending.done.set()
        return False
    said = [m for m in new if m.get("role") in ("user", "system", "developer")]
    if not said or said[-1].get("role") != "user":
        raise BadRequest("nothing to do: end the conversation with a user message or the pending tool results")
    session.transcript.extend({"role": m.get("role"), "content": m.get("content")} for m in said)
    return True


async def _unwound(sessions: list[GatewaySession]) -> None:
    """Wait (bounded) for the runs of sessions just let go to unwind, so what their cancel
    interrupted is on the audit trail before this request goes on."""
    with anyio.move_on_after(LET_GO_WAIT_S):
        for session in sessions:
            await session.ended.wait()


def _decision(action: Action) -> str:
    return {ToolCallOut: "toolcall", Answer: "answer", Failure: "failure"}[type(action)]


def _require_json(request: Request) -> None:
    """Only `application/json` bodies: a web page can POST `text/plain` cross-site with no preflight."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise BadRequest(
            f"the request body must be sent as Content-Type: application/json, not {media or 'no Content-Type'}",
            415,
            "unsupported_media_type",
        )


async def _json(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _parse(body: dict[str, Any]) -> tuple[Mode, list[dict[str, Any]], list[dict[str, Any]], bool, bool]:
    model = body.get("model") or "spec"
    if model not in MODEL_ALIASES:
        raise BadRequest(
            f"the model {model!r} does not exist; use one of {', '.join(MODEL_ALIASES)}", 404, "model_not_found"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise BadRequest("'messages' must be a non-empty list of {role, content} objects")
    tools = body.get("tools") or []
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in tools):
        raise BadRequest("'tools' must be a list of {type: function, function: {...}} objects")
    options = body.get("stream_options") or {}
    return MODEL_ALIASES[model], messages, tools, bool(body.get("stream")), bool(options.get("include_usage"))


def _completion(action: Action, events: list[tuple[str, dict[str, Any]]], model: str) -> ChatCompletion:
    calls = [data for kind, data in events if kind == "model_call"]
    usage: Usage = {
        "prompt_tokens": sum(c["prompt_tokens"] for c in calls),
        "completion_tokens": sum(c["completion_tokens"] for c in calls),
        "total_tokens": sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls),
        "prompt_tokens_details": {"cached_tokens": sum(c["cached_tokens"] for c in calls)},
    }
    message: AssistantMessage = {"role": "assistant", "content": None}
    finish = "stop"
    if isinstance(action, ToolCallOut):
        arguments = json.dumps(action.step.arguments, ensure_ascii=False)
        message["tool_calls"] = [
            {"id": action.call_id, "type": "function", "function": {"name": action.step.tool, "arguments": arguments}}
        ]
        finish = "tool_calls"
    elif isinstance(action, Answer):
        message["content"] = action.text
        finish = action.finish
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


async def serve_gateway(
    gateway: Gateway,
    host: str,
    port: int,
    *,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    door: Door | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status.started(port)` once `/v1` answers.

    With `token`, every request must carry `Authorization: Bearer <token>`; `allowed_hosts` are
    names besides loopback (and `host`) that the Host and Origin headers may use. `door` is the
    port's app already listening (`/readyz` says "starting" until now; `port` is the port it
    bound); without one it is opened here. The probes and `/metrics` are served beside `/v1`.
    """
    app = gateway.app(host=host, token=token, allowed_hosts=allowed_hosts)
    async with anyio.create_task_group() as tg:
        if door is None:
            door = Door(token=token, hosts=host_names(host, allowed_hosts or []))
            port = await tg.start(door.serve, host, port)
        async with door.mounted(app, gateway.proxy):
            logger.info("gateway: OpenAI-compatible API on http://%s:%d/v1", host, port)
            task_status.started(port)
            await anyio.sleep_forever()
