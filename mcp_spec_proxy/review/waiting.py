"""How the gate waits on reviewers: two in a row, progress while a person decides, and where they decide.

`Both` asks a model, then the person; `with_heartbeat` tells the waiting client every few seconds
(with where a person may decide: `waiting_note`, the approval console's address); `asks_a_person`
says whether a reviewer may be waiting on someone, whose silence `on_error: allow` never forgives:
the reviewer's own kinds say so (`ReviewerKind.person`), or those of the reviewer it hands calls to.
"""

from __future__ import annotations

import logging
import time

import anyio
from mcp.shared.dispatcher import ProgressFnT

from mcp_spec_proxy.review import Reviewer, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import Chain

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0


class Both:
    """Two reviewers that must both accept, the first (a model) before the user is troubled."""

    def __init__(self, first: Reviewer, second: Reviewer) -> None:
        self._first = first
        self._second = second
        self.by: Chain = first.by.plus(second.by)

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        first = await self._first.review(request, user)
        if not first.accepted:
            return first
        second = await self._second.review(request, user)
        return Verdict(
            second.accepted,
            f"{second.reason} (after {first.reviewer} accepted: {first.reason})",
            second.accepted_steps,
            by=first.by.plus(second.by),
            model_calls=first.model_calls,
            arguments=second.arguments,
        )

    def waiting_note(self) -> str | None:
        return waiting_note(self._second)


async def with_heartbeat(reviewer: Reviewer, request: ReviewRequest, user: UserChannel, report: ProgressFnT) -> Verdict:
    """Review while telling the client it waits. The reviewer's own exception (an `InputNeeded`
    signal above all) leaves as itself, never wrapped in the task group's `ExceptionGroup`."""
    failure: Exception | None = None
    verdict: Verdict | None = None
    async with anyio.create_task_group() as tg:
        note = waiting_note(reviewer)
        tg.start_soon(_heartbeat, report, f"held for review ({reviewer.by.text})" + (f"; {note}" if note else ""))
        try:
            verdict = await reviewer.review(request, user)
        except Exception as exc:  # kept out of the group, raised again below as itself
            failure = exc
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    assert verdict is not None
    return verdict


async def _heartbeat(report: ProgressFnT, message: str) -> None:
    started = time.monotonic()
    tick = 0
    while True:
        waited = time.monotonic() - started
        try:
            await report(float(tick), None, f"{message}: waiting {waited:.0f}s")
        except Exception:  # boundary: a client that cannot hear progress still gets its verdict
            logger.debug("progress notification failed", exc_info=True)
            return
        tick += 1
        await anyio.sleep(HEARTBEAT_S)


def asks_a_person(reviewer: Reviewer | None) -> bool:
    """Whether `reviewer` may be waiting on a person: by its kinds, or by the reviewer it hands calls
    to (LEASH without a strong model hands them to the user)."""
    while reviewer is not None:
        if reviewer.by.asks_a_person:
            return True
        reviewer = getattr(reviewer, "fallback", None)
    return False


def waiting_note(reviewer: Reviewer) -> str | None:
    """Where a person may decide while the client waits (the approval console's link), if anywhere."""
    note = getattr(reviewer, "waiting_note", None)
    text = note() if callable(note) else None
    fallback = getattr(reviewer, "fallback", None)  # LEASH hands what it does not pass to its fallback
    if text is None and fallback is not None:
        return waiting_note(fallback)
    return text if isinstance(text, str) else None
