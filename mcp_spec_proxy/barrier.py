"""The per-session write barrier: run reads at once, hold writes until a verdict.

`Barrier.call()` is the only path from a client's `tools/call` to a backend:

    look up → validate arguments → read?  forward now, record the step
                                  → write? hold: audit, review (progress while waiting),
                                           audit the verdict (fsynced), forward only if accepted

Promises: no write reaches a backend without an accepting verdict on disk first; a call whose
client goes away while it is held is abandoned and audited as such, never forwarded later; a
reviewer that fails or times out fails closed unless `review.on_error: allow`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT

from mcp_spec_proxy.audit import AuditLog
from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.catalog import Catalog, CatalogTool, digest, strip_intent
from mcp_spec_proxy.config import ProxyConfig, ReviewMode
from mcp_spec_proxy.errors import BackendError, InvalidArguments
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.review import ProposedStep, Repairer, ReviewFailed, check_step, step_json
from mcp_spec_proxy.reviewers import InputNeeded, Reviewer, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.telemetry import Telemetry
from mcp_spec_proxy.trajectory import History, Segment, Step, observation_text

logger = logging.getLogger(__name__)

Report = ProgressFnT
"""Sends a progress notification to the calling client: `await report(progress, total, message)`."""

HEARTBEAT_S = 5.0
LABELLING_REVIEWERS = {"strong", "human", "strong→human"}
"""Verdicts that are judgements (not policy, not LEASH's own) and so label their steps for LEASH."""


@dataclass
class Session:
    """One client session's trajectory."""

    id: str
    history: History = field(default_factory=History)


class Barrier:
    def __init__(
        self,
        config: ProxyConfig,
        catalog: Catalog,
        backends: BackendPool,
        reviewers: dict[ReviewMode, Reviewer],
        audit: AuditLog,
        telemetry: Telemetry | None = None,
        repairer: Repairer | None = None,
        leash: Leash | None = None,
    ) -> None:
        self._config = config
        self._catalog = catalog
        self._backends = backends
        self._reviewers = reviewers
        self._audit = audit
        self._telemetry = telemetry or Telemetry(None)
        self._repairer = repairer
        self._leash = leash

    def new_session(self, session_id: str | None = None) -> Session:
        commit_every = self._config.speculation.draft_steps
        return Session(session_id or uuid.uuid4().hex[:12], History(commit_every=commit_every))

    async def call(
        self,
        session: Session,
        name: str,
        arguments: dict[str, Any],
        user: UserChannel,
        report: Report | None = None,
    ) -> types.CallToolResult:
        tool = self._catalog.lookup(name)  # ToolNotFound is a protocol error, raised to the front
        if tool.reason == "changed-definition":
            # `tools accept` may have run since: a small file, read only for tools under suspicion.
            self._catalog.refresh_fingerprints()
            tool = self._catalog.lookup(name)
        try:
            self._catalog.validate(tool, arguments)
        except InvalidArguments as exc:
            return error_result(str(exc))
        forwarded, intent = strip_intent(tool, arguments)
        if tool.effect == "read":
            step = Step(tool.name, forwarded, "read")
            result = await self.forward(tool, forwarded, step, report)
            session.history.record_read(step)
            return result
        return await self._hold(session, tool, forwarded, intent, user, report)

    async def _hold(
        self,
        session: Session,
        tool: CatalogTool,
        arguments: dict[str, Any],
        intent: str | None,
        user: UserChannel,
        report: Report | None,
    ) -> types.CallToolResult:
        call_id = uuid.uuid4().hex[:12]
        held = Step(tool.name, arguments, "write", intent=intent)
        segment = session.history.segment(held)
        mode: ReviewMode = tool.review or self._config.review.default
        flagged = None
        if mode == "allow" and self._leash is not None:
            # The shadow observer: a write nobody would review that looks like past failures is reviewed.
            score = await self._leash.step_score(held)
            if self._leash.at_least(score, self._leash.config.observe_threshold):
                mode = "strong" if "strong" in self._reviewers else "human"
                flagged = score.as_json()
        reviewer = self._reviewers[mode]
        common = {
            "call": call_id,
            "session": session.id,
            "tool": tool.name,
            "server": tool.server,
            "arguments_digest": digest(arguments),
            "effect": tool.effect,
            "why": tool.why,
            "reviewer": reviewer.name,
        }
        await self._audit.record("held", **common, segment_length=len(segment))
        if flagged is not None:
            await self._audit.record("leash-escalated", call=call_id, session=session.id, to=reviewer.name, **flagged)
        started = time.perf_counter()
        request = ReviewRequest(session.id, tool, arguments, intent, segment, session.history)
        try:
            verdict = await self._review(reviewer, request, user, report)
        except InputNeeded:
            session.history.release(segment)
            await self._audit.record("awaiting-input", **common)
            raise
        except anyio.get_cancelled_exc_class():
            session.history.release(segment)
            with anyio.CancelScope(shield=True):
                await self._audit.record("abandoned", **common, reason="the client cancelled or disconnected")
            raise
        latency_ms = round((time.perf_counter() - started) * 1000, 3)
        await self._audit.record(
            "verdict",
            **common,
            accepted=verdict.accepted,
            reason=verdict.reason,
            accepted_steps=verdict.accepted_steps,
            decided_by=verdict.reviewer,
            latency_ms=latency_ms,
            **({"evidence": verdict.evidence} if verdict.evidence else {}),
        )
        if self._leash is not None and verdict.reviewer in LABELLING_REVIEWERS:
            await self._leash.label_verdict(segment.steps, verdict.accepted_steps)
        model_calls = list(verdict.model_calls)
        if verdict.accepted:
            result = await self.forward(tool, arguments, held, report)
            session.history.settle(segment, len(segment))
            await self._audit.record("forwarded", call=call_id, session=session.id, is_error=bool(result.is_error))
            action = "forwarded"
        else:
            alternative = await self._alternative(tool, request, verdict, model_calls)
            if isinstance(alternative, ProposedStep):
                action = "replaced" if alternative.source == "replacement" else "repaired"
                result = await self._substitute(session, segment, verdict, alternative, common, report)
            else:
                session.history.settle(segment, min(verdict.accepted_steps, len(segment) - 1))
                result = blocked_result(tool, verdict, alternative)
                action = "blocked"
        await self._telemetry.record(
            "decision",
            session=session.id,
            call=call_id,
            tool=tool.name,
            segment=[step_json(step, n) for n, step in enumerate(segment.steps, 1)],
            verdict={
                "accepted": verdict.accepted,
                "reason": verdict.reason,
                "accepted_steps": verdict.accepted_steps,
                "replacement_action": verdict.replacement_action,
                "reviewer": verdict.reviewer,
            },
            action=action,
            review_latency_ms=latency_ms,
            model_calls=[call.as_json() for call in model_calls],
        )
        return result

    async def _alternative(
        self, tool: CatalogTool, request: ReviewRequest, verdict: Verdict, model_calls: list[ModelCall]
    ) -> ProposedStep | str:
        """The step to run instead of a rejected call, or why there is none."""
        on_reject = tool.on_reject or self._config.review.on_reject
        if on_reject == "block":
            return ""
        if verdict.accepted_steps < len(request.segment) - 1:
            return "the first rejected step is an earlier call that already ran, so nothing was run instead"
        checked = check_step(self._catalog, verdict.replacement_action)
        if not isinstance(checked, ProposedStep) and on_reject == "repair" and self._repairer is not None:
            repaired, call = await self._repairer.repair(request, verdict)
            if call is not None:
                model_calls.append(call)
            checked = repaired
        # Answers are the engine's business: at the MCP front there is no answer to give.
        return checked if isinstance(checked, ProposedStep | str) else "the reviewer proposed an answer, not a call"

    async def _substitute(
        self,
        session: Session,
        segment: Segment,
        verdict: Verdict,
        step: ProposedStep,
        common: dict[str, Any],
        report: Report | None,
    ) -> types.CallToolResult:
        """Run the reviewed replacement (or repair) in place of the rejected call."""
        arguments, intent = strip_intent(step.tool, step.arguments)
        executed = Step(step.tool.name, arguments, step.tool.effect, intent=intent)
        # The reviewer's own step needs no second verdict, but it is on disk before it runs.
        await self._audit.record(
            step.source,
            call=common["call"],
            session=session.id,
            tool=step.tool.name,
            server=step.tool.server,
            arguments_digest=digest(arguments),
            effect=step.tool.effect,
        )
        inner = await self.forward(step.tool, arguments, executed, report)
        session.history.settle(segment, verdict.accepted_steps, executed)
        await self._audit.record("forwarded", call=common["call"], session=session.id, is_error=bool(inner.is_error))
        how = "replaced it with" if step.source == "replacement" else "repaired it as"
        note = (
            f"[mcp-spec-proxy] {common['tool']} was rejected by the reviewer ({verdict.reason}); the reviewer "
            f"{how} {step.tool.name} {json.dumps(arguments, ensure_ascii=False)}, which ran. Its result follows."
        )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=note), *inner.content],
            is_error=inner.is_error,
            structured_content=inner.structured_content if step.tool.name == common["tool"] else None,
        )

    async def _review(
        self, reviewer: Reviewer, request: ReviewRequest, user: UserChannel, report: Report | None
    ) -> Verdict:
        held = len(request.segment)
        calls: tuple[ModelCall, ...] = ()
        try:
            with anyio.fail_after(self._config.review.timeout):
                if report is None:
                    return await reviewer.review(request, user)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_heartbeat, report, f"held for review ({reviewer.name})")
                    verdict = await reviewer.review(request, user)
                    tg.cancel_scope.cancel()
                return verdict
        except TimeoutError:
            problem = f"review by {reviewer.name} timed out after {self._config.review.timeout:g}s"
        except InputNeeded:
            raise
        except ReviewFailed as exc:
            problem, calls = f"review by {reviewer.name} failed: {exc}", exc.calls
        except Exception as exc:  # boundary: a reviewer failure must become a verdict, never a forward
            logger.exception("reviewer %s failed", reviewer.name)
            problem = f"review by {reviewer.name} failed: {type(exc).__name__}: {exc}"
        if self._config.review.on_error == "allow":
            reason = f"{problem}; allowed because review.on_error is allow"
            return Verdict(True, reason, held, reviewer="on_error", model_calls=calls)
        return Verdict(False, f"{problem}; failing closed", held - 1, reviewer="on_error", model_calls=calls)

    async def forward(
        self, tool: CatalogTool, arguments: dict[str, Any], step: Step, report: Report | None
    ) -> types.CallToolResult:
        started = time.perf_counter()
        try:
            backend = self._backends.get(tool.server)
            result = await backend.call_tool(tool.original, arguments, report)
        except BackendError as exc:
            result = error_result(str(exc))
        step.duration_s = time.perf_counter() - started
        step.is_error = bool(result.is_error)
        step.observation = observation_text([block.model_dump(mode="json") for block in result.content])
        return result


async def _heartbeat(report: Report, message: str) -> None:
    started = time.monotonic()
    tick = 0
    while True:
        waited = time.monotonic() - started
        await report(float(tick), None, f"{message}: waiting {waited:.0f}s")
        tick += 1
        await anyio.sleep(HEARTBEAT_S)


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def blocked_result(tool: CatalogTool, verdict: Verdict, why_not_replaced: str = "") -> types.CallToolResult:
    text = f"Blocked at the write barrier: {tool.name} was not executed. Reviewer {verdict.reviewer}: {verdict.reason}"
    if verdict.replacement_action:
        text += "\nSuggested instead: " + json.dumps(verdict.replacement_action, ensure_ascii=False)
    if why_not_replaced:
        text += f"\n(Nothing was run in its place: {why_not_replaced}.)"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=True,
        structured_content=None,
    )
