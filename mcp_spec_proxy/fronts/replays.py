"""Idempotency keys at the MCP front: a keyed call's outcome, kept for its replays.

A client that lost the answer to a call (its connection dropped, its own timeout ran out) sends
the same call again with the same key in the request's `_meta` (`KEY_META`). Within a session:

* the first call with a key runs as any call does;
* a replay after it ended gets its result again — the same result, naming the first call —
  and nothing runs, nothing is reviewed again;
* a replay while the first still runs (held for review, waiting on its backend) is refused at
  once (`CallReplayed`, naming the first call): waiting here could wait on the very client that
  replays (a suspended call waits for its answer); it asks again once the first has ended.

This memory is one process's, and bounded (`MAX_KEYED`): only results are kept (an
`input_required` is a step of the same call, so its retry runs; an error is not kept). What
holds beyond it — on another replica, after a restart, past the bound, after a JSON-RPC error —
is the gate's: a write is forwarded only if its key is still free in its session (`gate.py`),
so a replay the memory missed is refused there, never forwarded twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mcp_spec_proxy.errors import CallReplayed

KEY_META = "mcp-spec-proxy/idempotency-key"
"""The `_meta` key of a `tools/call` request that carries the client's idempotency key."""
MAX_KEY_LENGTH = 256
MAX_KEYED = 1024
"""Keyed calls whose results one process keeps for replays; past this the oldest are forgotten."""

Served = types.CallToolResult | types.InputRequiredResult


@dataclass
class _Keyed:
    first: str  # the call id of the first call with this key
    result: types.CallToolResult | None = None  # None while it runs


class Replays:
    def __init__(self, limit: int = MAX_KEYED) -> None:
        self._limit = limit
        self._calls: OrderedDict[tuple[str, str], _Keyed] = OrderedDict()

    async def run(
        self,
        session: str,
        key: str,
        call: str,
        serve: Callable[[], Awaitable[Served]],
        replayed: Callable[[str], None],
    ) -> Served:
        """`serve()` for the first call with `key` in `session`; its result for a replay (and
        `replayed(first)` says so, for the audit trail)."""
        slot = (session, key)
        known = self._calls.get(slot)
        if known is not None:
            self._calls.move_to_end(slot)
            if known.result is None:
                raise CallReplayed(
                    known.first,
                    f"call {known.first} with this idempotency key is still running in this session: this"
                    " replay was not run; send it again once that call has ended to get its outcome",
                )
            replayed(known.first)
            return known.result
        entry = self._calls[slot] = _Keyed(call)
        while len(self._calls) > self._limit:
            self._calls.popitem(last=False)
        try:
            served = await serve()
        except BaseException:
            self._forget(slot, entry)  # an error (or a client gone) is not kept: the gate's claim still holds
            raise
        if isinstance(served, types.CallToolResult):
            entry.result = served
        else:
            self._forget(slot, entry)  # input_required: its retry is the same call, and must run
        return served

    def _forget(self, slot: tuple[str, str], entry: _Keyed) -> None:
        if self._calls.get(slot) is entry:
            del self._calls[slot]


def idempotency_key(meta: object) -> str | None:
    """The key a request's `_meta` carries, or None; one that is no short string is refused
    (a key the proxy could not honour must not pass for one it does)."""
    value = meta.get(KEY_META) if isinstance(meta, Mapping) else None
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LENGTH:
        raise MCPError(INVALID_PARAMS, f"_meta {KEY_META} must be a string of 1 to {MAX_KEY_LENGTH} characters")
    return value


__all__ = ["KEY_META", "MAX_KEYED", "Replays", "Served", "idempotency_key"]
