"""One write's lines on the audit trail, and what a line that cannot be written means for the call.

Where a line cannot be written decides what the caller is told. Before the forward (its `held`,
`verdict`, `edited` line, its key's claim) the write is refused — `StateError`, saying it was not
forwarded — and its terminal line (`abandoned`) is left to the sink to write when it can
(`AuditSink.later`). After the forward (`forwarded`, `unsent`, `forward-interrupted`, and a
`blocked`) the backend's real outcome stands: the line is left to the sink, and the caller learns
that it is late. So no call stays `held` for ever while the process lives, and nothing that ran is
reported as not run.

`ON_TRAIL` is told once the client's call served in the current context has a line on the trail
(its `held`, a read's `read`, or the `queued` of a keyed write waiting behind an earlier one of its
session): the front tells a replay of a call still running which call that is only once the trail
knows it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import anyio

from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.calls.call import GateCall
from mcp_spec_proxy.errors import CallReplayed, StateError
from mcp_spec_proxy.principal import who
from mcp_spec_proxy.tools.catalog import digest

ON_TRAIL: ContextVar[Callable[[], None] | None] = ContextVar("mcp_spec_proxy_on_trail", default=None)
"""Set by the front around a keyed client call: told once that call has a line on the trail."""


def on_trail() -> None:
    """The client's call served in this context has a line on the trail now (`ON_TRAIL`)."""
    told = ON_TRAIL.get()
    if told is not None:
        told()


class Trail:
    """The audit lines of one call at the gate, written to `sink` (the file log or the shared table)."""

    def __init__(self, sink: AuditSink, call: GateCall) -> None:
        self._sink = sink
        self._call = call

    async def before(self, kind: str, /, **fields: Any) -> None:
        """A line the forward waits for. When it cannot be written the write is refused, and the
        call's terminal line (`abandoned`) is left to the sink: the call never stays `held`."""
        call = self._call
        try:
            await self._sink.record(kind, **fields)
            on_trail()
        except StateError as exc:
            self._sink.later("abandoned", **ids(call), reason=f"its {kind} line: {exc}")
            raise StateError(
                f"{exc}: {call.tool.name} was not forwarded (call {call.id}) — no write runs without its audit"
                " line; writes are refused until the audit trail takes lines again, reads keep working"
            ) from None

    async def after(self, kind: str, /, **fields: Any) -> str | None:
        """A line about what already happened (the forward, a refusal): when it cannot be written
        now the sink keeps it and writes it later; the problem, or None when it was written."""
        try:
            await self._sink.record(kind, **fields)
        except StateError as exc:
            self._sink.later(kind, **fields)
            return str(exc)
        return None

    async def settled(self, kind: str, /, **fields: Any) -> str | None:
        """The call's terminal line (`abandoned`, `blocked`): once begun it is written whole, whatever
        cancels the call meanwhile (a cancel is delivered after it)."""
        problem: str | None = None
        with anyio.CancelScope(shield=True):
            problem = await self.after(kind, **fields)
        return problem

    async def claim(self) -> None:
        """Take the call's idempotency key before it is forwarded, or refuse the call (`CallReplayed`,
        naming the call that holds the key, and audited `blocked`)."""
        call = self._call
        assert call.key is not None
        try:
            first = await self._sink.claim(call.session, digest(call.key), call.id, **who(call.principal))
        except StateError as exc:
            self._sink.later("abandoned", **ids(call), reason=f"its key's claim: {exc}")
            raise StateError(f"{exc}: {call.tool.name} was not forwarded (call {call.id})") from None
        if first is None:
            return
        reason = f"its idempotency key belongs to call {first}, which may have run"
        await self.settled("blocked", **ids(call), reason=reason)
        raise CallReplayed(
            first,
            f"{call.tool.name} was not forwarded: its idempotency key was used by call {first} of this session"
            " (forwarded, or about to be; `mcp-spec-proxy audit` shows its outcome) — send a new key for a new call",
        )


def ids(call: GateCall) -> dict[str, Any]:
    """What names a call on each of its audit lines: its id, its session and who asked."""
    return {"call": call.id, "session": call.session, **who(call.principal)}


__all__ = ["ON_TRAIL", "Trail", "ids", "on_trail"]
