"""What a run leaves in `--out`: results.jsonl in order, summary.md (also printed), summary.json, plots."""

from __future__ import annotations

import datetime
import json
from typing import Any

from bench.measure import machine_line
from bench.tau2_retail import report
from bench.tau2_retail.db import tools_spec
from bench.tau2_retail.params import ENDPOINT_SECTIONS, lines
from bench.tau2_retail.settings import LEASH_MODE, Settings

DEFAULT_COST = "bench/cost_model.toml"  # the source `bench.cost_model.load()` names for its defaults
# The ratios the verdict line quotes, in its order, where the run has them.
VERDICT_RATIOS = (
    ("strong_decode_tokens", "strong decode"),
    ("strong_prefill_tokens", "strong prefill"),
    ("wall_s", "measured wall"),
    ("modelled_wall_s", "modelled wall"),
    ("hbm_gb", "modelled HBM"),
)
CLAIM = "paper: spec within ~1 point of strong-only success, strong decode <= 0.5x, modelled wall <= 0.55x"


def header(settings: Settings, command: str, elapsed: float, tokenizer: str) -> list[str]:
    source = "scripted models (agents.py)"
    if settings.endpoints is not None:
        source = "the endpoints named (what each one lists: below)"
    out = [
        f"command: {command}",
        f"date: {datetime.date.today().isoformat()}; machine: {machine_line()}; {elapsed:.0f} s",
        f"models: {source}; tokens: {tokenizer}",
        f"data: {settings.data} (tools' spec: {tools_spec(settings.data)})",
        f"tasks: {len(settings.tasks)} ({_split(settings)}; ids {', '.join(str(t['id']) for t in settings.tasks[:12])}"
        + (" ..." if len(settings.tasks) > 12 else "")
        + f"); modes {', '.join(settings.modes)}; trials {settings.trials}; seed {settings.seed}",
        _task_line(settings)
        + f"; reward = tau2's DB check (NL assertions have no judge here: {_unjudged(settings)} tasks leave "
        "NL_ASSERTION out of the reward)",
        _cost_line(settings),
    ]
    if LEASH_MODE in settings.modes:
        tasks, steps = settings.leash_start
        hidden = settings.endpoints is not None and settings.endpoints.leash_encoder == "hidden"
        encoder = "the weak model's hidden states" if hidden else "hashing encoder"
        out.append(
            f"LEASH banks: {settings.leash_dir} ({encoder}; held {tasks} task and {steps} step labels at the "
            "start; labelled from verdicts as tasks ran and from each run's scored outcome)"
        )
    return out


def _cost_line(settings: Settings) -> str:
    real = settings.endpoints is not None
    measured = "wall s (measured) = the agent's own turns, timed on this run (the user simulator's left out)"
    if settings.cost is None:
        whose = measured if real else "wall s (measured) is the scripted stack's, not a model's"
        return f"cost model: none (--cost-model none): nothing modelled; {whose}"
    line = (
        f"cost model: {settings.cost.source} (MODELLED, not measured; {settings.cost.weak.name}; "
        f"{settings.cost.strong.name}); modelled wall = modelled model time + measured non-model time (tools, "
        "proxy, engine)"
    )
    if real:
        line += f"; applied to the endpoints' own token counts; {measured}"
        if settings.cost.source == DEFAULT_COST:
            line += (
                "; the DEFAULT cost model is the SpecAgent paper's hypothetical H20 deployment, not the one that "
                "ran: pass --cost-model FILE for your own (or none)"
            )
    return line


def _task_line(settings: Settings) -> str:
    endpoints = settings.endpoints
    if endpoints is None:
        return "the engine's task text (the first user message) is the task's user instruction" + (
            " plus its known_info" if settings.params.run.task_text == "instruction+known_info" else ""
        )
    user = endpoints.user or endpoints.strong
    return (
        f"weak {endpoints.weak.model} at {endpoints.weak.base_url}, strong {endpoints.strong.model} at "
        f"{endpoints.strong.base_url}; an LLM user simulator ({user.model} at {user.base_url}) holds the task's "
        f"user_scenario and talks with the agent until it says ###STOP### or {settings.max_turns} agent turns "
        "(tau2-bench's loop); the agent sees only the conversation"
        + (" and the retail policy" if settings.agent_policy else "")
        + ", never the scenario or the gold actions; what the endpoints list (their /models): "
        + "; ".join(served.describe(role) for role, served in settings.served.items())
    )


