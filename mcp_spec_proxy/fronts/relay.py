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

Both eras bound what waits for a client: on the handshake era at most `MAX_WAITING_PER_SESSION`
of one session's questions and `MAX_WAITING` in all are before clients at once (`Asked`), and a
question past either is refused at once with an error that says so, for its backend to hear; on
the 2026-07-28 era as many suspended calls, past which the oldest question is given up.

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
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
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
from mcp_types import INVALID_REQUEST, REQUEST_TIMEOUT
from pydantic import BaseModel, ConfigDict

from mcp_spec_proxy.backends.relay import CALLER, CLIENT_ANSWERS, ClientLink, admits
from mcp_spec_proxy.fronts.hosting import Host
from mcp_spec_proxy.tools.catalog import digest

logger = logging.getLogger(__name__)

STATE_PREFIX = "relay."
MAX_WAITING = 1024  # questions before clients at once (2026-07-28: suspended calls, the oldest given up)
MAX_WAITING_PER_SESSION = 64  # of one session (all unnamed 2026-07-28 requests are one here)
BATCH_CHECKPOINTS = 3  # turns given to a backend's other questions of the same round
PROXY_KEY_PREFIX = "mcp-spec-proxy/"  # the proxy's own keys: its approvals, its relayed questions
RELAY_KEY_PREFIX = "mcp-spec-proxy/relay/"  # the keys of relayed questions, apart from the gate's own

Audit = Callable[[str, str], Awaitable[None]]
"""Records one relayed request: (server, method)."""

_REQUESTS: dict[str, type[BaseModel]] = {
    "sampling/createMessage": types.CreateMessageRequest,
    "elicitation/create": types.ElicitRequest,
    "roots/list": types.ListRootsRequest,
}


class Passthrough(BaseModel):
    """A client's result as it came (the SDK has checked it against the method's result type)."""

    model_config = ConfigDict(extra="allow")


def declares_any(capabilities: types.ClientCapabilities | None) -> bool:
    """Whether a backend's question could be put to this client at all."""
    return any(admits(capabilities, kind) for kind in ("sampling", "elicitation", "roots"))


def server_request(method: str, params: dict[str, Any] | None) -> Any:
    """A backend's question as the SDK's typed request (refused as the SDK's path refuses it)."""
    body: dict[str, Any] = {"method": method}
    if params is not None:
        body["params"] = params
    return _REQUESTS[method].model_validate(body, by_name=False)


def unanswered(method: str, ttl: float) -> MCPError:
    """What a backend hears when the client left its question unanswered for `ttl` seconds."""
    return MCPError(REQUEST_TIMEOUT, f"the client did not answer {method} within {ttl:g}s (review.timeout)")


class Asked:
    """The handshake era's questions before their clients now: each session's, and all of them.
    A question past `MAX_WAITING_PER_SESSION` of its session's, or past `MAX_WAITING` in all, is
    not put to the client: its backend is answered at once with an error that says why, so a
    backend cannot stack hundreds of forms before one person (nor crowd out other sessions)."""

    def __init__(self) -> None:
        self._of: dict[int, int] = {}  # by the client's identity: it lives while its questions wait
        self._all = 0

    @contextmanager
    def one(self, client: object, method: str) -> Iterator[None]:
        mine = self._of.get(id(client), 0)
        if mine >= MAX_WAITING_PER_SESSION:
            raise _too_many(method, f"{MAX_WAITING_PER_SESSION} of this session's questions wait for its client")
        if self._all >= MAX_WAITING:
            raise _too_many(method, f"{MAX_WAITING} questions wait for clients")
        self._of[id(client)] = mine + 1
        self._all += 1
        try:
            yield
        finally:
            self._all -= 1
            left = self._of.pop(id(client)) - 1
            if left:
                self._of[id(client)] = left


def _too_many(method: str, why: str) -> MCPError:
    logger.warning("a backend's %s was not relayed: %s", method, why)
    return MCPError(
        INVALID_REQUEST, f"mcp-spec-proxy did not relay this {method}: {why}; ask again once they are answered"
    )


