"""The reviewers that need no model: `allow` (audit only), `deny`, and `human`.

`human` asks the person at the client through a `UserChannel` the front provides: elicitation
on the handshake era, `input_required` on the 2026-07-28 era. When the client can do neither,
it falls back to the configured policy (`review.fallback`: deny, allow, or the approval
console) — it never forwards silently. The approval text shows every argument key, each value
cut to a share of a budget.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mcp_spec_proxy.review import Reviewer, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.console import ConsoleReviewer
from mcp_spec_proxy.review.kinds import ReviewerKind


class AllowReviewer:
    """Accepts everything; the audit log still records each call."""

    by = ReviewerKind.ALLOW.chain

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(True, "allowed by policy (audit only)", len(request.segment), by=self.by)


class DenyReviewer:
    by = ReviewerKind.DENY.chain

    def __init__(self, reason: str = "denied by policy: this tool may change state and review is set to deny") -> None:
        self._reason = reason

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(False, self._reason, len(request.segment) - 1, by=self.by)


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Allow this call?", "default": False},
        "note": {"type": "string", "title": "Note (optional): why, or what to do instead"},
    },
    "required": ["approve"],
}


class HumanReviewer:
    by = ReviewerKind.HUMAN.chain

    def __init__(self, fallback: Reviewer) -> None:
        self._fallback = fallback

    def waiting_note(self) -> str | None:
        """Where else the user may answer while the client waits (the approval console's link)."""
        note = getattr(self._fallback, "waiting_note", None)
        text = note() if callable(note) else None
        return f"unless your client asks you, {text}" if isinstance(text, str) else None

    async def review(self, request: ReviewRequest, user: UserChannel, context: str = "") -> Verdict:
        message = approval_message(request) + (f"\n\nNote: {context}" if context else "")
        answer = await user.confirm(message, APPROVAL_SCHEMA)
        held = len(request.segment)
        if answer is None:
            fallback = self._fallback
            if isinstance(fallback, ConsoleReviewer):  # the console shows what a model said before
                verdict = await fallback.review(request, user, context=context)
            else:
                verdict = await fallback.review(request, user)
            reason = f"the client cannot ask the user (no elicitation); fallback {verdict.reviewer}: {verdict.reason}"
            return dataclasses.replace(verdict, reason=reason, by=self.by.then(verdict.by))
        content = answer.get("content") or {}
        note = str(content.get("note") or "").strip()
        if answer.get("action") == "accept" and content.get("approve") is True:
            return Verdict(True, "approved by the user" + (f": {note}" if note else ""), held, by=self.by)
        how = {"decline": "declined", "cancel": "dismissed"}.get(str(answer.get("action")), "rejected")
        return Verdict(False, f"{how} by the user" + (f": {note}" if note else ""), held - 1, by=self.by)


APPROVAL_VALUE_CHARS = 1_000
"""Characters of one argument's value the approval text shows at most."""
APPROVAL_TOTAL_CHARS = 4_000
"""Characters of all argument values together; short values are shown whole, long ones share the rest."""
_KEY_CHARS = 200


def _cut(text: str, limit: int, *, quote: bool = True) -> str:
    """`text` (as a JSON string if `quote`) cut to `limit` characters, the cut counted in a marker.

    JSON quoting keeps a string on one line: a newline inside it cannot fake another argument.
    """
    if len(text) <= limit:
        return json.dumps(text, ensure_ascii=False) if quote else text
    left_out = len(text) - max(0, limit)
    head = text[: max(0, limit)]
    if not head:
        return f"… [{left_out} characters not shown]"
    return f"{json.dumps(head, ensure_ascii=False) if quote else head} … [{left_out} more characters not shown]"


def _argument_lines(arguments: dict[str, Any]) -> list[str]:
    """One line per argument key, every key shown: the approver reads what will be forwarded.

    A string value is cut on its own characters, anything else on its one-line JSON text; either
    way the cut says how many characters it left out. The values share `APPROVAL_TOTAL_CHARS`, so
    one huge value cannot push the others out of sight: shortest first, each gets at most an
    equal share of what is left.
    """
    texts = {
        key: value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        for key, value in arguments.items()
    }
    allowance: dict[str, int] = {}
    left = APPROVAL_TOTAL_CHARS
    for done, key in enumerate(sorted(texts, key=lambda k: len(texts[k]))):
        allowance[key] = min(len(texts[key]), APPROVAL_VALUE_CHARS, left // (len(texts) - done))
        left -= allowance[key]
    return [
        f"  {_cut(key, _KEY_CHARS)}: {_cut(texts[key], allowance[key], quote=isinstance(value, str))}"
        for key, value in arguments.items()
    ]


def approval_message(request: ReviewRequest) -> str:
    tool = request.tool
    lines = [f"A tool call is waiting for your approval: {request.segment.held.tool}"]
    if tool is not None:
        lines.append(f"(server '{tool.server}', {tool.why})")
    count = len(request.arguments)
    lines += ["", f"Arguments ({count} key{'' if count == 1 else 's'}, all forwarded as given):"]
    lines += _argument_lines(request.arguments) or ["  (none)"]
    if request.intent:
        lines += ["", f"The agent's stated intent (not verified): {_cut(request.intent, APPROVAL_VALUE_CHARS)}"]
    elif tool is not None and tool.wants_intent and not request.task:
        lines += ["", "The agent gave no intent for this call."]
    earlier = request.segment.steps[:-1]
    if earlier:
        lines += ["", "Steps just before it: " + ", ".join(step.tool for step in earlier[-8:])]
    return "\n".join(lines)
