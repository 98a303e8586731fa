"""The reviewer seam of the write barrier, and the reviewers that need no model.

A `Reviewer` receives a `ReviewRequest` (the held call, the segment of steps that led to it,
the committed history, the caller's stated intent) and returns a `Verdict`
`{reason, accepted_steps, replacement_action}`. `accepted_steps` counts the valid prefix of the
segment; the held call is its last step, so the call is accepted exactly when
`accepted_steps == len(segment)`.

Reviewers here: `allow` (audit only), `deny`, and `human`, which asks the person at the client
through a `UserChannel` the front provides: elicitation on the handshake era, `input_required`
on the 2026-07-28 era. When the client can do neither, `human` falls back to the configured
policy (deny unless told otherwise) — it never forwards silently. Model-backed reviewers
(`strong`, `strong_then_human`) live in `review.py`, which also builds the set a config uses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcp_spec_proxy.catalog import CatalogTool
from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.trajectory import History, Segment


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str
    accepted_steps: int
    replacement_action: dict[str, Any] | None = None
    reviewer: str = ""
    model_calls: tuple[ModelCall, ...] = ()
    evidence: dict[str, Any] | None = None  # what a LEASH decision rested on: score and neighbours


@dataclass(frozen=True)
class ReviewRequest:
    session: str
    tool: CatalogTool | None  # None when the held step is the engine's final answer
    arguments: dict[str, Any]
    intent: str | None
    segment: Segment
    history: History = field(repr=False)
    task: str = ""  # the user's request, when the proxy drives the agent (engine)


class InputNeeded(ProxyError):
    """The front must return `input_required` to the client and wait for its retry (2026-07-28 era)."""

    def __init__(self, key: str, message: str, schema: dict[str, Any]) -> None:
        super().__init__(message)
        self.key = key
        self.message = message
        self.schema = schema


class UserChannel(Protocol):
    """How a reviewer reaches the person behind the client, for one call."""

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        """The user's answer (`{"action": ..., "content": {...}}`), or None if the client cannot ask.

        May raise `InputNeeded` when the answer must come on a retry of the call.
        """
        ...


class Reviewer(Protocol):
    name: str

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict: ...


class AllowReviewer:
    """Accepts everything; the audit log still records each call."""

    name = "allow"

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(True, "allowed by policy (audit only)", len(request.segment), reviewer=self.name)


class DenyReviewer:
    name = "deny"

    def __init__(self, reason: str = "denied by policy: this tool may change state and review is set to deny") -> None:
        self._reason = reason

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(False, self._reason, len(request.segment) - 1, reviewer=self.name)


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Allow this call?", "default": False},
        "note": {"type": "string", "title": "Note (optional): why, or what to do instead"},
    },
    "required": ["approve"],
}


class HumanReviewer:
    name = "human"

    def __init__(self, fallback: Reviewer) -> None:
        self._fallback = fallback

    async def review(self, request: ReviewRequest, user: UserChannel, context: str = "") -> Verdict:
        message = approval_message(request) + (f"\n\nNote: {context}" if context else "")
        answer = await user.confirm(message, APPROVAL_SCHEMA)
        held = len(request.segment)
        if answer is None:
            verdict = await self._fallback.review(request, user)
            reason = f"the client cannot ask the user (no elicitation); fallback {verdict.reviewer}: {verdict.reason}"
            return Verdict(verdict.accepted, reason, verdict.accepted_steps, reviewer=f"human→{verdict.reviewer}")
        content = answer.get("content") or {}
        note = str(content.get("note") or "").strip()
        if answer.get("action") == "accept" and content.get("approve") is True:
            return Verdict(True, "approved by the user" + (f": {note}" if note else ""), held, reviewer=self.name)
        how = {"decline": "declined", "cancel": "dismissed"}.get(str(answer.get("action")), "rejected")
        return Verdict(False, f"{how} by the user" + (f": {note}" if note else ""), held - 1, reviewer=self.name)


def approval_message(request: ReviewRequest) -> str:
    tool = request.tool
    lines = [f"A tool call is waiting for your approval: {request.segment.held.tool}"]
    if tool is not None:
        lines.append(f"(server '{tool.server}', {tool.why})")
    lines += [
        "",
        "Arguments:",
        json.dumps(request.arguments, indent=2, ensure_ascii=False)[:2000],
    ]
    if request.intent:
        lines += ["", f"Stated intent: {request.intent}"]
    earlier = request.segment.steps[:-1]
    if earlier:
        lines += ["", "Steps just before it: " + ", ".join(step.tool for step in earlier[-8:])]
    return "\n".join(lines)
