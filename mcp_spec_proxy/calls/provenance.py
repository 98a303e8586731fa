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
tool result comes through call it — the `run` stage (`calls/stages.py`: writes and their substitutes) and the gate's
`read` (every read, whichever front door it came by) — so a result that imitates a notice
word for word, `_meta` included, reaches the client as the same backend result on either path,
without the mark.

Only the top-level `_meta` of a result is the proxy's to mark; a block's own `_meta` is the
backend's and passes as it was sent. The same holds for every other result a backend answers
through the proxy (a prompt, a resource, a completion: `calls/reads.py` passes each through
`from_backend`), and for a backend's JSON-RPC error: `backend_error` keeps its words and moves
what only the proxy may say — a code of the proxy's band (`errors.py`, -32010..-32019) and any
`mcp-spec-proxy/` key of its `data` — out of the way, so a backend cannot tell a client that a
write which ran did not run (`fronts/wire.py` calls it; docs/SECURITY.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, cast, overload

import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, SERVER_INFO_META_KEY

from mcp_spec_proxy.backends.raw import WireResult

NAMESPACE = "mcp-spec-proxy/"
NOTICE_META = f"{NAMESPACE}notice"
"""`_meta` key of a result the proxy wrote: how many of its leading content blocks are the proxy's."""

BACKEND_CODE = f"{NAMESPACE}backend-code"
"""`data` key of a backend's error whose code was one of the proxy's own: the code it sent."""
BACKEND_DATA = f"{NAMESPACE}backend-data"
"""`data` key of such an error whose `data` was not an object: the data it sent."""
OWN_CODES = range(-32019, -32009)
"""The proxy's band of JSON-RPC codes (`errors.py` uses -32010..-32016; the rest is kept for it)."""

Model = TypeVar("Model", bound=types.Result)


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


@overload
def from_backend(result: Model) -> Model: ...
@overload
def from_backend(result: WireResult) -> WireResult: ...
def from_backend(result: types.Result | WireResult) -> types.Result | WireResult:
    """A backend's result (a tool's, a prompt, a resource, a completion) as the proxy passes it
    on: its top-level `_meta` without the keys only the proxy may write; everything else as the
    backend sent it (the same object when it carried none of them)."""
    meta = result.meta if isinstance(result, types.Result) else result.get("_meta")
    if not isinstance(meta, Mapping) or not any(_proxys(key) for key in meta):
        return result
    kept = {key: value for key, value in meta.items() if not _proxys(key)} or None
    if isinstance(result, types.Result):
        return result.model_copy(update={"meta": kept})
    stripped: dict[str, Any] = {key: value for key, value in result.items() if key != "_meta"}
    if kept is not None:
        stripped["_meta"] = kept
    return cast(WireResult, stripped)


def backend_error(error: MCPError) -> MCPError:
    """A backend's JSON-RPC error as the proxy passes it on. Its message always, and its code and
    `data` as it sent them, unless they say what only the proxy may say:

    * a code of the proxy's band (`OWN_CODES`) becomes Internal Error (-32603), and the code the
      backend sent goes in `data[BACKEND_CODE]` (beside the keys of its `data` object, or with a
      `data` that is no object under `BACKEND_DATA`), so -32016 "nothing ran" from a backend
      reaches the client as the backend's failure, never as the proxy's refusal;
    * every `mcp-spec-proxy/` key of its `data` object is dropped (the proxy's call id, a first
      call's id), as `from_backend` drops them from a result's `_meta`.

    A new error either way (the caller raises it from the backend's)."""
    code, data = error.code, error.data
    forged = isinstance(data, Mapping) and any(_proxys(key) for key in data)
    if code not in OWN_CODES and not forged:
        return MCPError(code, error.message, data)
    kept: Any = {key: value for key, value in data.items() if not _proxys(key)} if forged else data
    if code in OWN_CODES:
        if kept is None or isinstance(kept, Mapping):
            kept = {**(kept or {}), BACKEND_CODE: code}
        else:
            kept = {BACKEND_CODE: code, BACKEND_DATA: kept}
        code = INTERNAL_ERROR
    return MCPError(code, error.message, kept)


def _proxys(key: Any) -> bool:
    return key == SERVER_INFO_META_KEY or (isinstance(key, str) and key.startswith(NAMESPACE))


__all__ = [
    "BACKEND_CODE",
    "BACKEND_DATA",
    "NAMESPACE",
    "NOTICE_META",
    "OWN_CODES",
    "backend_error",
    "from_backend",
    "noted",
    "notice",
    "own_blocks",
]
