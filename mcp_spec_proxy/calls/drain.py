"""The replica's shutdown as the gate sees it: which calls are in flight, and the drain.

On SIGTERM the command begins a drain (`Drain.run`): from then on the gate takes no new call
(`admit` raises `ShuttingDown`, a refusal that says nothing ran), while the calls already in flight
— held for a verdict, or being forwarded — go on. When the last one settles the replica stops;
when the grace (`drain_s`) runs out first, every call still held is stopped where it waits
(`holding`: its scope is cancelled, and the gate records it `abandoned` with the true reason, "the
replica shut down"), and the calls being forwarded are cut with the rest of the process a moment
later (`SETTLE_S`), recorded `forward-interrupted`. A held call is never forwarded after its drain
expired: its verdict is the only way to the backend, and its wait is what was cancelled. A second
signal cuts the drain short (`cut`): the grace ends at once, so the held calls are stopped as when
it runs out — `abandoned`, their clients told the replica shut down, while the store still takes
their lines — and the calls being forwarded have `SETTLE_S`. Once the drain is over (`stopping`), a
call cancelled with the process is recorded as the replica's doing too, never as its client's
(`ending`).

A call is counted once, where it enters (the front's `Barrier.call`, a gateway request, `delegate`):
the gate calls it makes, and its substitutes, are part of it, so a write queued behind another of
its session is in flight, not new. Work that continues a call admitted before the drain is let in
and counted (`continuing`): a gateway turn between its requests, and a retry carrying an approval.
After the calls, the command waits (bounded) for their answers to reach their clients, and for the
front to be quiet a moment (`Answering.quiet`): a client's next request after its answer — the `mcp`
SDK's `tools/list` to check a result — is answered from the catalog, never refused as a call.

An approval out with its client (a 2026-07-28 `input_required`: the call has returned, and its
client is asking its person) is waited for too (`awaiting`): the retry that carries the answer is
that call going on, so the drain waits — within its grace, and no longer than the approval's own
expiry — for it to come back and run (`back`), and for its result to reach the client, rather than
stopping under a retry that may already be running.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import anyio

from mcp_spec_proxy.errors import ShuttingDown

logger = logging.getLogger(__name__)

SHUT_DOWN = "the replica shut down"
"""The reason on the audit trail of a call the drain stopped (as `abandoned`'s reason says)."""
SHUTTING_DOWN_REASON = "the replica is shutting down"
"""The reason on the audit trail of a new call the drain refused (`refused`): nothing ran."""
SETTLE_S = 2.0
"""After the grace: how long the calls the drain stopped have to record it and answer their clients."""
QUIET_S = 1.0
"""After the answers: how long the front must have had no request before it stops, so that a client's
next request after its answer (the `mcp` SDK lists the tools to check a result) is still answered."""

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
        self._cut = False  # a second signal: the grace is over now
        self._idle = anyio.Event()
        self._held: set[anyio.CancelScope] = set()
        self._out: dict[str, float] = {}  # approvals out with their clients: when each expires (monotonic)
        # The calls in flight that wait for their client to come back (the gateway's tool calls handed out),
        # as the front that handed them out names them: a drain says what it waits for.
        self.results_awaited: Callable[[], list[str]] = list

    @property
    def in_flight(self) -> int:
        return self._calls

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def ending(self) -> bool:
        """What is cancelled now is cancelled by the replica stopping (the grace ran out, or the drain is over)."""
        return self.expired or self.stopping

    def admit(self, what: str) -> None:
        """Refuse a new call once draining (`ShuttingDown`), unless it is made by one admitted before."""
        if self.draining and not _ADMITTED.get():
            raise ShuttingDown(
                f"{what} was not forwarded: this replica is shutting down and takes no new calls — send it"
                " again (a load balancer routes it to another replica)"
            )

    @contextmanager
    def call(self, what: str) -> Iterator[None]:
        """One call (at the front, at the gate, a gateway request, `delegate`) from its admission to its
        settling; refused once draining. One made inside an admitted call is part of it: let through,
        and not counted again."""
        if _ADMITTED.get():
            yield
            return
        self.admit(what)
        with self.continuing():
            yield

    @contextmanager
    def continuing(self) -> Iterator[None]:
        """Work that goes on with a call admitted before (a gateway turn, which outlives the request
        that started it; a retry carrying the approval a person gave): never refused, counted in
        flight until it ends, and what it calls is admitted with it."""
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

    def awaiting(self, approval: str, ttl: float) -> None:
        """An approval is out with its client (`input_required`), valid for `ttl` seconds: a drain
        waits for the retry that brings it back."""
        self._out[approval] = time.monotonic() + ttl

    def back(self, approval: str) -> None:
        """The retry carrying `approval` came back (its call is counted in flight from now on)."""
        if self._out.pop(approval, None) is not None:
            self._idle.set()

    @property
    def out_with_clients(self) -> int:
        """The approvals out with their clients that have not expired."""
        now = time.monotonic()
        for approval in [approval for approval, until in self._out.items() if until <= now]:
            del self._out[approval]
        return len(self._out)

    def cut(self) -> None:
        """End the grace now (a second signal): the held calls are stopped, as when it runs out."""
        self._cut = True
        self._idle.set()

    async def run(self, grace_s: float, *, approvals: bool = False) -> None:
        """Drain: take no new call, wait up to `grace_s` for those in flight (with `approvals`, as the
        serving commands drain, for the approvals out with their clients too), then stop the held ones."""
        self.draining = True
        try:
            await self._drain(grace_s, approvals)
        finally:
            self.stopping = True  # returned or cut short (a second signal): the process stops next

    async def _drain(self, grace_s: float, approvals: bool) -> None:
        if self._calls == 0 and not (approvals and self.out_with_clients):
            return
        out = f", {self.out_with_clients} approval(s) out with their clients" if approvals and self._out else ""
        awaited = self.results_awaited()
        waits = (
            f", {len(awaited)} waiting for the client to send back a tool result the gateway handed out"
            f" ({', '.join(awaited)}); waiting up to {grace_s:g}s for them, then they are abandoned"
            if awaited
            else f"; waiting up to {grace_s:g}s"
        )
        logger.warning("draining: %d call(s) in flight, %d held%s%s", self._calls, self.held, out, waits)
        with anyio.move_on_after(grace_s):
            await self._idle_now(until_cut=True, approvals=approvals)
        if not self._calls:
            if approvals and self.out_with_clients and not self._cut:
                logger.warning(
                    "the drain's %gs ran out with %d approval(s) still out with their clients: they lapse, unrun",
                    grace_s,
                    self.out_with_clients,
                )
            else:
                logger.info("drained: every call in flight settled")
            return
        self.expired = True
        why = "a second signal ends the drain" if self._cut else f"the drain's {grace_s:g}s ran out"
        logger.warning("%s: %d held call(s) are abandoned (%s)", why, self.held, SHUT_DOWN)
        for scope in list(self._held):
            scope.cancel()
        with anyio.move_on_after(SETTLE_S):
            await self._idle_now()

    async def _idle_now(self, *, until_cut: bool = False, approvals: bool = False) -> None:
        """Until no call is in flight (and, with `approvals`, no approval is out with its client),
        or a second signal cuts it short (`until_cut`)."""
        while (self._calls or (approvals and self.out_with_clients)) and not (until_cut and self._cut):
            self._idle = anyio.Event()
            expires = min(self._out.values(), default=math.inf) if approvals else math.inf
            with anyio.move_on_after(expires - time.monotonic()):  # an approval that expires ends its wait
                await self._idle.wait()


class Answering:
    """The requests a front is answering now: after the drain, the command waits (bounded) until
    the answers of the calls it let finish are written to their clients, and then (`quiet`) until
    the front has had no request for a moment, then stops the fronts."""

    def __init__(self) -> None:
        self._open: set[object] = set()
        self._quiet = anyio.Event()
        self._last = -math.inf  # when a request last began or ended (anyio's clock)

    def begin(self, request: object) -> None:
        self._open.add(request)
        self._last = anyio.current_time()

    def end(self, request: object) -> None:
        self._open.discard(request)
        self._last = anyio.current_time()
        if not self._open:
            self._quiet.set()

    async def quiet(self, quiet_s: float = QUIET_S) -> None:
        """Until no request is open and none began or ended for `quiet_s` (at once where the front has
        been quiet that long). A client that got its call's answer during the drain may ask one more
        thing before it is done — the `mcp` SDK lists the tools to check a result when it has never
        listed them — and a list is answered from the catalog, drain or not (a new call is still
        refused: the gate takes none once draining). Bound it: a client that keeps asking would keep it."""
        while True:
            await self.answered()
            left = self._last + quiet_s - anyio.current_time()
            if left <= 0:
                return
            await anyio.sleep(left)

    @property
    def open(self) -> int:
        return len(self._open)

    async def answered(self) -> None:
        while self._open:
            self._quiet = anyio.Event()
            await self._quiet.wait()
