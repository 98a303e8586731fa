"""How a held call reaches the person behind its client: approval tickets and the user channel.

On the handshake era a reviewer asks the user by elicitation on the call's own request. On the
2026-07-28 era it returns `input_required`, and each carries a fresh approval ticket as its
`request_state`: single-use, bound (by HMAC) to the session, the tool and its arguments, and
expiring with `review.timeout`; a replayed or forged ticket counts for nothing and the user is
asked again. What the reviewers decided before asking rides with the ticket (`Ticket.memo`), so
a retry does not ask the model twice.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import NoBackChannelError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.fronts.wire import wire_error
from mcp_spec_proxy.review import InputNeeded
from mcp_spec_proxy.store import ApprovalStore, Ticket

logger = logging.getLogger(__name__)

APPROVAL_KEY = "mcp-spec-proxy/approval"

Ctx = ServerRequestContext[Any, Any]


class Approvals:
    """Approval tickets of the 2026-07-28 era: issued with `input_required`, taken once by the retry.

    The `request_state` a client holds is `<nonce>.<hmac>`; the HMAC covers the nonce and the
    binding, so a ticket cannot be moved to another session, tool or argument set, and the nonce
    is forgotten the first time it is used (or when it expires), so it cannot be used twice. The
    tickets and the key live in the store: in memory, or shared by every replica, where a ticket
    taken on one is gone for all.
    """

    def __init__(self, ttl: float, tickets: ApprovalStore) -> None:
        self._ttl = ttl
        self._tickets = tickets

    async def issue(self, binding: tuple[str, str, str], need: InputNeeded) -> str:
        """A fresh ticket's `request_state`; a store that cannot keep it is a wire error (nothing ran)."""
        nonce = secrets.token_hex(16)
        ticket = Ticket(binding, time.time() + self._ttl, question(need.message), dict(need.memo))
        try:
            await self._tickets.put(nonce, ticket)
            return f"{nonce}.{await self._mac(nonce, binding)}"
        except StateError as exc:
            raise wire_error(exc) from exc

    async def take(self, state: str | None, binding: tuple[str, str, str]) -> Ticket | None:
        """The ticket `state` names, once, if it is genuine, unexpired and bound to `binding`;
        None too when the store cannot be asked (the user is then asked again)."""
        nonce, _, mac = (state or "").partition(".")
        try:
            if not hmac.compare_digest(mac, await self._mac(nonce, binding)):
                return None
            ticket = await self._tickets.take(nonce)
        except StateError as exc:
            logger.warning("approval ticket not checked: %s", exc)
            return None
        return ticket if ticket is not None and ticket.binding == binding else None

    async def _mac(self, nonce: str, binding: tuple[str, str, str]) -> str:
        message = "\0".join((nonce, *binding)).encode("utf-8", "surrogatepass")
        return hmac.new(await self._tickets.key(), message, hashlib.sha256).hexdigest()


class UserChannel:
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
            answer = (self._params.input_responses or {}).get(APPROVAL_KEY)
            # An answer counts only with a genuine, unused ticket of this very call, and only for
            # the question it answered: a retry that would ask something else (another substitute,
            # other arguments) asks again.
            ticket = self._ticket
            if isinstance(answer, types.ElicitResult) and ticket is not None and ticket.question == question(message):
                self._ticket = None  # one answer, one decision
                return answer.model_dump(mode="json", exclude_none=True)
            raise InputNeeded(APPROVAL_KEY, message, schema)
        try:
            result = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        except NoBackChannelError:
            return None
        return result.model_dump(mode="json", exclude_none=True)


def approval_of(state: str | None) -> str:
    """The ticket a `request_state` names (its nonce), as the drain counts approvals out with clients."""
    return (state or "").partition(".")[0]


def question(message: str) -> str:
    return hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()


__all__ = ["APPROVAL_KEY", "Approvals", "UserChannel", "approval_of", "question"]
