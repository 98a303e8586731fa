"""A backend's requests to the client (sampling, elicitation, roots), relayed to the client whose
call caused them.

A backend asks the client something only inside one of its calls, and the proxy must find that
call's client. In the 2026-07-28 era the question comes back as the call's `input_required`
result, which the SDK client's driver answers in the calling task: the front's `ClientLink` is
in `CALLER` there. In the handshake era it is a request on the connection that names no call:
the callback runs in the connection's own task, so the backend keeps the links of its calls in
flight, and the question goes to the one client among them. With no call in flight, or calls of
two clients at once (an HTTP front with several sessions on one handshake-era backend), nobody
can be told which client asked, and the backend is answered with an error that says so rather
than a guess: a sampling request spends a user's model, an elicitation asks a person, and a
wrong guess would show one client's backend traffic to another.

A relayed request never reaches the gate or a reviewer's model: its answer goes back to the
backend and nowhere else, so an elicitation answered by a person approves nothing the gate holds.
Each relay kind can be switched off per server (`relay:` in servers.yaml); the SDK then declares
no such capability to that backend, as a client without it would.
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import anyio
import mcp_types as types
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND
from pydantic import BaseModel, ValidationError

logger = logging.getLogger(__name__)

Kind = Literal["sampling", "elicitation", "roots"]
R = TypeVar("R", bound=BaseModel)
METHODS: dict[Kind, str] = {
    "sampling": "sampling/createMessage",
    "elicitation": "elicitation/create",
    "roots": "roots/list",
}


class ClientLink(Protocol):
    """The front's channel to the client of one call."""

    @property
    def client(self) -> object:
        """Who the client is: links of one client compare equal here (its session)."""

    @property
    def capabilities(self) -> types.ClientCapabilities | None:
        """What the client declared it can be asked."""

    async def relay(self, server: str, method: str, params: dict[str, Any] | None, key: str | None) -> dict[str, Any]:
        """Ask the client; its result as wire JSON. Raises MCPError with the client's own error, or
        the proxy's when the client did not answer in time. `key` is the backend's own name for
        the question, where it gave one (a 2026-07-28 `input_required` round)."""


CALLER: contextvars.ContextVar[ClientLink | None] = contextvars.ContextVar("mcp_spec_proxy.caller", default=None)
"""The link of the call the current task serves; set by the front for the whole call."""

CLIENT_ANSWERS: contextvars.ContextVar[tuple[str, str, dict[str, Any]] | None] = contextvars.ContextVar(
    "mcp_spec_proxy.client_answers", default=None
)
"""The `inputResponses` a 2026-07-28 client sent with a fresh call (no request_state of the
proxy's), none of them addressed to the proxy, with the server and tool they were sent to: they go
with that tool's first forward to that server, as they would directly, and with nothing else."""


def admits(capabilities: types.ClientCapabilities | None, kind: Kind, params: dict[str, Any] | None = None) -> bool:
    """Whether a client that declared `capabilities` can be asked this (`params`: the request's)."""
    if capabilities is None:
        return False
    if kind == "sampling":
        sampling = capabilities.sampling
        return sampling is not None and (not (params or {}).get("tools") or sampling.tools is not None)
    if kind == "elicitation":
        elicitation = capabilities.elicitation
        if elicitation is None:
            return False
        if (params or {}).get("mode") == "url":
            return elicitation.url is not None
        return elicitation.form is not None or elicitation.url is None  # `{}` is form mode, as the spec says
    return capabilities.roots is not None


def as_declared(stamped: dict[str, Any]) -> dict[str, Any]:
    """The capabilities a 2026-07-28 request declares to a backend: what the proxy can relay
    (`stamped`, the SDK client's) narrowed to what the calling client declared, so a backend runs
    what it would run for that client directly. No client asking (a listing, the proxy's own
    agent): none of them, since no one could answer."""
    link = CALLER.get()
    declared = link.capabilities if link is not None else None
    theirs = declared.model_dump(by_alias=True, mode="json", exclude_none=True) if declared is not None else {}
    narrowed = {key: value for key, value in stamped.items() if key not in METHODS}
    for kind in METHODS:
        if kind in stamped and kind in theirs:
            narrowed[kind] = theirs[kind]
    return narrowed


@dataclass(eq=False)
class _InFlight:
    """One forwarded call: whose it is (None: the proxy's own, no client waits on it), and the
    clock the backend answers on, stopped while its client is being asked."""

    link: ClientLink | None
    clock: anyio.CancelScope | None
    asking: int = 0
    left: float = 0.0

    def pause(self) -> None:
        if self.asking == 0 and self.clock is not None:
            self.left = max(0.0, self.clock.deadline - anyio.current_time())
            self.clock.deadline = math.inf
        self.asking += 1

    def resume(self) -> None:
        self.asking -= 1
        if self.asking == 0 and self.clock is not None:
            self.clock.deadline = anyio.current_time() + self.left


_CURRENT: contextvars.ContextVar[_InFlight | None] = contextvars.ContextVar("mcp_spec_proxy.in_flight", default=None)