def _split(settings: Settings) -> str:
    if settings.split == "--tasks":
        return "named by --tasks"
    return f"the {settings.split} split" if settings.split != "all" else "every split"


def _unjudged(settings: Settings) -> int:
    return sum(bool(task["evaluation_criteria"].get("nl_assertions")) for task in settings.tasks)


def verdict_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    spec, base = summary.get("spec"), summary.get("strong-only")
    if spec is None or base is None:
        return []
    r = spec["vs_strong_only"]
    named = {key: title for key, title in VERDICT_RATIOS}
    parts = [f"{named[key]} {report._ratio(value)}" for key, value in r.items() if key in named]
    return [f"spec / strong-only: pass rate {r['pass_rate_points']:+.1f} points, " + ", ".join(parts), f"({CLAIM})"]


def parameter_lines(settings: Settings) -> list[str]:
    """The parameters in force; with endpoints, only those a run with endpoints uses (not the scripted agents')."""
    if settings.endpoints is None:
        return ["parameters (bench.toml, with --params over it):", *(f"  {line}" for line in lines(settings.params))]
    used = lines(settings.params, sections=ENDPOINT_SECTIONS)
    return [
        "parameters (bench.toml, with --params over it; the scripted agents' error rates, verifier recall and "
        "lengths are not used with endpoints, and not shown):",
        *(f"  {line}" for line in used),
    ]


def _endpoints(settings: Settings) -> dict[str, dict[str, Any]] | None:
    endpoints = settings.endpoints
    if endpoints is None:
        return None
    user = endpoints.user or endpoints.strong
    roles = {"weak": endpoints.weak, "strong": endpoints.strong, "user": user}
    described: dict[str, dict[str, Any]] = {}
    for role, config in roles.items():
        served = settings.served.get(role)
        described[role] = {"model": config.model, "base_url": config.base_url}
        if served is not None:
            described[role].update(listed=list(served.listed), described=served.describe(role))
    return described


def write_outputs(
    settings: Settings, records: list[dict[str, Any]], command: str, elapsed: float, tokenizer: str
) -> str:
    ordered = report.order(records, list(settings.modes), [str(t["id"]) for t in settings.tasks])
    with (settings.out / "results.jsonl").open("w", encoding="utf-8") as handle:
        for line in ordered:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    means = settings.columns
    summary = report.summarize(ordered, settings.modes, settings.trials, means)
    agents = "endpoints" if settings.endpoints is not None else "scripted agents"
    plots = report.plot(summary, settings.out, means=means, agents=agents)
    text = "\n".join(
        [
            *header(settings, command, elapsed, tokenizer),
            "",
            *parameter_lines(settings),
            "",
            "per task run (means over all runs of a mode):",
            "",
            report.tables(summary, settings.trials, means),
            "",
            report.details(summary),
            "",
            *verdict_lines(summary),
            "",
            "plots: " + ", ".join(path.name for path in plots),
        ]
    )
    (settings.out / "summary.md").write_text(text + "\n", encoding="utf-8")
    meta = {
        "command": command,
        "elapsed_s": round(elapsed, 1),
        "tokenizer": tokenizer,
        "machine": machine_line(),
        "split": settings.split,
        "cost_model": settings.cost.source if settings.cost is not None else None,
        "real_endpoints": settings.endpoints is not None,
        "endpoints": _endpoints(settings),
        "columns": [list(column) for column in means],
    }
    payload = {"meta": meta, "params": settings.params.model_dump(mode="json"), "modes": summary}
    (settings.out / "summary.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return text