@dataclass
class _RequestLink:
    """A handshake-era client, asked on the stream of the request its call came in."""

    client: object
    ctx: ServerRequestContext[Any, Any]
    audit: Audit
    ttl: float
    asked: Asked

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self.ctx.session.client_capabilities

    async def relay(self, server: str, method: str, params: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
        with self.asked.one(self.client, method):
            await self.audit(server, method)
            metadata = ServerMessageMetadata(related_request_id=self.ctx.request_id)
            request = server_request(method, params)
            try:
                with anyio.fail_after(self.ttl):
                    result = await self.ctx.session.send_request(request, Passthrough, metadata=metadata)
            except TimeoutError:
                raise unanswered(method, self.ttl) from None
        dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        return dumped


@dataclass
class _ConnectionLink:
    """The stdio client, asked on its connection (a read served past the SDK has no context)."""

    client: object
    connection: Connection
    audit: Audit
    ttl: float
    asked: Asked

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return self.connection.client_capabilities

    async def relay(self, server: str, method: str, params: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
        with self.asked.one(self.client, method):
            await self.audit(server, method)
            try:
                with anyio.fail_after(self.ttl):
                    return await self.connection.outbound.send_raw_request(method, params, None)
            except TimeoutError:
                raise unanswered(method, self.ttl) from None


@dataclass
class _Mute:
    """A client that cannot be asked: it declared nothing a backend may ask, or cannot be reached."""

    client: object

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        return None

    async def relay(self, server: str, method: str, params: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
        raise MCPError(types.METHOD_NOT_FOUND, f"the client does not support {method}")


def request_link(
    client: object, ctx: ServerRequestContext[Any, Any], audit: Audit, ttl: float, asked: Asked
) -> ClientLink:
    return _RequestLink(client, ctx, audit, ttl, asked)


def connection_link(
    client: object, connection: Connection | None, audit: Audit, ttl: float, asked: Asked
) -> ClientLink:
    return _Mute(client) if connection is None else _ConnectionLink(client, connection, audit, ttl, asked)


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
    why: str = ""  # why it went unanswered, when it did


@dataclass
class _Ended:
    result: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        """The call's result, or its failure raised."""
        if self.error is not None:
            raise self.error
        return self.result


_Event = _Question | _Ended


@dataclass
class _Suspended:
    binding: tuple[str, str, str]
    events: MemoryObjectReceiveStream[_Event]
    run: anyio.CancelScope
    questions: list[_Question] = field(default_factory=list)
    expires: float = math.inf


@dataclass
class _SuspendingLink:
    """A 2026-07-28 client: each question suspends its call until the client's retry answers it."""

    client: object
    capabilities: types.ClientCapabilities | None
    events: MemoryObjectSendStream[_Event]
    ttl: float
    audit: Audit
    keys: set[str] = field(default_factory=set)

    async def relay(self, server: str, method: str, params: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
        await self.audit(server, method)
        # The backend's own key where it gave one and it is still free in this call; never the
        # proxy's approval key, which only the gate's tickets answer.
        if key is None or key in self.keys or key.startswith("mcp-spec-proxy/"):
            key = f"{RELAY_KEY_PREFIX}{server}/{len(self.keys) + 1}"
        self.keys.add(key)
        question = _Question(key, server_request(method, params), time.monotonic() + self.ttl)
        try:
            await self.events.send(question)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            raise MCPError(REQUEST_TIMEOUT, f"the client is no longer waiting to answer {method}") from None
        with anyio.move_on_after(max(0.0, question.deadline - time.monotonic())):
            await question.answered.wait()
        if question.answer is None:
            if question.why:
                raise MCPError(REQUEST_TIMEOUT, f"the client did not answer {method}: {question.why}")
            raise unanswered(method, self.ttl)
        return question.answer


Run = Callable[[], Awaitable[Any]]


def call_binding(unnamed: bool, session: str, what: str, arguments: Any) -> tuple[str, str, str]:
    """What a `request_state` is bound to: the session (none for a 2026-07-28 request that names
    none: it is a session of its own), the request, and a digest of its arguments."""
    return ("" if unnamed else session, what, digest(arguments))


def answering(target: tuple[str, str] | None, answers: dict[str, Any] | None, run: Run) -> Run:
    """`run`, with the answers a fresh call carried (`inputResponses`, and no request_state of the
    proxy's) going with it to the backend tool it names (`target`: server, tool), as they would
    directly (`CLIENT_ANSWERS`). Answers under the proxy's own keys (an approval) never go."""
    kept = {key: value for key, value in (answers or {}).items() if not key.startswith(PROXY_KEY_PREFIX)}
    if not kept or target is None:
        return run

    async def answered() -> Any:
        token = CLIENT_ANSWERS.set((*target, kept))
        try:
            return await run()
        finally:
            CLIENT_ANSWERS.reset(token)

    return answered


class Suspensions:
    """Calls of 2026-07-28 clients that wait for their client's answers; see the module docstring."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._key = secrets.token_bytes(32)
        self._waiting: dict[str, _Suspended] = {}
        self._tasks = Host()
        self.hosting = self._tasks.hosting  # while the front serves: suspended calls run there, and end with it

    def owns(self, state: str | None) -> bool:
        return bool(state) and str(state).startswith(STATE_PREFIX)

    async def call(
        self,
        client: object,
        capabilities: types.ClientCapabilities | None,
        binding: tuple[str, str, str],
        run: Run,
        audit: Audit,
    ) -> Any:
        """`run()`'s result, or `input_required` with the questions it asks the client first.
        Without a host (a front that is not serving) the call runs here, and its client is mute.
        Cancelled while it waits (the client cancelled, or left), the call is cancelled too."""
        host = self._tasks.group
        if host is None or not declares_any(capabilities):
            token = CALLER.set(mute_link(client))
            try:
                return await run()
            finally:
                CALLER.reset(token)
        send, receive = anyio.create_memory_object_stream[_Event](math.inf)
        link = _SuspendingLink(client, capabilities, send, self._ttl, audit)
        waiting = _Suspended(binding, receive, anyio.CancelScope())
        host.start_soon(self._run, link, run, send, waiting.run)
        return await self._next(waiting)

    async def resume(self, state: str | None, binding: tuple[str, str, str], responses: dict[str, Any] | None) -> Any:
        """The suspended call `state` names, given the client's answers: its next outcome. A state
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
        for question in waiting.questions:
            answer = (responses or {}).get(question.key)
            if answer is not None:
                question.answer = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
            else:
                question.why = f"its retry carried no answer under {question.key!r}"
            question.answered.set()
        waiting.questions = []
        return await self._next(waiting)

    async def _run(
        self, link: _SuspendingLink, run: Run, send: MemoryObjectSendStream[_Event], scope: anyio.CancelScope
    ) -> None:
        token = CALLER.set(link)
        outcome: _Ended | None = None
        try:
            with scope:
                outcome = _Ended(result=await run())
        except Exception as exc:  # boundary: the call's own failure is its outcome, for the client to get
            outcome = _Ended(error=exc)
        finally:
            CALLER.reset(token)
        with send, suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            if outcome is not None:  # None: cancelled, because its client cancelled or left
                await send.send(outcome)

    async def _next(self, waiting: _Suspended) -> Any:
        try:
            return await self._outcome(waiting)
        except anyio.get_cancelled_exc_class():
            waiting.run.cancel()  # the client cancelled its request (or left): the call goes with it
            waiting.events.close()
            raise

    async def _outcome(self, waiting: _Suspended) -> Any:
        event = await waiting.events.receive()
        if isinstance(event, _Ended):
            waiting.events.close()
            return event.outcome()
        # Questions asked together (a backend's round of several) go to the client together.
        questions = [event]
        for _ in range(BATCH_CHECKPOINTS):
            await anyio.lowlevel.checkpoint()
            while True:
                try:
                    more = waiting.events.receive_nowait()
                except anyio.WouldBlock:
                    break
                if isinstance(more, _Ended):  # the call ended meanwhile (its backend went away): no one to ask
                    waiting.questions = questions
                    _give_up(waiting, "the call ended")
                    return more.outcome()
                questions.append(more)
        waiting.questions = questions
        waiting.expires = min(question.deadline for question in questions)
        self._forget_expired()
        self._make_room(waiting.binding[0])
        nonce = secrets.token_hex(16)
        self._waiting[nonce] = waiting
        return types.InputRequiredResult(
            input_requests={question.key: question.request for question in questions},
            request_state=f"{STATE_PREFIX}{nonce}.{self._mac(nonce, waiting.binding)}",
        )

    def _make_room(self, session: str) -> None:
        """A client that never answers cannot grow this without bound, nor crowd out another's."""
        mine = [nonce for nonce, waiting in self._waiting.items() if waiting.binding[0] == session]
        for nonce in mine[: max(0, len(mine) - MAX_WAITING_PER_SESSION + 1)]:
            _give_up(
                self._waiting.pop(nonce), f"more than {MAX_WAITING_PER_SESSION} of this session's questions waited"
            )
        while len(self._waiting) >= MAX_WAITING:
            _give_up(self._waiting.pop(next(iter(self._waiting))), f"more than {MAX_WAITING} questions waited")

    def _forget_expired(self) -> None:
        now = time.monotonic()
        for nonce in [nonce for nonce, waiting in self._waiting.items() if waiting.expires <= now]:
            _give_up(self._waiting.pop(nonce), "")

    def _mac(self, nonce: str, binding: tuple[str, str, str]) -> str:
        message = "\0".join((nonce, *binding)).encode("utf-8", "surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def _give_up(waiting: _Suspended, why: str) -> None:
    """Its questions go unanswered (the backend hears so at once) and its outcome unheard."""
    waiting.events.close()
    for question in waiting.questions:
        question.why = why
        question.answered.set()


__all__ = [
    "MAX_WAITING",
    "MAX_WAITING_PER_SESSION",
    "RELAY_KEY_PREFIX",
    "STATE_PREFIX",
    "Asked",
    "Passthrough",
    "Suspensions",
    "connection_link",
    "declares_any",
    "mute_link",
    "request_link",
    "server_request",
    "unanswered",
]
