"""One line of results.jsonl: a task run's outcome, tokens, modelled cost and what the scripted models did."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from bench.tau2_retail.scoring import Task
from bench.tau2_retail.settings import Settings
from mcp_spec_proxy.engine import Mode, RunResult

ROUTED = "LEASH routes this task to the strong model"
FLAGGED = "LEASH flags"


def record(
    settings: Settings,
    task: Task,
    mode: Mode,
    trial: int,
    result: RunResult | None,
    *,
    reward: float,
    db_reward: float,
    unjudged: list[str],
    error: str | None,
    events: dict[str, int],
    said: list[str],
) -> dict[str, Any]:
    """One line of results.jsonl."""
    calls = result.calls if result is not None else []
    strong = [c for c in calls if c.role == "strong"]
    weak = [c for c in calls if c.role == "weak"]
    by_call: defaultdict[str, float] = defaultdict(float)
    model_s, hbm = 0.0, 0.0
    model = settings.cost
    costs = [(call, model.cost(call)) for call in calls] if model is not None else []
    for call, cost in costs:
        by_call[f"{call.role} {call.purpose} prefill"] += cost.prefill_s
        by_call[f"{call.role} {call.purpose} decode"] += cost.decode_s
        model_s += cost.seconds
        hbm += cost.hbm_bytes
    wall = result.wall_s if result is not None else 0.0
    latency = sum(c.latency_s for c in calls)
    other = max(wall - latency, 0.0)
    summary = result.summary() if result is not None else {}
    modelled = {
        "modelled_model_s": round(model_s, 4),
        "hbm_gb": round(hbm / 1e9, 3),
        "modelled_s_by_call": {key: round(value, 4) for key, value in sorted(by_call.items())},
    }
    return {
        "mode": mode,
        "trial": trial,
        "task": str(task["id"]),
        "reward": reward,
        "db_reward": db_reward,
        "unjudged": unjudged,
        "status": "error" if error is not None else summary.get("status", "error"),
        "error": error or (result.error if result is not None else None),
        "steps": summary.get("steps", 0),
        "segments": summary.get("segments", 0),
        "drafted_steps": summary.get("drafted_steps", 0),
        "judged_steps": summary.get("judged_steps", 0),
        "failed_steps": summary.get("failed_steps", 0),
        "accepted_steps": summary.get("accepted_steps", 0),
        "dropped_calls": summary.get("dropped_calls", 0),
        "replacements": summary.get("replacements", 0),
        "repairs": summary.get("repairs", 0),
        "strong_calls": len(strong),
        "strong_calls_by_purpose": dict(Counter(c.purpose for c in strong)),
        "strong_prompt_tokens": sum(c.prompt_tokens for c in strong),
        "strong_prefill_tokens": sum(c.prompt_tokens - c.cached_tokens for c in strong),
        "strong_cached_tokens": sum(c.cached_tokens for c in strong),
        "strong_decode_tokens": sum(c.completion_tokens for c in strong),
        "strong_decode_by_purpose": dict(_sum_by_purpose(strong)),
        "weak_calls": len(weak),
        "weak_prompt_tokens": sum(c.prompt_tokens for c in weak),
        "weak_prefill_tokens": sum(c.prompt_tokens - c.cached_tokens for c in weak),
        "weak_cached_tokens": sum(c.cached_tokens for c in weak),
        "weak_decode_tokens": sum(c.completion_tokens for c in weak),
        # Without a cost model (`--cost-model none`) nothing is modelled: the keys are absent, not zero.
        **(modelled if model is not None else {"modelled_s_by_call": {}}),
        "wall_s": round(wall, 4),
        "model_latency_s": round(latency, 4),
        "other_s": round(other, 4),
        **({"modelled_wall_s": round(model_s + other, 4)} if model is not None else {}),
        "strong_led": ROUTED in said,
        "leash_flags": sum(message.startswith(FLAGGED) for message in said),
        "trajectory": [step.tool.removeprefix("retail__") for step in (result.steps if result is not None else [])],
        "events": dict(sorted(events.items())),
    }


def _sum_by_purpose(calls: Sequence[Any]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for call in calls:
        totals[call.purpose] += call.completion_tokens
    return totals
