"""Tool results as the gate builds them: in the proxy's own words, and as the wire carries them.

The proxy's own words (a refusal, a block, a call that got no result) are `error_result`s,
marked as the proxy's (`calls/provenance.py`); a gateway client's observation is a `text_result`, in
someone else's words and unmarked. A read's result travels as wire JSON from the backend to the
front (`WireResult`), and `as_wire` / `as_model` are the two directions between that and the
SDK's model (`WireResult` is typed beside the backend's raw channel, which builds it first);
`as_model` is for the callers that need a model (the SDK's handler, a substitute's
note), so the read's pipeline itself never builds one.

The names a client and an operator share live here too: the `_meta` key that names a call
(`CALL_META`), and the keys of the errors and notes about it.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Final, Generic, Literal, NotRequired, TypedDict, TypeVar, cast

import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

from mcp_spec_proxy.backends.raw import WireResult
from mcp_spec_proxy.calls.provenance import notice
from mcp_spec_proxy.errors import BackendError
from mcp_spec_proxy.review import Verdict
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import Step

AUDIT_TEXT_CAP = 4000
"""Characters of one free-text audit field (a reviewer's reason); the rest is cut with a marker."""
CALL_META: Final = "mcp-spec-proxy/call"
"""The `_meta` key of a tools/call result (and the `data` key of a proxy error about a call that
reached the gate) that names the call, as the audit trail names it."""
FIRST_META: Final = "mcp-spec-proxy/first-call"
"""The `data` key of a `CallReplayed` error: the call that holds the idempotency key."""
AUDIT_META = "mcp-spec-proxy/audit"
"""The `_meta` key of a result whose audit line could not be written yet: why, and that it is retried."""

Report = ProgressFnT
"""Sends a progress notification to the calling client: `await report(progress, total, message)`."""

Author = Literal["client", "weak", "strong", "replacement", "repair", "console"]


class AuditCall(TypedDict):
    """The fields every audit line of a held call starts with (`held`, `verdict`, `abandoned`, …):
    the call as the operator's trail and the client's `_meta` name it, and who reviews it."""

    call: str
    session: str
    tool: str
    server: str
    arguments_digest: str
    effect: str
    why: str
    author: Author
    reviewer: str
    replaces: NotRequired[str]  # the call id of the rejected call this one stands in for
    key: NotRequired[str]  # a digest of the client's idempotency key, never the key
    principal: NotRequired[dict[str, str | None]]  # who asks (`Principal.audit_fields`), where the front knows
    rule: NotRequired[int | str]  # the rule of `rules:` that decided the call: its name, else its number
    rule_failed: NotRequired[str]  # why the rules failed closed for it


CallFailed = MCPError | BackendError
"""A forwarded call that got no result: the backend's own error, or the proxy's observation."""
R = TypeVar("R")


@dataclass(frozen=True)
class Read(Generic[R]):
    """What became of a forwarded call: its step as it ran (observed: a new step, the one handed
    in unchanged) and its result. One that got no result has `error`, and `result` is that
    failure as an error result; the caller raises it where its client should see it."""

    step: Step
    result: R
    error: CallFailed | None = None


CALL_FAILED = (MCPError, BackendError)


def new_call_id() -> str:
    """128 random bits: call ids share one audit table across replicas and years (48 bits met by
    chance past ~10M calls), and a client must not guess another's."""
    return secrets.token_hex(16)


def failed_result(tool: CatalogTool, exc: Exception) -> types.CallToolResult:
    """A call its backend could not answer (`BackendError`: the pool's own words) or answered
    with a JSON-RPC error, as an error result: what a model reads of it, and what a substitute's
    caller gets."""
    if isinstance(exc, BackendError):
        return error_result(str(exc))
    if isinstance(exc, MCPError):
        return error_result(f"backend {tool.server!r} answered {tool.original} with error {exc.code}: {exc.message}")
    # Anything else failed on the proxy's side of the call (a transport, a result that is not one):
    # the backend may never have answered, so it is not said to have.
    return error_result(f"backend {tool.server!r}: {tool.original} failed: {type(exc).__name__}: {exc}")


def as_wire(result: types.CallToolResult) -> WireResult:
    """A result as the JSON the wire carries."""
    return cast(WireResult, result.model_dump(by_alias=True, mode="json", exclude_none=True))


def as_model(result: WireResult) -> types.CallToolResult:
    """A wire result as the SDK's model. Its `resultType` is left out: the front states the
    era's own, and a handshake-era backend's is a key of no meaning there."""
    fields = {key: value for key, value in result.items() if key != "resultType"}
    return types.CallToolResult.model_validate(fields)


def capped(text: str, limit: int = AUDIT_TEXT_CAP) -> str:
    """`text` within `limit` characters; a cut is marked with how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters cut]"


def error_result(text: str) -> types.CallToolResult:
    """An error result in the proxy's own words, marked as its (`calls/provenance.py`)."""
    return notice(text)


def text_result(text: str, is_error: bool = False) -> types.CallToolResult:
    """A result in someone else's words (a gateway client's observation): unmarked."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)


def blocked_result(tool: CatalogTool, verdict: Verdict, why_not_replaced: str = "") -> types.CallToolResult:
    reason = capped(verdict.reason)
    text = f"Blocked at the write barrier: {tool.name} was not executed. Reviewer {verdict.reviewer}: {reason}"
    if verdict.replacement_action:
        text += "\nSuggested instead: " + json.dumps(verdict.replacement_action, ensure_ascii=False)
    if why_not_replaced:
        text += f"\n(Nothing was run in its place: {why_not_replaced}.)"
    return error_result(text)


__all__ = [
    "AUDIT_META",
    "AUDIT_TEXT_CAP",
    "CALL_FAILED",
    "CALL_META",
    "FIRST_META",
    "AuditCall",
    "Author",
    "CallFailed",
    "Report",
    "WireResult",
    "as_model",
    "as_wire",
    "blocked_result",
    "capped",
    "error_result",
    "failed_result",
    "new_call_id",
    "text_result",
]
