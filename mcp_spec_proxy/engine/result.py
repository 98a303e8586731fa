"""What a run returns: its mode, how it ended, the steps that ran, and the cost of getting there.

`RunResult.summary()` is the task line telemetry records and the benchmarks aggregate (prefill,
cached and decode tokens per model role); `trace()` is the account a person reads.

Acceptance is the share of judged steps that were accepted, and nothing else: `judged` counts
the steps a reviewer's verdict decided (not a policy's refusal, not a failed review), `accepted`
those of them in the accepted prefix, and a failed draft — a call to no tool, arguments its tool
refuses, a reply that is no action — is a failure (`failed`) whatever a verdict on its segment
says, since it ran nothing. Reads that commit as a chunk of K without review are drafted but
never judged, so they count in neither. `dropped` counts the calls of a turn that did not run:
past the segment's K steps, or after the write that ended the draft.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.trajectory import Step

Mode = Literal["spec", "weak-only", "strong-only", "spec+leash"]
MODES: tuple[Mode, ...] = ("spec", "weak-only", "strong-only", "spec+leash")
Status = Literal["answered", "max_steps", "max_segments", "timeout", "model_error"]


@dataclass
class RunResult:
    task_id: str
    mode: Mode
    status: Status
    answer: str | None
    steps: list[Step]
    segments: int = 0
    drafted: int = 0
    judged: int = 0
    accepted: int = 0
    failed: int = 0
    dropped: int = 0
    repairs: int = 0
    replacements: int = 0
    calls: list[ModelCall] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        strong = [c for c in self.calls if c.role == "strong"]
        weak = [c for c in self.calls if c.role == "weak"]
        return {
            "task": self.task_id,
            "mode": self.mode,
            "status": self.status,
            "steps": len(self.steps),
            "segments": self.segments,
            "drafted_steps": self.drafted,
            "judged_steps": self.judged,
            "failed_steps": self.failed,
            "accepted_steps": self.accepted,
            "acceptance": self.acceptance(),
            "dropped_calls": self.dropped,
            "replacements": self.replacements,
            "repairs": self.repairs,
            "strong_calls": len(strong),
            "strong_prefill_tokens": sum(c.prompt_tokens - c.cached_tokens for c in strong),
            "strong_cached_tokens": sum(c.cached_tokens for c in strong),
            "strong_decode_tokens": sum(c.completion_tokens for c in strong),
            "weak_calls": len(weak),
            "weak_prefill_tokens": sum(c.prompt_tokens - c.cached_tokens for c in weak),
            "weak_decode_tokens": sum(c.completion_tokens for c in weak),
            "wall_s": round(self.wall_s, 4),
        }

    def acceptance(self) -> float | None:
        """Accepted of judged steps, failed drafts counted as judged and failed; None when none were."""
        return acceptance(self.accepted, self.judged, self.failed)

    def trace(self) -> str:
        """A compact, human-readable account of what ran."""
        lines = [
            f"{n}. {step.tool} {json.dumps(step.arguments, ensure_ascii=False)[:120]}"
            + (" [error]" if step.is_error else "")
            for n, step in enumerate(self.steps, 1)
        ]
        s = self.summary()
        lines.append(
            f"status {self.status}; {s['steps']} steps, {s['segments']} verified segments, "
            f"{s['strong_calls']} strong calls, {s['weak_calls']} weak calls; task id {self.task_id}"
        )
        return "\n".join(lines)


def acceptance(accepted: int, judged: int, failed: int) -> float | None:
    """The acceptance rate of these counts (the benchmarks sum them over runs first)."""
    total = judged + failed
    return round(accepted / total, 4) if total else None
