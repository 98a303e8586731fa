"""The front's side of the relay: how a backend's question reaches the client of the call.

`backends/relay.py` finds the call a backend's request belongs to; this module asks that call's
client, in whichever way its era allows:

* handshake era: a request on the client's connection, on the stream of the call it belongs to
  (`_RequestLink`, from the call's context; `_ConnectionLink` for a stdio read served past the
  SDK, whose one connection is the only stream there is);
* 2026-07-28 era: the client cannot be sent a request, so the call is *suspended*
  (`Suspensions`): it goes on running in the front's own task group while the client's request
  is answered `input_required` with the backend's question; the client's retry, carrying its
  answer and the `request_state` it was given, resumes the very call that asked. The state is
  `relay.<nonce>.<hmac>`: single-use, bound by HMAC to the session, the tool and its arguments,
  and forgotten when the call ends or its question goes unanswered for `ttl` seconds. A
  suspended call lives in this process: a retry that reaches another replica is not resumed.

Every relayed request is one audit line (`relayed`: session, server, method); a sampling request
spends the user's model, and an elicitation asks them something. The answer goes to the backend
only — never to the gate, whose approvals are tickets of their own (`fronts/mcp.py` `Approvals`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import REQUEST_TIMEOUT
from pydantic import BaseModel, ConfigDict

from mcp_spec_proxy.backends.relay import CALLER, ClientLink, Kind

logger = logging.getLogger(__name__)

STATE_PREFIX = "relay."
MAX_WAITING = 1024  # suspended calls at once; past it the oldest question is given up
RELAY_KEY_PREFIX = "mcp-spec-proxy/relay/"  # the keys of relayed questions, apart from the gate's own

Audit = Callable[[str, str], Awaitable[None]]
"""Records one relayed request: (server, method)."""

_REQUESTS: dict[str, type[BaseModel]] = {
    "sampling/createMessage": types.CreateMessageRequest,
    "elicitation/create": types.ElicitRequest,
    "roots/list": types.ListRootsRequest,
}


class _Passthrough(BaseModel):
    """A client's result as it came (the SDK has checked it against the method's result type)."""

    model_config = ConfigDict(extra="allow")


def _declares(capabilities: types.ClientCapabilities | None, kind: Kind) -> bool:
    if capabilities is None:
        return False
    return {
        "sampling": capabilities.sampling,
        "elicitation": capabilities.elicitation,
        "roots": capabilities.roots,
    }[kind] is not None


def declares_any(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether a backend's question could be put to this client at all."""
    return any(_declares(capabilities, kind) for kind in ("sampling", "elicitation", "roots"))


def _request(method: str, params: dict[str, Any] | None) -> Any:
    body: dict[str, Any] = {"method": method}
    if params is not None:
        body["params"] = params
    return _REQUESTS[method].model_validate(body, by_name=False)


