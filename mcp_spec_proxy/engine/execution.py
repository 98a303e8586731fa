"""One engine run's state, and how its steps run: through the gate, audited and logged.

`RunState` holds what a run keeps (its history, the one owner of its steps; its counters; its
watch) and runs a step the only way any step runs: through the gate (`execute`, `hold`), a read at
once, a write under its tool's policy, each returning the step as it ran (a new value, with its
observation or its refusal). The loop itself (draft → hold → verify → commit → repair) is
`engine/loop.py`; what a model call and a verdict cost goes to the result and telemetry here.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types

from mcp_spec_proxy.calls.gate import GateCall
from mcp_spec_proxy.calls.results import Author, Report, blocked_result, capped, text_result
from mcp_spec_proxy.config.schema import SpeculationConfig
from mcp_spec_proxy.engine.conversation import conversation, user_request
from mcp_spec_proxy.engine.hooks import ClientExecutor, NoUser, Observer, Progress, Watch
from mcp_spec_proxy.engine.result import Mode, RunResult, Status
from mcp_spec_proxy.errors import ToolNotFound
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.prompts import openai_tool
from mcp_spec_proxy.review import ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.strong import ProposedStep, Repairer, StrongReviewer
from mcp_spec_proxy.tools.catalog import CLIENT, CatalogTool, ToolSource, is_held, strip_intent
from mcp_spec_proxy.trajectory import History, Segment, Step

if TYPE_CHECKING:
    from mcp_spec_proxy.engine import Engine


class Stop(Exception):
    """How a run ended early (a limit, a model's failure): caught by the loop, never raised past it."""

    def __init__(self, status: Status, error: str | None = None) -> None:
        super().__init__(status)
        self.status: Status = status
        self.error = error


class RunState:
    """One task's state (its history, its counters) and how its steps run."""

    def __init__(
        self,
        engine: Engine,
        task: str | list[dict[str, Any]],
        mode: Mode,
        progress: Progress | None,
        limits: SpeculationConfig,
        source: ToolSource,
        client: ClientExecutor | None,
    ) -> None:
        self.engine = engine
        self.limits = limits
        self.conversation = conversation(task)
        self.task = task if isinstance(task, str) else user_request(self.conversation)
        self.mode = mode
        self.progress = progress
        self.source = source
        self.client = client
        if source is engine.catalog:
            self.reviewer, self.repairer = engine.reviewer, engine.repairer
        else:
            self.reviewer = StrongReviewer(engine.strong, source, engine.policy, unreadable=engine.unreadable)
            self.repairer = Repairer(engine.strong, source, engine.policy)
        self.observe: Observer | None = None
        self.user: UserChannel = NoUser()
        self.baseline: str | None = None
        self.principal: Principal | None = None  # who asked for the run: rules read it, the audit names it
        self.watch: Watch | None = None
        self.strong_led = False
        self.history = History(commit_every=None)  # the engine decides its commit points (`History.commit`)
        # Drafts that ran nothing (no such tool, refused arguments, no action): never accepted.
        self.failures: list[Step] = []
        self.unrun: str | None = None  # calls of the last turn that did not run: the next draft hears of them
        self.result = RunResult(uuid.uuid4().hex[:12], mode, "max_steps", None, [])
        # A held tool runs for no one (the gate refuses it): the weak and strong models are not offered it.
        offered = sorted((t for t in source.tools() if not is_held(t)), key=lambda t: t.name)
        self.tools = [openai_tool(t, with_intent=False) for t in offered]

    def failure(self, step: Step) -> bool:
        return any(step is failure for failure in self.failures)

    def lookup(self, name: str) -> CatalogTool | None:
        try:
            return self.source.lookup(name)
        except ToolNotFound:
            return None

    def step_for(self, proposal: ProposedStep) -> Step:
        """The proposed call as a step; its effect is the call's, which a rule of `rules:` may make a write."""
        arguments, _ = strip_intent(proposal.tool, proposal.arguments)
        tool, _ = self.engine.gate.policy.decide(proposal.tool, arguments, self.principal, self.result.task_id)
        return Step(tool.name, arguments, tool.effect)

    # -- execution, audit, telemetry ---------------------------------------------------------

    async def hold(
        self,
        tool: CatalogTool,
        step: Step,
        author: Author,
        request: ReviewRequest,
        *,
        flagged: bool = False,
        verified: bool = False,
    ) -> tuple[Verdict, Step | None]:
        """A call through the gate, verified as its tool's policy asks, and its step as it ran
        (observed), or None when it did not run."""
        call = GateCall(
            self.result.task_id,
            tool,
            step.arguments,
            author,
            request,
            baseline=self.baseline,
            flagged=flagged,
            principal=self.principal,
        )
        executor = self.run_client if tool.server == CLIENT else None
        if executor is not None and self.client is None:
            raise Stop("model_error", f"{tool.name} is a client tool but no client can run it")

        async def decided(verdict: Verdict) -> None:
            # Heard as the gate decides, not when the call returns: a gateway client runs its own
            # tool only at its next request, and the verdict (and what it cost) is this request's.
            await self.log_verdict(step, verdict)

        outcome = await self.engine.gate.write(
            call, self.user, strong=self.reviewer, verified=verified, executor=executor, step=step, decided=decided
        )
        if outcome.result is None:
            return outcome.verdict, None
        return outcome.verdict, outcome.step or step

    async def execute_all(self, steps: list[Step], author: Author) -> list[Step]:
        """The reads of one turn, run concurrently; each as it ran (a failed draft as it was)."""
        ran = list(steps)

        async def one(n: int, step: Step) -> None:
            ran[n] = await self.execute(step, author, [])

        async with anyio.create_task_group() as tg:
            for n, step in enumerate(steps):
                if step.observation is None:
                    tg.start_soon(one, n, step)
        return ran

    async def execute(self, step: Step, author: Author, prefix: list[Step]) -> Step:
        """Run a step now, through the gate (a read at once, a write under its tool's policy): the
        step as it ran, or with its refusal as its observation, so the model that made it sees why."""
        looked_up = self.source.lookup(step.tool)
        tool, rule = self.engine.gate.policy.decide(looked_up, step.arguments, self.principal, self.result.task_id)
        if tool.effect == "read":
            if tool.server == CLIENT:
                result = await self.run_client(tool, step.arguments, None)
                return step.observed(str(getattr(result.content[0], "text", "")), is_error=bool(result.is_error))
            # A failed read's step observed the failure: the model reads it there.
            read = await self.engine.gate.read(
                self.result.task_id, tool, step.arguments, step, author, None, rule=rule, principal=self.principal
            )
            return read.step
        segment = Segment((*prefix, step))
        request = ReviewRequest(
            self.result.task_id, tool, step.arguments, None, segment, self.history.before(), self.task
        )
        verdict, ran = await self.hold(tool, step, author, request)
        if verdict.model_calls:
            await self.say(f"{step.tool}: {verdict.reviewer} {'accepted' if verdict.accepted else 'refused'} it")
        if ran is not None:
            return ran
        refusal = blocked_result(tool, verdict)
        return step.observed(str(getattr(refusal.content[0], "text", "")), is_error=True)

    async def run_client(
        self, tool: CatalogTool, arguments: dict[str, Any], report: Report | None
    ) -> types.CallToolResult:
        """A client tool (the gateway's): handed to the client, its answer awaited."""
        if self.client is None:
            raise Stop("model_error", f"{tool.name} is a client tool but no client can run it")
        observation, is_error = await self.client.call(Step(tool.name, arguments, tool.effect))
        return text_result(observation, is_error)

    async def log_verdict(self, held: Step, verdict: Verdict) -> None:
        """A verdict's model calls to the result and telemetry, and the verdict to the observer."""
        self.result.calls.extend(verdict.model_calls)
        await self.log_calls(verdict.model_calls)
        if self.observe is not None:
            self.observe(
                "verdict",
                {
                    "accepted": verdict.accepted,
                    "accepted_steps": verdict.accepted_steps,
                    "reason": capped(verdict.reason),
                    "replacement_action": verdict.replacement_action,
                    "held": held.tool,
                    "reviewer": verdict.reviewer,
                },
            )

    async def log_calls(self, calls: tuple[ModelCall, ...] | list[ModelCall]) -> None:
        for call in calls:
            if self.observe is not None:
                self.observe("model_call", call.as_json())
            await self.engine.telemetry.record(
                "model_call",
                task=self.result.task_id,
                mode=self.mode,
                **call.as_json(),
                prefill_tokens=call.prompt_tokens - call.cached_tokens,
                decode_tokens=call.completion_tokens,
            )

    async def say(self, message: str) -> None:
        if self.progress is not None:
            await self.progress(message)
