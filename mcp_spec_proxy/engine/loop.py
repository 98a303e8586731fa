"""One task's run: the SpecAgent loop and its baselines, step by step.

    draft   the weak model drafts up to K steps; reads execute at once (several reads of one
            turn concurrently), so every drafted step is grounded in real observations; the
            first write — or the final answer, when the answer is the graded deliverable — is
            held, not executed. A chunk of K reads commits without review. K bounds the
            segment, not the turn: calls a turn makes past the K-th step, or after the held
            write, do not run, and the model's next draft is told which.
    verify  the strong model, thinking off, reviews the drafted segment in ONE request
            (`review.StrongReviewer`, the same verifier the MCP front uses).
    commit  the longest accepted prefix commits; a valid replacement executes directly;
            otherwise the strong model takes one repair turn, thinking on, and its step commits
            without a second review. The rejected suffix is discarded from the history both
            models see afterwards.

The baselines take the same turns without the verify step: the author model's reads and writes
execute at once (through the gate, like every call). Under `spec+leash` the watch may route the
whole task to the strong model, end a weak draft early at a read that looks like past rejected
steps, or have an unreviewed step reviewed after all. A run ends by answering or at a limit of
`speculation:` (steps, segments, wall time); a model that fails ends it as `model_error`. It
never raises for those: the status says how it ended.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import anyio

from mcp_spec_proxy.actions import ToolCall
from mcp_spec_proxy.calls.results import Author
from mcp_spec_proxy.config.schema import SpeculationConfig
from mcp_spec_proxy.engine.execution import RunState, Stop
from mcp_spec_proxy.engine.hooks import AskNow, ClientExecutor, NoUser, Observer, Progress
from mcp_spec_proxy.engine.result import Mode, RunResult
from mcp_spec_proxy.models import ChatModel, Completion, ModelError
from mcp_spec_proxy.principal import Principal, who
from mcp_spec_proxy.prompts import FINAL_ANSWER, agent_messages
from mcp_spec_proxy.review import ReviewFailed, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.strong import ProposedAnswer, ProposedStep, check_step
from mcp_spec_proxy.tools.catalog import ToolSource, digest
from mcp_spec_proxy.trajectory import DraftState, Segment, Step

if TYPE_CHECKING:
    from mcp_spec_proxy.engine import Engine


async def run_task(
    engine: Engine,
    task: str | list[dict[str, Any]],
    mode: Mode,
    *,
    progress: Progress | None,
    limits: SpeculationConfig,
    tools: ToolSource,
    client: ClientExecutor | None,
    observe: Observer | None,
    user: UserChannel | None,
    baseline: bool,
    principal: Principal | None = None,
) -> RunResult:
    """Run one task to its end under `limits` (`Engine.run` has checked the mode's models), record
    its summary to telemetry and return it; how it ended is the result's status, never an exception."""
    run = _Run(engine, task, mode, progress, limits, tools, client)
    run.observe = observe
    run.user = AskNow(user) if user is not None else NoUser()
    run.baseline = mode if baseline and mode in ("weak-only", "strong-only") else None
    run.principal = principal
    started = time.perf_counter()
    with anyio.move_on_after(limits.max_wall_s) as deadline:
        try:
            if mode == "spec+leash":
                assert engine.watch is not None
                run.watch = engine.watch
                run.strong_led = await engine.watch.route(run.task)
                await run.say("LEASH routes this task to the strong model" if run.strong_led else "weak-led")
            await run.loop()
        except Stop as stop:
            run.result.status = stop.status
            run.result.error = stop.error
    if deadline.cancelled_caught:
        run.result.status = "timeout"
    run.result.wall_s = time.perf_counter() - started
    run.result.steps = list(run.history.committed)
    if run.watch is not None:
        await run.watch.finished(run.result.task_id, run.task, run.result.steps)
    await engine.telemetry.record("task", **run.result.summary(), error=run.result.error)
    return run.result


class _Run(RunState):
    """One task's run: the steps of the loop, over the state and execution of `RunState`."""

    # -- the loop ----------------------------------------------------------------------------

    async def loop(self) -> None:
        limits = self.limits
        while len(self.history.committed) < limits.max_steps:
            if self.mode in ("spec", "spec+leash") and not self.strong_led:
                if self.result.segments >= limits.max_segments:
                    raise Stop("max_segments")
                done = await self.speculate()
            else:
                done = await self.act_directly()
            if done:
                self.result.status = "answered"
                return
        raise Stop("max_steps")

    async def act_directly(self) -> bool:
        """Baselines: the author model's step executes at once, reads and writes alike."""
        strong = self.mode == "strong-only" or self.strong_led
        model = self.engine.strong if strong else self.engine.weak
        assert model is not None
        author: Author = "strong" if strong else "weak"
        reads, write, answer = await self.draft_turn(model, [], thinking=strong)
        for step in [*reads, *([write] if write else [])]:
            if step.observation is None:
                if self.watch is not None and await self.watch.unreviewed(step, None):
                    # The shadow observer: a strong-led step that looks like past failures is reviewed.
                    await self.say(f"LEASH flags {step.tool}: verifying it")
                    if not await self.verify([], step, author, flagged=True):
                        continue
                    return self.result.answer is not None
                step = await self.execute(step, author, [])
            self.history.commit(step)
        if answer is not None:
            self.result.answer = answer
            return True
        return False

    async def speculate(self) -> bool:
        """One segment: draft up to K steps, hold the first write (or graded answer), verify."""
        assert self.engine.weak is not None
        segment: list[Step] = []
        held: Step | None = None
        answer: str | None = None
        while len(segment) < self.limits.draft_steps and held is None:
            room = self.limits.draft_steps - len(segment)
            reads, write, answer = await self.draft_turn(
                self.engine.weak, segment, thinking=False, screen=True, room=room
            )
            segment.extend(reads)
            self.result.drafted += len(reads)
            self.result.failed += sum(self.failure(step) for step in reads)
            if write is not None:
                held = write
            elif answer is not None:
                if self.limits.answer_graded:
                    held = Step(FINAL_ANSWER, {"answer": answer}, "write")
                else:
                    break
        if held is None:
            # A chunk of reads (or reads then an ungraded answer) commits without review: no one
            # judged it, so acceptance does not count it.
            self.history.commit(*segment)
            await self.say(f"committed {len(segment)} reads without review")
            if answer is not None:
                self.result.answer = answer
                return True
            return False
        self.result.drafted += 1
        return await self.verify(segment, held)

    async def verify(self, drafted: list[Step], held: Step, author: Author = "weak", *, flagged: bool = False) -> bool:
        """One verification of a drafted segment: the held write goes to the gate (which asks the
        strong verifier, or the tool's own reviewer), a held graded answer to the verifier."""
        self.result.segments += 1
        segment = Segment((*drafted, held))
        tool = self.lookup(held.tool)
        # The request keeps the history as it was before this verdict: the repair turn adds the
        # accepted prefix itself, so committing it below must not show it twice.
        # The request keeps the history as it was before this verdict: the repair turn adds the
        # accepted prefix itself, so committing it below must not show it twice.
        request = ReviewRequest(
            self.result.task_id, tool, held.arguments, None, segment, self.history.before(), self.task
        )
        if tool is None and held.tool != FINAL_ANSWER:
            # Its backend left between drafting and now: a failed step the model sees, nothing held.
            self.result.failed += 1
            self.history.commit(*drafted, held.observed(f"error: {held.tool} is no longer available", is_error=True))
            return False
        await self.say(f"verifying a segment of {len(segment)} steps")
        # The repair turn's prompt is the verifier's (byte for byte, so the prefix cache serves
        # it): steps are values, so `request` is still the segment as the verifier saw it.
        if tool is None:
            verdict = await self.verify_answer(request)
            ran: Step | None = held
        else:
            verdict, ran = await self.hold(tool, held, author, request, flagged=flagged, verified=True)
        accepted = verdict.accepted_steps
        if verdict.by.judged and not verdict.failed:
            self.tally(segment.steps, accepted)
        self.history.commit(*segment.steps[: min(accepted, len(drafted))])
        if verdict.accepted:
            # Said as the rejection is: a run on a terminal otherwise shows a verdict only when it refuses.
            await self.say("accepted: the answer" if tool is None else f"accepted: {held.tool} ran")
            assert ran is not None
            self.history.commit(ran)  # as it ran: with its observation
            if tool is None:
                self.result.answer = str(held.arguments["answer"])
                return True
            return False
        if verdict.failed:
            # No judgement to answer: the segment stops here, failing closed (a repair answers only
            # a readable rejection; `review.on_error: allow` is how an operator asks otherwise).
            raise Stop(
                "model_error", f"the verification failed, so nothing more of this segment runs: {verdict.reason}"
            )
        await self.say(f"rejected at step {accepted + 1}: {verdict.reason}")
        return await self.substitute(request, verdict)

    def tally(self, steps: tuple[Step, ...], accepted_steps: int) -> None:
        """A judgement's steps to acceptance: its accepted prefix accepted, the rest not. A failed
        draft among them was counted a failure when drafted, whatever the verdict says of it."""
        valid = [not self.failure(step) for step in steps]
        self.result.judged += sum(valid)
        self.result.accepted += sum(valid[: max(0, accepted_steps)])

    async def verify_answer(self, request: ReviewRequest) -> Verdict:
        """The graded final answer: the strong verifier's alone (it reaches no backend)."""
        try:
            verdict = await self.reviewer.review(request, self.user)
        except ReviewFailed as exc:
            self.result.calls.extend(exc.calls)
            await self.log_calls(exc.calls)
            raise Stop("model_error", str(exc)) from None
        await self.log_verdict(request.segment.held, verdict)
        await self.engine.gate.record(
            "verdict",
            session=self.result.task_id,
            tool=FINAL_ANSWER,
            arguments_digest=digest(request.segment.held.arguments),
            author="weak",
            reviewer=self.reviewer.by.text,
            accepted=verdict.accepted,
            accepted_steps=verdict.accepted_steps,
            reason=verdict.reason,
            **who(self.principal),
        )
        if self.watch is not None:
            await self.watch.verdict(request.segment.steps, verdict.accepted_steps)
        return verdict

    async def substitute(self, request: ReviewRequest, verdict: Verdict) -> bool:
        """Run the valid replacement, or else one repair turn; the rest of the segment is gone.
        The substitute goes through the gate under its own tool's policy."""
        proposal = check_step(self.source, verdict.replacement_action, answers=True, task=self.task)
        if isinstance(proposal, str):
            self.result.repairs += 1
            proposal, call = await self.repairer.repair(request, verdict, answers=True)
            if call is not None:
                self.result.calls.append(call)
                await self.log_calls((call,))
            if isinstance(proposal, str):
                raise Stop("model_error", f"repair failed: {proposal}")
        else:
            self.result.replacements += 1
        if isinstance(proposal, ProposedAnswer):
            self.history.commit(Step(FINAL_ANSWER, {"answer": proposal.answer}, "write"))
            self.result.answer = proposal.answer
            return True
        author: Author = "replacement" if proposal.source == "replacement" else "repair"
        # The accepted prefix committed with the verdict (`verify`): it is the history the
        # substitute's review reads, never a segment of its own to be judged and labelled again.
        self.history.commit(await self.execute(self.step_for(proposal), author, []))
        return False

    # -- drafting ----------------------------------------------------------------------------

    async def draft_turn(
        self,
        model: ChatModel,
        segment: list[Step],
        *,
        thinking: bool,
        screen: bool = False,
        room: int | None = None,
    ) -> tuple[list[Step], Step | None, str | None]:
        """One model turn: the reads it made (executed), the first write (not executed), or an answer.

        With `screen` (weak drafts under LEASH), a read that looks like past rejected steps is held
        like a write: the draft ends there and goes to verification. With `room`, the turn takes
        at most that many steps (the held write one of them): the segment's K bounds it.
        """
        messages = agent_messages(self.conversation, [*self.history.committed, *segment])
        if self.unrun is not None:
            # Last in the prompt, and only in this one: the prefix the server caches is unchanged.
            messages.append({"role": "user", "content": self.unrun})
            self.unrun = None
        author: Author = "weak" if model is self.engine.weak else "strong"
        # Only a watch whose encoder reads hidden states says so (`wants_hidden`); the others
        # would pay for vectors they never look at (an extra embeddings request, or a big answer).
        wants_hidden = screen and self.watch is not None and getattr(self.watch, "wants_hidden", False) is True
        try:
            completion = await model.complete(
                messages,
                purpose="draft" if model is self.engine.weak else "answer",
                thinking=thinking,
                tools=self.tools,
                hidden_states=wants_hidden,
            )
        except ModelError as exc:
            if exc.call is not None:
                self.result.calls.append(exc.call)
            raise Stop("model_error", str(exc)) from None
        self.result.calls.append(completion.call)
        await self.log_calls((completion.call,))
        turn = uuid.uuid4().hex[:12]
        if completion.action_error is not None:
            # A JSON action that did not parse: a failed step the model sees, and drafting goes on.
            failed = Step(
                "invalid_action",
                {"raw": completion.content or ""},
                "read",
                observation=f"error: {completion.action_error} — reply with one JSON action",
                is_error=True,
                state=_drafted_state(completion, 0, turn),
            )
            self.failures.append(failed)
            return [failed], None, None
        if not completion.tool_calls:
            return [], None, completion.content or ""
        reads: list[Step] = []
        write: Step | None = None
        taken = 0
        for index, call in enumerate(completion.tool_calls):
            if room is not None and len(reads) >= room:
                break
            taken = index + 1
            # Every drafted step carries its own state, the write and failed calls too: whoever
            # judges the segment labels each of them with it.
            step = dataclasses.replace(
                self.parse_call(call.name, call.arguments), state=_drafted_state(completion, index, turn)
            )
            if step.observation is not None:
                self.failures.append(step)
            risky = (
                screen
                and self.watch is not None
                and step.effect == "read"
                and step.observation is None
                and await self.watch.drafted(step, list(step.state.vector) if step.state else None)
            )
            if step.effect == "read" and not risky:
                reads.append(step)
            else:
                if risky:
                    await self.say(f"LEASH flags {step.tool}: ending the draft for verification")
                write = step  # the first write (or flagged read) ends the turn; later calls are dropped
                break
        self.drop(completion.tool_calls[taken:], ended_by=write, room=room)
        reads = await self.execute_all(reads, author)
        for step in reads:
            await self.say(f"read {step.tool}")
        return reads, write, None

    def drop(self, calls: tuple[ToolCall, ...], *, ended_by: Step | None, room: int | None) -> None:
        """Calls of a turn that will not run: counted, and named to the model in its next draft
        (a model told nothing would take their absence for results it never got)."""
        if not calls:
            return
        self.result.dropped += len(calls)
        why = (
            f"the turn ended at {ended_by.tool}, which is dealt with before any call after it"
            if ended_by is not None
            else f"a draft runs at most {self.limits.draft_steps} steps before they are checked,"
            f" and your turn had room for {room}"
        )
        listed = "; ".join(f"{call.name} {call.arguments[:120]}" for call in calls)
        self.unrun = f"These calls of your last turn did not run: {listed} ({why}). Make those you still need again."

    def parse_call(self, name: str, arguments: str) -> Step:
        """A drafted call as a step; an unknown tool or bad arguments is a failed read the model sees."""
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return Step(
                name, {"raw": arguments}, "read", observation=f"error: arguments are not JSON: {exc}", is_error=True
            )
        checked = check_step(self.source, {"tool": name, "arguments": args}, task=self.task)
        if isinstance(checked, ProposedStep):
            return self.step_for(checked)
        problem = checked if isinstance(checked, str) else "final_answer is not a tool"
        return Step(
            name,
            args if isinstance(args, dict) else {"raw": arguments},
            "read",
            observation=f"error: {problem.replace('the replacement', 'the call')}",
            is_error=True,
        )


def _drafted_state(completion: Completion, index: int, turn: str) -> DraftState | None:
    """The `index`-th call's state of a drafting turn, as the server returned it (`models.call_states`)."""
    if index >= min(len(completion.hidden_states), len(completion.state_kinds)):
        return None
    vector = tuple(completion.hidden_states[index])
    return DraftState(vector, completion.state_kinds[index], turn)
