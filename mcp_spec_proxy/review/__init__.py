"""The reviewer seam of the write barrier: what a reviewer is given, and what it returns.

A `Reviewer` receives a `ReviewRequest` (the held call, the segment of steps that led to it,
the committed history, the caller's stated intent) and returns a `Verdict`
`{reason, accepted_steps, replacement_action}`. `accepted_steps` counts the valid prefix of the
segment; the held call is its last step, so the call is accepted exactly when
`accepted_steps == len(segment)`. A reviewer that cannot decide raises `ReviewFailed`; one that
must ask the person behind the client does so through a `UserChannel`. Who decided is data: a
reviewer is `by` a `Chain` of `ReviewerKind`s (`kinds`: the one table of what each kind may do),
and so is its verdict; `Verdict.reviewer` is only that chain's text, for people to read.

The reviewers live beside this seam: `policy` (allow, deny, human), `strong` (the one-prefill
verifier, the repair turn, strong_then_human), `leash` (LEASH's accept layer), `console` (the
person at the proxy's approval console; `rules`, what its session rules admit), `verdict`
(reading the strong model's answer); `build` makes the set a config uses.

A new kind of reviewer is its row in `kinds.ReviewerKind`, its class beside the others, a line in
`build` that makes it, and (when servers.yaml may name it) its name in config's `ReviewMode`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.review.kinds import Chain, ReviewerKind
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str
    accepted_steps: int
    replacement_action: dict[str, Any] | None = None
    by: Chain = field(kw_only=True)  # who decided, in order: logic reads this, never `reviewer`
    model_calls: tuple[ModelCall, ...] = ()
    evidence: dict[str, Any] | None = None  # what a LEASH decision rested on: score and neighbours
    arguments: dict[str, Any] | None = None  # a person's edit: the backend gets these instead (the gate audits it)
    # No judgement was had (the reviewer failed, timed out, or its answer stayed unreadable): a
    # refusal that fails closed, never a rejection a replacement or a repair may answer.
    failed: bool = False

    @property
    def reviewer(self) -> str:
        """Who decided, as the audit trail (`decided_by`) and the client's texts name it."""
        return self.by.text


@dataclass(frozen=True)
class ReviewRequest:
    session: str
    tool: CatalogTool | None  # None when the held step is the engine's final answer
    arguments: dict[str, Any]
    intent: str | None
    segment: Segment
    history: History = field(repr=False)
    task: str = ""  # the user's request, when the proxy drives the agent (engine)
    call: str = ""  # the gate's call id (set by the gate): the approval console binds its decision to it
    client: str | None = None  # the session's client identity, where a front authenticated one (LEASH provenance)
    principal: Principal | None = None  # who asks (set by the gate): the approval console shows it


class InputNeeded(Exception):
    """A signal, not an error: the front must return `input_required` to the client and wait for
    its retry (2026-07-28 era). Outside the `ProxyError` tree, so no handler of the proxy's errors
    takes it for a failure; across a task group it must be kept out of the group (`with_heartbeat`)."""

    def __init__(self, key: str, message: str, schema: dict[str, Any], memo: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.message = message
        self.schema = schema
        self.memo = memo or {}  # what a reviewer decided before asking; back on the retry's `user.memo`


class ReviewFailed(ProxyError):
    """The reviewer could not produce a verdict (model down, timeout, malformed twice)."""

    def __init__(self, message: str, calls: tuple[ModelCall, ...]) -> None:
        super().__init__(message)
        self.calls = calls


class UserChannel(Protocol):
    """How a reviewer reaches the person behind the client, for one call."""

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        """The user's answer (`{"action": ..., "content": {...}}`), or None if the client cannot ask.

        May raise `InputNeeded` when the answer must come on a retry of the call. A channel may
        carry `memo`, a dict: what the reviewers put in that `InputNeeded`, back on the retry.
        """
        ...


class Reviewer(Protocol):
    @property
    def by(self) -> Chain:
        """Who this reviewer is, as kinds (`Both` is two); its text is the audit's `reviewer`."""
        ...

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict: ...


__all__ = [
    "Chain",
    "InputNeeded",
    "ReviewFailed",
    "ReviewRequest",
    "Reviewer",
    "ReviewerKind",
    "UserChannel",
    "Verdict",
]
