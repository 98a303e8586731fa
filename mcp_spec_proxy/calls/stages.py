"""The write path's stages, in the order a held call meets them; each returns what it learned.

    hold    the policy chooses the call's reviewer from the whole call → audit `held` (durable)  → `Held`
    decide  the reviewer's verdict → audit `verdict` (and `edited`, when a person rewrote it)   → `Decided`
    run     claim the call's idempotency key, then forward it to its backend exactly once      → `Read`
    settle  audit what became of it (`forwarded`, `unsent`, `blocked`), label LEASH            → `Outcome`

`calls/gate.py` strings them together. A call cancelled from its `held` line (while that is
written, too) to its forward — by its client, or by the replica stopping — is recorded `abandoned`
with the true reason; one cancelled while it is forwarded, `forward-interrupted` (it may have
run). A drain whose grace ran out while the call waited for its verdict stops that wait
(`Drain.holding`): the call is abandoned, never forwarded.

A reviewer that fails or times out becomes a refusing verdict (or, with `review.on_error:
allow`, an accepting one); the exception never reaches the door. A verdict and its reason are
capped before they are written, so a model cannot flood the audit trail.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import mcp_types as types

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.call import GateCall, Outcome
from mcp_spec_proxy.calls.drain import SHUT_DOWN, Drain
from mcp_spec_proxy.calls.policy import Choice, Policy
from mcp_spec_proxy.calls.provenance import from_backend, noted
from mcp_spec_proxy.calls.results import AUDIT_META, CALL_FAILED, AuditCall, Read, Report, capped, failed_result
from mcp_spec_proxy.calls.trail import Trail, ids
from mcp_spec_proxy.config.schema import ReviewConfig
from mcp_spec_proxy.errors import BackendClosed, BackendUnavailable, ShuttingDown
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.observe.telemetry import Tracing
from mcp_spec_proxy.review import InputNeeded, Reviewer, ReviewFailed, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import ReviewerKind
from mcp_spec_proxy.review.waiting import asks_a_person, waiting_note, with_heartbeat
from mcp_spec_proxy.tools.catalog import CatalogTool, digest
from mcp_spec_proxy.trajectory import Step, observation_text

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

logger = logging.getLogger(__name__)

Executor = Callable[[CatalogTool, dict[str, Any], "Report | None"], Awaitable[types.CallToolResult]]
"""Runs an accepted call somewhere other than a backend (the gateway's client tools)."""


@dataclass(frozen=True)
class Held:
    """What `hold` learned: the call as its reviewer reads it, what the policy chose for it, the
    fields every one of its audit lines starts with, and its lines on the trail."""

    call: GateCall
    choice: Choice
    lines: AuditCall
    trail: Trail


@dataclass(frozen=True)
class Decided:
    """What `decide` learned: the verdict and, for an accepted call, what runs — the call's own
    arguments, or those a person edited (`edited`), with the note that tells the agent so."""

    verdict: Verdict
    latency_ms: float
    arguments: dict[str, Any]
    step: Step
    note: str | None = None
    edited: dict[str, Any] | None = None


class WriteStages:
    """The stages of a held write, with what they need: the reviewers' settings, the policy, the
    backends, the drain, the traces and LEASH (which learns from every verdict)."""

    def __init__(
        self,
        review: ReviewConfig,
        policy: Policy,
        backends: BackendPool,
        drain: Drain,
        tracing: Tracing,
        leash: Leash | None = None,
    ) -> None:
        self._review_config = review
        self._policy = policy
        self._backends = backends
        self._drain = drain
        self._tracing = tracing
        self._leash = leash

    async def hold(self, call: GateCall, trail: Trail, strong: Reviewer | None, verified: bool) -> Held:
        """The reviewer the policy chooses for the call, and its `held` line, durable before anything moves."""
        call = dataclasses.replace(call, request=_named(call))
        choice = await self._policy.choose(call, strong, verified)
        tool, decision = call.tool, choice.decision
        lines: AuditCall = {
            "call": call.id,
            "session": call.session,
            "tool": tool.name,
            "server": tool.server,
            "arguments_digest": digest(call.arguments),
            "effect": tool.effect,
            "why": tool.why,
            "author": call.author,
            "reviewer": choice.reviewer.by.text,
        }
        if call.replaces:
            lines["replaces"] = call.replaces
        if decision.rule is not None:  # the rule that decided it, and why it failed closed if it did
            lines["rule"] = decision.rule
        if decision.failed is not None:
            lines["rule_failed"] = capped(decision.failed)
        if call.key is not None:
            lines["key"] = digest(call.key)  # a digest: the key is the client's text
        if call.principal is not None:
            lines["principal"] = call.principal.audit_fields()  # on every line of the call (`ids`)
        # Shielded: a cancel that lands while the line is written (the row committed, its answer not yet
        # back) is delivered once it is, inside `decide`, which then writes the call's `abandoned`.
        with anyio.CancelScope(shield=True):
            await trail.before("held", **lines, segment_length=len(call.request.segment))
        logger.debug("%s held for its verdict (reviewer %s)", tool.name, choice.reviewer.by.text)
        return Held(call, choice, lines, trail)

    async def decide(
        self,
        held: Held,
        user: UserChannel,
        report: Report | None,
        step: Step | None,
        decided: Callable[[Verdict], Awaitable[None]] | None,
    ) -> Decided:
        """The verdict, durable before anything runs (and a person's edit with it); `decided` hears it
        once it is audited. A call cancelled meanwhile is abandoned; one the drain stopped, too."""
        call, trail, reviewer = held.call, held.trail, held.choice.reviewer
        tool = call.tool
        try:
            await anyio.lowlevel.checkpoint_if_cancelled()  # cancelled while its `held` line was written
            if held.choice.flagged is not None:
                await trail.before("leash-escalated", **ids(call), **held.choice.flagged)
            started = time.perf_counter()
            with self._drain.holding() as hold, self._tracing.review(reviewer.by) as review:
                verdict = review.decided(await self._review(reviewer, call.request, user, report))
            if hold.cancelled_caught:  # the drain's grace ran out while it was held
                await trail.settled("abandoned", **held.lines, reason=SHUT_DOWN)
                raise ShuttingDown(
                    f"{tool.name} was not forwarded (call {call.id}): {SHUT_DOWN} while it waited for its verdict"
                )
            latency_ms = round((time.perf_counter() - started) * 1000, 3)
            await trail.before(
                "verdict",
                **held.lines,
                accepted=verdict.accepted,
                reason=capped(verdict.reason),
                accepted_steps=verdict.accepted_steps,
                decided_by=verdict.reviewer,
                latency_ms=latency_ms,
                **({"evidence": verdict.evidence} if verdict.evidence else {}),
            )
            logger.debug("%s %s by %s", tool.name, "accepted" if verdict.accepted else "rejected", verdict.reviewer)
            if decided is not None:
                await decided(verdict)
            step = step or Step(tool.name, call.arguments, tool.effect, intent=call.intent)
            if not verdict.accepted or verdict.arguments is None or verdict.arguments == call.arguments:
                return Decided(verdict, latency_ms, call.arguments, step)
            # A person edited the call on the approval console (validated there against its schema).
            digests = {"original_digest": digest(call.arguments), "edited_digest": digest(verdict.arguments)}
            await trail.before("edited", **ids(call), by=verdict.reviewer, **digests)
            # What runs is a new step: the segment the reviewer was shown keeps the call as it was sent.
            arguments = dict(verdict.arguments)
            # The agent is told what ran: else it believes its own arguments did, and builds on that.
            shown = capped(json.dumps(arguments, ensure_ascii=False))
            note = (
                f"[mcp-spec-proxy] the reviewer ({verdict.reviewer}) changed this call's arguments before"
                f" approving it: {tool.name} ran with {shown}, not with the arguments you sent. Its result follows."
            )
            edited = dataclasses.replace(step, arguments=arguments)
            return Decided(verdict, latency_ms, arguments, edited, note, arguments)
        except InputNeeded:
            await trail.before("awaiting-input", **held.lines)
            raise
        except anyio.get_cancelled_exc_class():
            await self._abandon(held)
            raise

    async def run(
        self, held: Held, decided: Decided, executor: Executor | None, report: Report | None
    ) -> Read[types.CallToolResult]:
        """Claim the call's idempotency key (the one call of its session forwarded with it), then
        forward it once: to its backend, or to `executor` (a gateway client's own tool)."""
        call, trail = held.call, held.trail
        if call.key is not None:
            try:
                await trail.claim()
            except anyio.get_cancelled_exc_class():
                await self._abandon(held)
                raise
        try:
            if executor is not None:
                return await _execute(executor, call.tool, decided.arguments, decided.step, report)
            return await self._forward(call.tool, decided.arguments, decided.step, report)
        except BaseException as exc:  # cancelled (or worse) mid-send: the call may have run
            why = SHUT_DOWN if self._drain.ending else type(exc).__name__
            reason = f"{why} while forwarding: the backend may or may not have run it"
            await trail.settled("forward-interrupted", **ids(call), reason=reason)
            raise

    async def settle(self, held: Held, decided: Decided, ran: Read[types.CallToolResult] | None) -> Outcome:
        """Audit what became of the call (`blocked` when it did not run), label LEASH, and return
        the outcome: the backend's result, told when its audit line is late."""
        call, trail, verdict = held.call, held.trail, decided.verdict
        named = ids(call)
        if ran is None:
            await trail.settled("blocked", **named)
            await self._label(call, verdict)
            return Outcome(call.id, verdict, None, decided.latency_ms, key=call.key)
        if (error := ran.error) is not None:
            # A backend that was not connected was sent nothing: the audit says so, not "forwarded".
            sent = not isinstance(error, BackendUnavailable) or isinstance(error, BackendClosed)
            await trail.after("forwarded" if sent else "unsent", **named, is_error=True, error_code=error.code)
            await self._label(call, verdict, decided.edited)
            failed = noted(decided.note, ran.result, structured=True) if decided.note else ran.result
            return Outcome(call.id, verdict, failed, decided.latency_ms, error=error, key=call.key, step=ran.step)
        result = ran.result
        late = await trail.after("forwarded", **named, is_error=bool(result.is_error))
        if late is not None:
            # It ran: the client gets the backend's result, told that its audit line is late.
            note = f"the backend ran this call; its audit line could not be written yet ({late}): it is retried"
            result = result.model_copy(update={"meta": {**(result.meta or {}), AUDIT_META: note}})
        if decided.note is not None:
            result = noted(decided.note, result, structured=True)
        await self._label(call, verdict, decided.edited)  # after the write: a slow bank never delays an accepted call
        return Outcome(call.id, verdict, result, decided.latency_ms, key=call.key, step=ran.step)

    async def _abandon(self, held: Held) -> None:
        """Cancelled from outside before the forward (in its review, or while its verdict, edit or
        key was made durable): by its client, or by the replica stopping after (or during) a drain."""
        why = SHUT_DOWN if self._drain.ending else "the client cancelled or disconnected"
        await held.trail.settled("abandoned", **held.lines, reason=why)

    async def _review(
        self, reviewer: Reviewer, request: ReviewRequest, user: UserChannel, report: Report | None
    ) -> Verdict:
        """The verdict, or a refusing one when the reviewer fails; `InputNeeded` passes through."""
        held = len(request.segment)
        calls: tuple[ModelCall, ...] = ()
        timeout = self._review_config.timeout
        try:
            with anyio.fail_after(timeout):
                if report is None:
                    return await reviewer.review(request, user)
                return await with_heartbeat(reviewer, request, user, report)
        except TimeoutError:
            problem = f"review by {reviewer.by.text} timed out after {timeout:g}s"
            if note := waiting_note(reviewer):
                problem += f" (no decision came: {note})"
        except InputNeeded:
            raise
        except ReviewFailed as exc:
            problem, calls = f"review by {reviewer.by.text} failed: {exc}", exc.calls
        except Exception as exc:  # boundary: a reviewer failure must become a verdict, never a forward
            logger.exception("reviewer %s failed", reviewer.by.text)
            problem = f"review by {reviewer.by.text} failed: {type(exc).__name__}: {exc}"
        if self._review_config.on_error == "allow" and not asks_a_person(reviewer):
            # `on_error: allow` forgives a model's failure, never a person's silence.
            reason = f"{problem}; allowed because review.on_error is allow"
            return Verdict(True, reason, held, by=_ON_ERROR, model_calls=calls)
        return Verdict(False, f"{problem}; failing closed", held - 1, by=_ON_ERROR, model_calls=calls, failed=True)

    async def _forward(
        self, tool: CatalogTool, arguments: dict[str, Any], step: Step, report: Report | None
    ) -> Read[types.CallToolResult]:
        """Send an accepted write to its backend (reads have their own door, `calls/reads.py`). A
        `CallFailed` comes back as the call's `error`, with the step that observed it."""
        started = time.perf_counter()
        try:
            with self._tracing.forward(tool):
                result = from_backend(await self._backends.get(tool.server).call_tool(tool.original, arguments, report))
        except CALL_FAILED as exc:
            failed = failed_result(tool, exc)
            return Read(_observe(step, failed, started), failed, exc)
        except Exception as exc:  # boundary: any other fault of the call, answered or not, is its error result
            result = failed_result(tool, exc)
        return Read(_observe(step, result, started), result)

    async def _label(self, call: GateCall, verdict: Verdict, ran: dict[str, Any] | None = None) -> None:
        """Labels for free: a judgement's accepted prefix succeeded, its first rejected step failed.

        Each label says who judged which session's call, so `review: leash` never takes a
        session's (or its client's) own accepted calls as evidence for its next one. `ran` is
        what the held call ran with: a person's edit is what was approved, so the held step is
        labelled with it, never with the arguments the person rewrote."""
        if self._leash is not None and verdict.by.judged:
            from mcp_spec_proxy.leash.provenance import Provenance  # LEASH loads only with a `leash:` section

            provenance = Provenance(
                "verdict", verdict.reviewer, "proxy", call.session, call.request.client, time.time()
            )
            steps = call.request.segment.steps
            if ran is not None and steps:
                steps = (*steps[:-1], dataclasses.replace(steps[-1], arguments=dict(ran)))
            await self._leash.label_verdict(steps, verdict.accepted_steps, provenance=provenance)


_ON_ERROR = ReviewerKind.ON_ERROR.chain  # a verdict the gate gave for a reviewer that gave none


def _named(call: GateCall) -> ReviewRequest:
    """The request its reviewer reads, named by the call's id and by who asks: the approval console
    shows the principal, and LEASH labels and distrusts by the client — the session's, else the
    principal's key (a substitute's request, `delegate`'s steps), so one principal's sessions are one client."""
    request, principal = call.request, call.principal
    client = request.client or (principal.key if principal is not None else None)
    return dataclasses.replace(request, call=call.id, principal=principal, client=client)


def _observe(step: Step, result: types.CallToolResult, started: float) -> Step:
    """`step` as it ran: a new step with what `result` says, never an edit of the one held."""
    text = observation_text([block.model_dump(mode="json") for block in result.content])
    return step.observed(text, is_error=bool(result.is_error), duration_s=time.perf_counter() - started)


async def _execute(
    executor: Executor, tool: CatalogTool, arguments: dict[str, Any], step: Step, report: Report | None
) -> Read[types.CallToolResult]:
    """An accepted call run by `executor` (not a backend), returned as `_forward` returns a backend's result."""
    started = time.perf_counter()
    try:
        result = await executor(tool, arguments, report)
    except CALL_FAILED as exc:
        failed = failed_result(tool, exc)
        return Read(_observe(step, failed, started), failed, exc)
    return Read(_observe(step, result, started), result)


__all__ = ["Decided", "Executor", "Held", "WriteStages"]