class Relay:
    """One backend's relay: its calls in flight, and the SDK client's callbacks."""

    def __init__(self, server: str, enabled: frozenset[Kind], fallback: ClientLink | None = None) -> None:
        self._server = server
        self._enabled = enabled
        self._in_flight: list[_InFlight] = []
        self._when_idle: list[Callable[[], None]] = []
        # The one client a client session's own backend session serves: asked what the backend asks
        # outside any call (its roots after the handshake or a roots/list_changed).
        self.fallback = fallback

    @contextmanager
    def calling(self, clock: anyio.CancelScope | None = None) -> Iterator[None]:
        """Around every request forwarded to this backend: its client may be asked things until it
        returns, and the time the client takes to answer is not counted on `clock`. A request no
        client waits on (a completion, a subscription, the engine's calls) is in flight too, so
        that a question it causes is never taken for another client's."""
        entry = _InFlight(CALLER.get(), clock)
        self._in_flight.append(entry)
        token = _CURRENT.set(entry)
        try:
            yield
        finally:
            _CURRENT.reset(token)
            self._in_flight.remove(entry)
            if not self._in_flight and self._when_idle:
                due, self._when_idle = self._when_idle, []
                for callback in due:
                    callback()

    def when_idle(self, callback: Callable[[], None]) -> None:
        """`callback()` once, when the last request in flight ends: those in flight now, else the next."""
        self._when_idle.append(callback)

    @property
    def busy(self) -> bool:
        """Whether a request is in flight on the session this relay serves."""
        return bool(self._in_flight)

    @property
    def kinds(self) -> frozenset[Kind]:
        """What this relay asks clients (and so declares to its backend)."""
        return self._enabled

    def callbacks(self) -> dict[str, Any]:
        """The SDK `Client` keyword arguments for the enabled kinds."""
        kwargs: dict[str, Any] = {}
        if "sampling" in self._enabled:
            kwargs["sampling_callback"] = self._sampling
            kwargs["sampling_capabilities"] = types.SamplingCapability(tools=types.SamplingToolsCapability())
        if "elicitation" in self._enabled:
            kwargs["elicitation_callback"] = self._elicitation
        if "roots" in self._enabled:
            kwargs["list_roots_callback"] = self._roots
        return kwargs

    async def _sampling(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        answer = await self._ask("sampling", _dump(params), context)
        if isinstance(answer, types.ErrorData):
            return answer
        if params.tools:
            return _parsed(types.CreateMessageResultWithTools, answer)
        return _parsed(types.CreateMessageResult, answer)

    async def _elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        answer = await self._ask("elicitation", _dump(params), context)
        return answer if isinstance(answer, types.ErrorData) else _parsed(types.ElicitResult, answer)

    async def _roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        answer = await self._ask("roots", None, context)
        return answer if isinstance(answer, types.ErrorData) else _parsed(types.ListRootsResult, answer)

    async def _ask(
        self, kind: Kind, params: dict[str, Any] | None, context: ClientRequestContext
    ) -> dict[str, Any] | types.ErrorData:
        method = METHODS[kind]
        calls, why = self._calls()
        link = calls[0].link if calls else None
        if link is None and not self._in_flight:
            link = self.fallback
        if link is None:
            # A server that asks for roots as it connects (the filesystem server does) keeps the ones it was
            # started with when the answer is an error: that is routine, not a warning.
            level = logging.DEBUG if kind == "roots" else logging.WARNING
            logger.log(level, "backend %r sent %s, which was not relayed: %s", self._server, method, why)
            return types.ErrorData(
                code=INVALID_REQUEST, message=f"mcp-spec-proxy cannot tell which client this {method} is for: {why}"
            )
        if not admits(link.capabilities, kind, params):
            return types.ErrorData(code=METHOD_NOT_FOUND, message=f"the client does not support {method}")
        key = context.request_id if isinstance(context.request_id, str) else None
        for call in calls:
            call.pause()
        try:
            return await link.relay(self._server, method, params, key)
        except MCPError as exc:
            return exc.error
        finally:
            for call in calls:
                call.resume()

    def _calls(self) -> tuple[list[_InFlight], str]:
        """The call(s) a question belongs to — the calling task's own (a 2026-07-28 backend's round),
        else every call in flight when they are all one client's — or none, and why."""
        current = _CURRENT.get()
        calls = [current] if current is not None and current in self._in_flight else list(self._in_flight)
        if not calls:
            return [], "no call of a client is in flight"
        clients = {id(call.link.client) if call.link is not None else None for call in calls}
        if None in clients:
            return [], "it came during a request the proxy made itself, which no client waits on"
        if len(clients) > 1:
            return [], "several clients have calls in flight on it"
        return calls, ""


def _dump(params: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _parsed(model: type[R], answer: dict[str, Any]) -> R | types.ErrorData:
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        return types.ErrorData(
            code=INVALID_PARAMS,
            message=f"the client's answer is not a valid result: {where}: {first.get('msg')}",
        )


__all__ = ["CALLER", "METHODS", "ClientLink", "Kind", "Relay", "admits"]
