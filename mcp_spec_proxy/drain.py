"""The replica's shutdown as the gate sees it: which calls are in flight, and the drain.

On SIGTERM the command begins a drain (`Drain.run`): from then on the gate takes no new call
(`admit` raises `ShuttingDown`, a refusal that says nothing ran), while the calls already in flight
— held for a verdict, or being forwarded — go on. When the last one settles the replica stops;
when the grace (`drain_s`) runs out first, every call still held is stopped where it waits
(`holding`: its scope is cancelled, and the gate records it `abandoned` with the true reason, "the
replica shut down"), and the calls being forwarded are cut with the rest of the process a moment
later (`SETTLE_S`), recorded `forward-interrupted`. A held call is never forwarded after its drain
expired: its verdict is the only way to the backend, and its wait is what was cancelled. Once the
drain is over, or cut short by a second signal (`stopping`), a call cancelled with the process is
recorded as the replica's doing too, never as its client's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import anyio

from mcp_spec_proxy.errors import ShuttingDown

logger = logging.getLogger(__name__)

SHUT_DOWN = "the replica shut down"
"""The reason on the audit trail of a call the drain stopped (as `abandoned`'s reason says)."""
SETTLE_S = 2.0
"""After the grace: how long the calls the drain stopped have to record it and answer their clients."""

_ADMITTED: ContextVar[bool] = ContextVar("mcp_spec_proxy_admitted", default=False)
"""Set inside an admitted call: the calls it makes (a gateway turn's or `delegate`'s steps, in
its tasks too) are part of the work in flight, not new calls, and a drain lets them through."""


class Drain:
    """The calls in flight at the gate, and whether the replica is draining."""

    def __init__(self) -> None:
        self.draining = False
        self.expired = False  # the grace ran out: what is still held is being stopped
        self.stopping = False  # the drain is over (or cut short): what is cancelled now, the replica stopped
        self._calls = 0
        self._idle = anyio.Event()
        self._held: set[anyio.CancelScope] = set()

    @property
    def in_flight(self) -> int:
        return self._calls

    @property
    def held(self) -> int:
        return len(self._held)

    @contextmanager
    def call(self, what: str) -> Iterator[None]:
        """One call (at the gate, or a gateway turn, or `delegate`) from its admission to its settling;
        refused once draining, unless it is made by one admitted before."""
        if self.draining and not _ADMITTED.get():
            raise ShuttingDown(
                f"{what} was not forwarded: this replica is shutting down and takes no new calls — send it"
                " again (a load balancer routes it to another replica)"
            )
        self._calls += 1
        admitted = _ADMITTED.set(True)
        try:
            yield
        finally:
            _ADMITTED.reset(admitted)
            self._calls -= 1
            if self._calls == 0:
                self._idle.set()

    @contextmanager
    def holding(self) -> Iterator[anyio.CancelScope]:
        """The wait for a verdict: cancelled (`scope.cancelled_caught`) when the drain expires."""
        with anyio.CancelScope() as scope:
            self._held.add(scope)
            try:
                if self.expired:
                    scope.cancel()
                yield scope
            finally:
                self._held.discard(scope)

    async def run(self, grace_s: float) -> None:
        """Drain: take no new call, wait up to `grace_s` for those in flight, then stop the held ones."""
        self.draining = True
        try:
            await self._drain(grace_s)
        finally:
            self.stopping = True  # returned or cut short (a second signal): the process stops next

    async def _drain(self, grace_s: float) -> None:
        if self._calls == 0:
            return
        logger.warning("draining: %d call(s) in flight, %d held; waiting up to %gs", self._calls, self.held, grace_s)
        with anyio.move_on_after(grace_s):
            await self._idle_now()
            logger.info("drained: every call in flight settled")
            return
        self.expired = True
        logger.warning("the drain's %gs ran out: %d held call(s) are abandoned (%s)", grace_s, self.held, SHUT_DOWN)
        for scope in list(self._held):
            scope.cancel()
        with anyio.move_on_after(SETTLE_S):
            await self._idle_now()

    async def _idle_now(self) -> None:
        while self._calls:
            self._idle = anyio.Event()
            await self._idle.wait()
