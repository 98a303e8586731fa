"""What `python -m bench.engine` prints: the cost model, the tasks, the table, totals and ratios."""

from __future__ import annotations

import argparse
import datetime
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench.cost_model import Cost, CostModel
from bench.engine.runs import Run
from bench.engine.tasks import Task
from bench.measure import machine_line
from mcp_spec_proxy.engine import Mode

COMPARED: tuple[Mode, Mode] = ("spec", "strong-only")
CLAIM = "paper: spec within ~1 point of strong-only success, strong decode <= 0.5x, wall <= 0.55x"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def print_cost_model(model: CostModel) -> None:
    print(f"cost model ({model.source}) — MODELLED, not measured:")
    for name, parameter in model.parameters:
        print(f"  {name:<28} {parameter.value:>12g}   {parameter.why}")
    for cost in (model.weak, model.strong):
        print(
            f"  => {cost.name}: {cost.decode_weight_bytes / 1e9:.1f} GB of weights per decoded token; a prefill pass "
            f"of 1,000 tokens reads {cost.pass_weight_bytes(1000) / 1e9:.1f} GB "
            f"(at least {cost.pass_weight_bytes(1000) / cost.hbm_bytes_per_s * 1000:.1f} ms)"
        )


def print_tasks(task_list: Sequence[Task]) -> None:
    print("\n| task | gold steps | planted weak error | verifier |")
    print("|---|---|---|---|")
    for task in task_list:
        d = task.detour
        calls = len(task.gold) - 1
        error = f"{d.kind} (step {d.at + 1})" if d else "none"
        verifier = "accepts every segment"
        if d:
            verifier = "gives the gold step as replacement" if d.replace else "null replacement → repair turn"
        graded = " (answer graded)" if task.answer_graded else ""
        print(f"| {task.id}{graded} | {calls} tool calls + answer | {error} | {verifier} |")


def row_cells(label: str, mode: str, ok: str, s: dict[str, int], other_s: float, cost: Cost) -> list[str]:
    return [
        label,
        mode,
        ok,
        str(s["strong_calls"]),
        str(s["strong_decode_tokens"]),
        str(s["strong_prefill_tokens"]),
        str(s["strong_cached_tokens"]),
        str(s["weak_prefill_tokens"]),
        str(s["weak_decode_tokens"]),
        f"{other_s:.3f}",
        f"{cost.seconds + other_s:.2f}",
        f"{cost.hbm_bytes / 1e9:.0f}",
    ]


SUMMED = (
    "strong_calls",
    "strong_decode_tokens",
    "strong_prefill_tokens",
    "strong_cached_tokens",
    "weak_prefill_tokens",
    "weak_decode_tokens",
)


@dataclass
class Totals:
    counts: dict[str, int]
    ok: int
    runs: int
    other_s: float
    cost: Cost

    def wall(self) -> float:
        return self.cost.seconds + self.other_s


def totals(runs: list[Run], mode: Mode, model: CostModel) -> Totals:
    mine = [r for r in runs if r.mode == mode]
    counts = {key: sum(int(r.summary[key]) for r in mine) for key in SUMMED}
    cost = sum((r.cost(model) for r in mine), Cost())
    return Totals(counts, sum(r.ok for r in mine), len(mine), sum(r.other_s for r in mine), cost)


def print_table(runs: list[Run], model: CostModel) -> tuple[Totals, Totals]:
    head = (
        "| task | mode | success | strong calls | strong decode | strong prefill (uncached) | strong cached "
        "| weak prefill (uncached) | weak decode | tools+proxy s (measured) | modelled wall s | modelled HBM GB |"
    )
    print("\n" + head)
    print("|" + "---|" * head.count(" | ") + "---|")
    for run in runs:
        if run.mode in COMPARED:
            cells = row_cells(
                run.task.id, run.mode, "yes" if run.ok else "NO", run.summary, run.other_s, run.cost(model)
            )
            print("| " + " | ".join(cells) + " |")
    spec, strong = (totals(runs, mode, model) for mode in COMPARED)
    for mode, t in zip(COMPARED, (spec, strong), strict=True):
        cells = row_cells("**total**", mode, f"{t.ok}/{t.runs}", t.counts, t.other_s, t.cost)
        print("| " + " | ".join(cells) + " |")
    c, d = spec.counts, strong.counts
    cells = [
        "**spec / strong-only**",
        "",
        f"{spec.ok - strong.ok:+d} tasks",
        ratio(c["strong_calls"], d["strong_calls"]),
        f"**{ratio(c['strong_decode_tokens'], d['strong_decode_tokens'])}**",
        f"**{ratio(c['strong_prefill_tokens'], d['strong_prefill_tokens'])}**",
        ratio(c["strong_cached_tokens"], d["strong_cached_tokens"]),
        "",
        "",
        ratio(spec.other_s, strong.other_s),
        f"**{ratio(spec.wall(), strong.wall())}**",
        f"**{ratio(spec.cost.hbm_bytes, strong.cost.hbm_bytes)}**",
    ]
    print("| " + " | ".join(cells) + " |")
    return spec, strong


