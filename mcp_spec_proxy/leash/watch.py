"""The engine's LEASH watch (mode `spec+leash`): route the task, flag a drafted step, observe the rest.

Each method is `advisory`: a LEASH failure is "no evidence", and the engine goes the ordinary way.
"""

from __future__ import annotations

from typing import Any

from mcp_spec_proxy.leash.advisory import Guard, advisory, no, nothing
from mcp_spec_proxy.leash.encoders import HiddenStateEncoder
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.trajectory import Step


class LeashWatch:
    """The engine's `Watch` (mode spec+leash), backed by a `Leash`; each method is `advisory`."""

    def __init__(self, leash: Leash) -> None:
        self.leash = leash
        # Ask the weak model for its hidden states only when the encoder reads them.
        self.wants_hidden = isinstance(leash.encoder, HiddenStateEncoder)

    @property
    def _guard(self) -> Guard:
        return self.leash._guard

    @advisory(no)
    async def route(self, task: str) -> bool:
        score = await self.leash.task_score(task)
        strong = self.leash.at_least(score, self.leash.config.route_threshold)
        await self.leash.telemetry.record("leash", layer="route", strong_led=strong, **score.as_json())
        return strong

    @advisory(no)
    async def drafted(self, step: Step, hidden: Any) -> bool:
        score = await self.leash.step_score(step, hidden)
        flagged = self.leash.at_least(score, self.leash.config.escalate_threshold)
        if flagged:
            await self.leash.telemetry.record("leash", layer="escalate", tool=step.tool, **score.as_json())
        return flagged

    @advisory(no)
    async def unreviewed(self, step: Step, hidden: Any) -> bool:
        score = await self.leash.step_score(step, hidden)
        flagged = self.leash.at_least(score, self.leash.config.observe_threshold)
        await self.leash.telemetry.record("leash", layer="observe", tool=step.tool, flagged=flagged, **score.as_json())
        return flagged

    @advisory(nothing)
    async def verdict(self, steps: tuple[Step, ...], accepted_steps: int) -> None:
        await self.leash.label_verdict(steps, accepted_steps)

    @advisory(nothing)
    async def finished(self, task_id: str, task: str, steps: list[Step]) -> None:
        await self.leash.remember(task_id, task, steps)


__all__ = ["LeashWatch"]
