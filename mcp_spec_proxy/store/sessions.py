"""What a session keeps between requests, and the approvals waiting for a retry: the seams and
their in-process versions.

`SessionStore` is every change the barrier makes to a session's `History` (a read recorded, a
write held, released or settled), so a store shared by several replicas can apply each change
where every replica sees it; `LocalSessions` applies them to the `History` in memory, as one
process always has. `ApprovalStore` keeps the `input_required` tickets until their retry takes
them, once; `LocalApprovals` keeps them in memory.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcp_spec_proxy.trajectory import History, Segment, Step

MAX_PENDING_APPROVALS = 4096


class SessionStore(Protocol):
    async def read(self, session: str, history: History, step: Step) -> None:
        """A read ran: it joins the open segment."""

    async def hold(self, session: str, history: History, held: Step) -> Segment:
        """A write is held: the open segment and the held call, as the reviewer sees them (for a
        shared store, with what every replica recorded for `session` up to now)."""

    async def release(self, session: str, history: History, segment: Segment) -> None:
        """The held call went nowhere (abandoned, or waiting for the user): its reads stay open."""

    async def settle(
        self, session: str, history: History, segment: Segment, accepted_steps: int, executed: Step | None = None
    ) -> None:
        """Commit the accepted prefix, drop the rest, then append `executed` (`History.settle`)."""


class LocalSessions:
    """The sessions of one process: the `History` in memory is the whole truth."""

    async def read(self, session: str, history: History, step: Step) -> None:
        history.record_read(step)

    async def hold(self, session: str, history: History, held: Step) -> Segment:
        return history.segment(held)

    async def release(self, session: str, history: History, segment: Segment) -> None:
        history.release(segment)

    async def settle(
        self, session: str, history: History, segment: Segment, accepted_steps: int, executed: Step | None = None
    ) -> None:
        history.settle(segment, accepted_steps, executed)


@dataclass
class Ticket:
    """One `input_required` approval waiting for its retry."""

    binding: tuple[str, str, str]  # session, tool, arguments digest
    expires: float  # time.time(): replicas on several machines compare it
    question: str  # digest of what the user was shown: the answer settles that question only
    memo: dict[str, Any] = field(default_factory=dict)


class ApprovalStore(Protocol):
    async def key(self) -> bytes:
        """The secret that signs tickets: the same on every replica that may take them."""

    async def put(self, nonce: str, ticket: Ticket) -> None: ...

    async def take(self, nonce: str) -> Ticket | None:
        """The unexpired ticket of `nonce`, removed as it is returned: no second taker gets it."""


class LocalApprovals:
    """Tickets of one process, in memory; the least recent goes first past `MAX_PENDING_APPROVALS`."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)
        self._pending: OrderedDict[str, Ticket] = OrderedDict()

    async def key(self) -> bytes:
        return self._key

    async def put(self, nonce: str, ticket: Ticket) -> None:
        self._expire()
        self._pending[nonce] = ticket
        while len(self._pending) > MAX_PENDING_APPROVALS:
            self._pending.popitem(last=False)

    async def take(self, nonce: str) -> Ticket | None:
        self._expire()
        return self._pending.pop(nonce, None)

    def _expire(self) -> None:
        now = time.time()
        while self._pending:
            nonce, ticket = next(iter(self._pending.items()))
            if ticket.expires > now:
                break
            del self._pending[nonce]
