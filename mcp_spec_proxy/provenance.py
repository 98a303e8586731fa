"""Whose words a tool result carries: the proxy's own, or a backend's.

The proxy writes some tool results itself (a block, a refusal, arguments it will not send, a
call that got no result, the note before a substitute's result), and a backend may write any
text at all, so the words cannot tell them apart. The mark can: the proxy's own words carry
`_meta["mcp-spec-proxy/notice"]`, the number of leading content blocks that are the proxy's
(every block, for a result it wrote alone; one, for a substitute's note before the backend's
blocks).

A backend cannot forge it, because no backend's tool result keeps it: `from_backend` drops from
a backend's result `_meta` every key under `mcp-spec-proxy/` (the proxy's namespace: the
notice, the session, the approval key) and the `serverInfo` stamp (it names the server that
answered: to the proxy's client that is the proxy, whose front stamps it, as `without_envelope`
keeps a client's envelope from the backend), and changes nothing else. Both doors a backend's
tool result comes through call it — the gate's `_forward` (writes and their substitutes) and its
`read` (every read, whichever front door it came by) — so a result that imitates a notice
word for word, `_meta` included, reaches the client as the same backend result on either path,
without the mark.

Only the top-level `_meta` of a result is the proxy's to mark; a block's own `_meta` is the
backend's and passes as it was sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast

import mcp_types as types
from mcp_types import SERVER_INFO_META_KEY

from mcp_spec_proxy.backends.raw import WireResult

NAMESPACE = "mcp-spec-proxy/"
NOTICE_META = f"{NAMESPACE}notice"
"""`_meta` key of a result the proxy wrote: how many of its leading content blocks are the proxy's."""

Result = TypeVar("Result", types.CallToolResult, WireResult)


def notice(text: str, *, is_error: bool = True) -> types.CallToolResult:
    """A result in the proxy's own words, marked as such."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=is_error, _meta={NOTICE_META: 1}
    )


def noted(note: str, inner: types.CallToolResult, *, structured: bool) -> types.CallToolResult:
    """The proxy's `note`, then `inner`'s blocks: the mark counts the note and whatever of
    `inner` was the proxy's own already (a substitute's failure, told in words)."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=note), *inner.content],
        is_error=inner.is_error,
        structured_content=inner.structured_content if structured else None,
        _meta={NOTICE_META: 1 + own_blocks(inner)},
    )


def own_blocks(result: types.CallToolResult | Mapping[str, Any]) -> int:
    """How many leading content blocks of `result` are the proxy's words (0: all the backend's)."""
    meta = result.meta if isinstance(result, types.CallToolResult) else result.get("_meta")
    count = meta.get(NOTICE_META) if isinstance(meta, Mapping) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def from_backend(result: Result) -> Result:
    """A backend's tool result as the proxy passes it on: its top-level `_meta` without the keys
    only the proxy may write; everything else as the backend sent it (the same object when it
    carried none of them)."""
    meta = result.meta if isinstance(result, types.CallToolResult) else result.get("_meta")
    if not isinstance(meta, Mapping) or not any(_proxys(key) for key in meta):
        return result
    kept = {key: value for key, value in meta.items() if not _proxys(key)} or None
    if isinstance(result, types.CallToolResult):
        return result.model_copy(update={"meta": kept})
    stripped: dict[str, Any] = {key: value for key, value in result.items() if key != "_meta"}
    if kept is not None:
        stripped["_meta"] = kept
    return cast(WireResult, stripped)


def _proxys(key: Any) -> bool:
    return key == SERVER_INFO_META_KEY or (isinstance(key, str) and key.startswith(NAMESPACE))


__all__ = ["NAMESPACE", "NOTICE_META", "from_backend", "noted", "notice", "own_blocks"]
