"""Idempotency keys at the MCP front: a keyed call's outcome, kept for its replays.

A client that lost the answer to a call (its connection dropped, its own timeout ran out) sends
the same call again with the same key in the request's `_meta` (`KEY_META`). Within a session:

* the first call with a key runs as any call does;
* a replay after it ended gets its result again — the same result, naming the first call —
  and nothing runs, nothing is reviewed again;
* a replay while the first still runs (held for review, waiting on its backend) is refused at
  once (`CallReplayed`, naming the first call): waiting here could wait on the very client that
  replays (a suspended call waits for its answer); it asks again once the first has ended. Once
  means once the trail knows the first call (`ON_TRAIL`: its `held` line, or the `queued` line of
  a keyed write waiting behind an earlier one of its session, written before it waits), so the
  call named is always one `mcp-spec-proxy audit` shows; until then (a moment: no person or
  client is waited on before that line) the replay waits, and gets the result if the first ends. The
  call named is the one that holds the key at the gate where there is one (`holder`: on any
  replica, the call whose audit lines say what became of the key), so a replay that reached this
  replica first is never named as if it were the call that runs;
* a key is bound to its first call's tool and arguments (`Bound`: the tool, and a digest of the
  arguments its backend gets — the proxy's `intent` note aside, which a retry may word anew): a
  call with the same key and another tool or other arguments is no replay, and is refused
  (`CallReplayed`, naming the first call), nothing run, its client told to send a fresh key —
  never answered with another call's result.

This memory is one process's, and bounded (`MAX_KEYED`): only results are kept (an
`input_required` is a step of the same call, so its retry runs; an error is not kept). What
holds beyond it — on another replica, after a restart, past the bound, after a JSON-RPC error —
is the gate's: a write is forwarded only if its key is still free in its session (`calls/gate.py`),
so a replay the memory missed is refused there, never forwarded twice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mcp_spec_proxy.calls.trail import ON_TRAIL
from mcp_spec_proxy.errors import CallReplayed, ToolNotFound
from mcp_spec_proxy.tools.catalog import Catalog, digest, strip_intent

KEY_META = "mcp-spec-proxy/idempotency-key"
"""The `_meta` key of a `tools/call` request that carries the client's idempotency key."""
MAX_KEY_LENGTH = 256
MAX_KEYED = 1024
"""Keyed calls whose results one process keeps for replays; past this the oldest are forgotten."""

Served = types.CallToolResult | types.InputRequiredResult


@dataclass(frozen=True)
class Bound:
    """What a key is bound to in its session: a tool, and a digest of its arguments."""

    tool: str
    arguments: str

    @classmethod
    def of(cls, catalog: Catalog, name: str, arguments: Mapping[str, object]) -> Bound:
        """The call `name(arguments)` as its backend would get it (a name the catalog lacks as sent)."""
        try:
            tool = catalog.lookup(name)
        except ToolNotFound:
            return cls(name, digest(dict(arguments)))
        return cls(tool.name, digest(strip_intent(tool, arguments)[0]))


@dataclass
class _Keyed:
    first: str  # the call id of the first call with this key
    bound: Bound  # its tool and arguments
    result: types.CallToolResult | None = None  # None while it runs
    # Set once the first call has a line on the audit trail (`calls/trail.py`, `ON_TRAIL`), or has ended.
    on_trail: anyio.Event = field(default_factory=anyio.Event)


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
        bound: Bound,
        holder: Callable[[], Awaitable[str | None]] | None = None,
    ) -> Served:
        """`serve()` for the first call with `key` in `session`; its result for a replay of the
        same call, `bound` (and `replayed(first)` says so, for the audit trail). `holder()` asks the
        gate which call holds the key (on any replica), for a refusal to name it."""
        slot = (session, key)
        known = self._calls.get(slot)
        if known is not None and known.result is None:
            # A refusal names the first call: not before the trail knows it (its `queued` or `held` line,
            # written without waiting on anyone), or it has ended (its result is then this replay's).
            await known.on_trail.wait()
            known = self._calls.get(slot)
        if known is not None:
            self._calls.move_to_end(slot)
            if known.bound != bound:
                other = "another tool" if known.bound.tool != bound.tool else "other arguments"
                raise CallReplayed(
                    known.first,
                    f"this idempotency key was used by call {known.first} of this session with {other}: this"
                    " call was not run — send a fresh key for a new call (the same key only retries the same"
                    " tool with the same arguments)",
                )
            if known.result is None:
                first = (await holder() if holder is not None else None) or known.first
                if first != known.first:  # the call running here is itself a replay of one that holds the key
                    raise CallReplayed(
                        first,
                        f"this idempotency key belongs to call {first} of this session (`mcp-spec-proxy audit`"
                        f" shows its outcome): this replay was not run, and call {known.first}, a replay of it"
                        " still running here, will not run either — send a fresh key for a new call",
                    )
                raise CallReplayed(
                    first,
                    f"call {first} with this idempotency key is still running in this session: this"
                    " replay was not run; send it again once that call has ended to get its outcome",
                )
            replayed(known.first)
            return known.result
        entry = self._calls[slot] = _Keyed(call, bound)
        while len(self._calls) > self._limit:
            self._calls.popitem(last=False)
        told = ON_TRAIL.set(entry.on_trail.set)
        try:
            served = await serve()
        except BaseException:
            self._forget(slot, entry)  # an error (or a client gone) is not kept: the gate's claim still holds
            raise
        finally:
            ON_TRAIL.reset(told)
            entry.on_trail.set()
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


__all__ = ["KEY_META", "MAX_KEYED", "Bound", "Replays", "Served", "idempotency_key"]
