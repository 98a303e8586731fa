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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal, Protocol, TypeVar

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

    def supports(self, kind: Kind) -> bool:
        """Whether the client declared the capability `kind` needs."""

    async def relay(self, server: str, method: str, params: dict[str, Any] | None) -> dict[str, Any]:
        """Ask the client; its result as wire JSON. Raises MCPError with the client's own error."""


CALLER: contextvars.ContextVar[ClientLink | None] = contextvars.ContextVar("mcp_spec_proxy.caller", default=None)
"""The link of the call the current task serves; set by the front for the whole call."""


class Relay:
    """One backend's relay: its calls in flight, and the SDK client's callbacks."""

    def __init__(self, server: str, enabled: frozenset[Kind]) -> None:
        self._server = server
        self._enabled = enabled
        self._in_flight: dict[int, ClientLink] = {}
        self._count = 0

    @contextmanager
    def calling(self) -> Iterator[None]:
        """Around a forwarded call: its client may be asked things until it returns."""
        link = CALLER.get()
        if link is None:
            yield
            return
        self._count += 1
        key = self._count
        self._in_flight[key] = link
        try:
            yield
        finally:
            del self._in_flight[key]

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
        answer = await self._ask("sampling", _dump(params))
        if isinstance(answer, types.ErrorData):
            return answer
        if params.tools:
            return _parsed(types.CreateMessageResultWithTools, answer)
        return _parsed(types.CreateMessageResult, answer)

    async def _elicitation(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        answer = await self._ask("elicitation", _dump(params))
        return answer if isinstance(answer, types.ErrorData) else _parsed(types.ElicitResult, answer)

    async def _roots(self, context: ClientRequestContext) -> types.ListRootsResult | types.ErrorData:
        answer = await self._ask("roots", None)
        return answer if isinstance(answer, types.ErrorData) else _parsed(types.ListRootsResult, answer)

    async def _ask(self, kind: Kind, params: dict[str, Any] | None) -> dict[str, Any] | types.ErrorData:
        method = METHODS[kind]
        link = self._link()
        if link is None:
            clients = {id(link.client) for link in self._in_flight.values()}
            why = (
                "several clients have calls in flight on it" if len(clients) > 1 else "no call of a client is in flight"
            )
            logger.warning("backend %r sent %s, which was not relayed: %s", self._server, method, why)
            return types.ErrorData(
                code=INVALID_REQUEST,
                message=f"mcp-spec-proxy cannot tell which client this {method} is for: {why}",
            )
        if not link.supports(kind):
            return types.ErrorData(code=METHOD_NOT_FOUND, message=f"the client does not support {method}")
        try:
            return await link.relay(self._server, method, params)
        except MCPError as exc:
            return exc.error

    def _link(self) -> ClientLink | None:
        """The calling task's link, else the one client with calls in flight on this backend."""
        link = CALLER.get()
        if link is not None:
            return link
        links = list(self._in_flight.values())
        if not links or any(other.client is not links[0].client for other in links[1:]):
            return None
        return links[0]


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


__all__ = ["CALLER", "METHODS", "ClientLink", "Kind", "Relay"]
