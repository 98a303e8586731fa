"""The SpecAgent loop: a weak model drafts, reads run live, the strong model verifies a segment.

The baselines are policies of the same loop: `weak-only` (the weak model authors every step)
and `strong-only` (the strong model does). Every call the engine makes goes through the gate
(`calls/gate.py`), which applies each tool's own reviewer whatever the mode: `deny` never runs, `human`
asks (the delegating client's user, else the configured fallback), and a weak-authored write
outside `spec` still meets the strong reviewer. Only an operator's own baseline run (`run`,
benchmarks: `baseline=True`) lets a baseline's steps stand unreviewed where the tool's reviewer
is a model or `allow`. Every model call goes to telemetry with its prefill/cached/decode split;
each task ends with a summary line.

The package, one concept a module:

    loop          one task's run: the draft / verify / commit loop and the baselines' turns
    result        `RunResult`, `Mode`: what a run returns and what it cost
    hooks         `Watch`, `ClientExecutor`, the progress and observer callbacks a run calls out to
    conversation  the messages a run starts from and the user's request the reviewer sees

`Engine` is the door: it checks that the mode has the models it needs and hands the task to `loop`.
"""

from __future__ import annotations

from typing import Any

from mcp_spec_proxy.calls.gate import Gate
from mcp_spec_proxy.config.schema import SpeculationConfig
from mcp_spec_proxy.engine.conversation import AGENT_INSTRUCTIONS
from mcp_spec_proxy.engine.hooks import ClientExecutor, Observer, Progress, Watch
from mcp_spec_proxy.engine.loop import run_task
from mcp_spec_proxy.engine.result import MODES, Mode, RunResult
from mcp_spec_proxy.errors import InvalidArguments
from mcp_spec_proxy.models import ChatModel
from mcp_spec_proxy.observe.telemetry import Telemetry
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.review import UserChannel
from mcp_spec_proxy.review.strong import Repairer, StrongReviewer, Unreadable
from mcp_spec_proxy.tools.catalog import Catalog, ToolSource


class Engine:
    """Runs tasks over the catalog's tools with a weak and a strong model."""

    def __init__(
        self,
        catalog: Catalog,
        gate: Gate,
        telemetry: Telemetry,
        *,
        weak: ChatModel | None,
        strong: ChatModel,
        policy: str = "",
        unreadable: Unreadable = "reject",
        limits: SpeculationConfig | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.watch = watch
        self.catalog = catalog
        self.gate = gate
        self.telemetry = telemetry
        self.weak = weak
        self.strong = strong
        self.policy = policy
        self.unreadable: Unreadable = unreadable
        self.reviewer = StrongReviewer(strong, catalog, policy, unreadable=unreadable)
        self.repairer = Repairer(strong, catalog, policy)
        self.limits = limits or SpeculationConfig()  # the config's `speculation:`

    async def run(
        self,
        task: str | list[dict[str, Any]],
        mode: Mode = "spec",
        *,
        progress: Progress | None = None,
        max_steps: int | None = None,
        tools: ToolSource | None = None,
        client: ClientExecutor | None = None,
        observe: Observer | None = None,
        user: UserChannel | None = None,
        baseline: bool = False,
        principal: Principal | None = None,
    ) -> RunResult:
        """Run one task: a request in words, or a conversation (chat messages) whose last turn asks.

        `tools` replaces the catalog for this run (the gateway's view with the client's own tools);
        `client` executes the tools whose server is the client; `observe` hears of every model
        call and verdict as it happens; `user` is the person a `human` tool asks (else its
        fallback decides); `baseline` marks an operator's baseline run (see the module docstring);
        `principal` is who asked for the run (`delegate`'s caller): its steps meet `rules:` as theirs,
        and their audit lines name them.
        """
        if mode != "strong-only" and self.weak is None:
            raise InvalidArguments(f"mode {mode!r} needs a weak model: configure models.weak")
        if mode == "spec+leash" and self.watch is None:
            raise InvalidArguments("mode 'spec+leash' needs LEASH: add a `leash:` section to the config")
        limits = self.limits if max_steps is None else self.limits.model_copy(update={"max_steps": max_steps})
        return await run_task(
            self,
            task,
            mode,
            progress=progress,
            limits=limits,
            tools=tools or self.catalog,
            client=client,
            observe=observe,
            user=user,
            baseline=baseline,
            principal=principal,
        )


__all__ = ["AGENT_INSTRUCTIONS", "MODES", "ClientExecutor", "Engine", "Mode", "RunResult"]