def print_breakdown(runs: list[Run]) -> None:
    print("\nwhere the modelled seconds go (all tasks; prefill + decode per role and purpose):")
    for mode in COMPARED:
        sums: dict[tuple[str, str], Cost] = defaultdict(Cost)
        calls: dict[tuple[str, str], int] = defaultdict(int)
        for run in (r for r in runs if r.mode == mode):
            for key, cost in run.costs.items():
                sums[key] = sums[key] + cost
            for call in run.result.calls:
                calls[(call.role, call.purpose)] += 1
        other = sum(r.other_s for r in runs if r.mode == mode)
        parts = [
            f"{role} {purpose} x{calls[(role, purpose)]}: {c.prefill_s:.2f} s prefill + {c.decode_s:.2f} s decode"
            for (role, purpose), c in sorted(sums.items())
        ]
        print(f"  {mode:<12} " + "; ".join([*parts, f"tools+proxy {other:.2f} s"]))


def print_sensitivity(runs: list[Run], model: CostModel) -> None:
    print("\nhow the modelled ratios move with the strong model's decode rate (spec / strong-only):")
    for factor in (0.5, 1.0, 2.0):
        strong = replace(model.strong, decode_tps=model.strong.decode_tps * factor)
        varied = replace(model, strong=strong)
        spec, base = (totals(runs, mode, varied) for mode in COMPARED)
        print(
            f"  strong decode {strong.decode_tps:7.0f} tok/s (x{factor:g}): wall {ratio(spec.wall(), base.wall())}, "
            f"HBM {ratio(spec.cost.hbm_bytes, base.cost.hbm_bytes)} "
            f"(strong-only wall {base.wall():.1f} s, spec {spec.wall():.1f} s)"
        )


def report(runs: list[Run], notes: list[str], model: CostModel, args: argparse.Namespace, elapsed: float) -> int:
    task_list = list({r.task.id: r.task for r in runs}.values())
    print(f"date: {datetime.date.today().isoformat()}")
    print(f"machine: {machine_line()}")
    print(f"draft_steps K = {args.draft_steps}, reasoning seed {args.seed}; {elapsed:.0f} s")
    print_cost_model(model)
    print_tasks(task_list)
    spec, strong = print_table(runs, model)
    print_breakdown(runs)
    print_sensitivity(runs, model)
    weak = [r for r in runs if r.mode == "weak-only"]
    print(
        f"\nsuccess: spec {spec.ok}/{spec.runs}, strong-only {strong.ok}/{strong.runs}, "
        f"weak-only {sum(r.ok for r in weak)}/{len(weak)} (the planted errors unreviewed)"
    )
    c, d = spec.counts, strong.counts
    print(
        f"spec / strong-only: strong decode {ratio(c['strong_decode_tokens'], d['strong_decode_tokens'])}, "
        f"strong prefill {ratio(c['strong_prefill_tokens'], d['strong_prefill_tokens'])}, "
        f"modelled wall {ratio(spec.wall(), strong.wall())}, "
        f"modelled HBM {ratio(spec.cost.hbm_bytes, strong.cost.hbm_bytes)}"
    )
    print(f"({CLAIM})")
    if notes:
        # The repair turn's prompt should list the committed history plus the verdict's accepted prefix, once.
        print("\nrepair prompts whose committed steps differ from the run's (their prefill is counted as sent):")
        for note in notes:
            print(f"  {note}")
    return 0 if spec.ok == spec.runs and strong.ok == strong.runs else 1