@dataclass
class _RequestLink:
    """A handshake-era client, asked on the stream of the request its call came in."""

    client: object
    ctx: ServerRequestContext[Any, Any]
    audit: Audit

    def supports(self, kind: Kind) -> bool:
        return _declares(self.ctx.session.client_capabilities, kind)

    async def relay(self, server: str, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        await self.audit(server, method)
        metadata = ServerMessageMetadata(related_request_id=self.ctx.request_id)
        result = await self.ctx.session.send_request(_request(method, params), _Passthrough, metadata=metadata)
        dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped


@dataclass
class _ConnectionLink:
    """The stdio client, asked on its connection (a read served past the SDK has no context)."""

    client: object
    connection: Connection
    audit: Audit

    def supports(self, kind: Kind) -> bool:
        return _declares(self.connection.client_capabilities, kind)

    async def relay(self, server: str, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        await self.audit(server, method)
        return await self.connection.outbound.send_raw_request(method, params, None)


@dataclass
class _Mute:
    """A client that declared none of what a backend may ask (or cannot be reached)."""

    client: object

    def supports(self, kind: Kind) -> bool:
        return False

    async def relay(self, server: str, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        raise MCPError(types.METHOD_NOT_FOUND, f"the client does not support {method}")


def request_link(client: object, ctx: ServerRequestContext[Any, Any], audit: Audit) -> ClientLink:
    return _RequestLink(client, ctx, audit)


def connection_link(client: object, connection: Connection | None, audit: Audit) -> ClientLink:
    return _Mute(client) if connection is None else _ConnectionLink(client, connection, audit)


def mute_link(client: object) -> ClientLink:
    return _Mute(client)


# -- the 2026-07-28 era: suspended calls ---------------------------------------------------------


@dataclass
class _Question:
    key: str
    request: Any
    deadline: float  # time.monotonic() past which it goes unanswered
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: dict[str, Any] | None = None


@dataclass
class _Ended:
    result: Any = None
    error: BaseException | None = None


_Event = _Question | _Ended


@dataclass
class _Suspended:
    binding: tuple[str, str, str]
    events: MemoryObjectReceiveStream[_Event]
    question: _Question | None = None
    expires: float = math.inf


@dataclass
class _SuspendingLink:
    """A 2026-07-28 client: each question suspends its call until the client's retry answers it."""

    client: object
    capabilities: types.ClientCapabilities | None
    events: MemoryObjectSendStream[_Event]
    ttl: float
    audit: Audit
    count: int = 0

    def supports(self, kind: Kind) -> bool:
        return _declares(self.capabilities, kind)

    async def relay(self, server: str, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        await self.audit(server, method)
        self.count += 1
        key = f"{RELAY_KEY_PREFIX}{server}/{self.count}"
        question = _Question(key, _request(method, params), time.monotonic() + self.ttl)
        try:
            await self.events.send(question)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise MCPError(REQUEST_TIMEOUT, f"the client is no longer waiting to answer {method}") from None
        with anyio.move_on_after(self.ttl):
            await question.answered.wait()
        if question.answer is None:
            raise MCPError(REQUEST_TIMEOUT, f"the client did not answer {method} within {self.ttl:g}s")
        return question.answer


Run = Callable[[], Awaitable[Any]]


class Suspensions:
    """Calls of 2026-07-28 clients that wait for their client's answers; see the module docstring."""

    def __init__(self, ttl: float, audit: Audit) -> None:
        self._ttl = ttl
        self._audit = audit
        self._key = secrets.token_bytes(32)
        self._waiting: dict[str, _Suspended] = {}
        self._host: anyio.abc.TaskGroup | None = None

    @asynccontextmanager
    async def hosting(self) -> AsyncIterator[None]:
        """While the front serves: suspended calls run in this task group, and end with it."""
        async with anyio.create_task_group() as host:
            self._host = host
            try:
                yield
            finally:
                self._host = None
                host.cancel_scope.cancel()

    def owns(self, state: str | None) -> bool:
        return bool(state) and str(state).startswith(STATE_PREFIX)

    async def call(
        self,
        client: object,
        capabilities: types.ClientCapabilities | None,
        binding: tuple[str, str, str],
        run: Run,
    ) -> Any:
        """`run()`'s result, or `input_required` with the first question it asks the client.
        Without a host (a front that is not serving) the call runs here, and its client is mute."""
        host = self._host
        if host is None or not declares_any(capabilities):
            token = CALLER.set(mute_link(client))
            try:
                return await run()
            finally:
                CALLER.reset(token)
        send, receive = anyio.create_memory_object_stream[_Event](math.inf)
        link = _SuspendingLink(client, capabilities, send, self._ttl, self._audit)
        host.start_soon(self._run, link, run, send)
        return await self._next(_Suspended(binding, receive))

    async def resume(self, state: str | None, binding: tuple[str, str, str], responses: dict[str, Any] | None) -> Any:
        """The suspended call `state` names, given the client's answer: its next outcome. A state
        that is forged, spent, expired or bound to another call is a wire error (nothing resumes)."""
        nonce, _, mac = str(state).removeprefix(STATE_PREFIX).partition(".")
        self._forget_expired()
        waiting = self._waiting.get(nonce)
        if waiting is None or not hmac.compare_digest(mac, self._mac(nonce, binding)) or waiting.binding != binding:
            raise MCPError(
                types.INVALID_PARAMS,
                "this request_state names no call waiting for an answer (spent, expired, or another call's):"
                " call the tool again without it",
            )
        del self._waiting[nonce]
        question = waiting.question
        assert question is not None
        answer = (responses or {}).get(question.key)
        if answer is not None:
            question.answer = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        question.answered.set()
        return await self._next(waiting)

    async def _run(self, link: _SuspendingLink, run: Run, send: MemoryObjectSendStream[_Event]) -> None:
        token = CALLER.set(link)
        try:
            outcome = _Ended(result=await run())
        except Exception as exc:  # boundary: the call's own failure is its outcome, for the client to get
            outcome = _Ended(error=exc)
        finally:
            CALLER.reset(token)
        with send, suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await send.send(outcome)  # nobody listens when the client never came back: the outcome is audited

    async def _next(self, waiting: _Suspended) -> Any:
        event = await waiting.events.receive()
        if isinstance(event, _Ended):
            waiting.events.close()
            if event.error is not None:
                raise event.error
            return event.result
        waiting.question = event
        waiting.expires = event.deadline
        self._forget_expired()
        while len(self._waiting) >= MAX_WAITING:  # a client that never answers cannot grow this without bound
            _give_up(self._waiting.pop(next(iter(self._waiting))))
        nonce = secrets.token_hex(16)
        self._waiting[nonce] = waiting
        return types.InputRequiredResult(
            input_requests={event.key: event.request},
            request_state=f"{STATE_PREFIX}{nonce}.{self._mac(nonce, waiting.binding)}",
        )

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for nonce in [nonce for nonce, waiting in self._waiting.items() if waiting.expires <= now]:
            _give_up(self._waiting.pop(nonce))

    def _mac(self, nonce: str, binding: tuple[str, str, str]) -> str:
        message = "\0".join((nonce, *binding)).encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def _give_up(waiting: _Suspended) -> None:
    """Its question goes unanswered (the backend hears so at once) and its outcome unheard."""
    waiting.events.close()
    if waiting.question is not None:
        waiting.question.answered.set()


__all__ = [
    "RELAY_KEY_PREFIX",
    "STATE_PREFIX",
    "Suspensions",
    "connection_link",
    "declares_any",
    "mute_link",
    "request_link",
]
