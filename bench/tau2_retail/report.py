"""The retail benchmark's summary: pass^k, per-mode means and ratios to strong-only, tables and plots.

`summarize(records, modes, trials)` turns the per-run records (one JSON object per task run, as
`records.record` builds them) into one dict per mode; `markdown(...)` renders it; `plot(...)` draws
success against strong-model tokens and against modelled wall time (PNG, matplotlib's Agg
backend). pass^k is tau2-bench's: the chance that all k of k i.i.d. trials of a task succeed,
estimated per task as C(c, k) / C(n, k) from c successes in n trials, averaged over tasks.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mcp_spec_proxy.engine.result import acceptance

BASELINE = "strong-only"
Column = tuple[str, str]  # a per-run quantity averaged per mode, and its column title
TOKENS: tuple[Column, ...] = (
    ("strong_calls", "strong calls"),
    ("strong_decode_tokens", "strong decode"),
    ("strong_prefill_tokens", "strong prefill (uncached)"),
    ("strong_cached_tokens", "strong cached"),
    ("weak_calls", "weak calls"),
    ("weak_decode_tokens", "weak decode"),
    ("weak_prefill_tokens", "weak prefill (uncached)"),
)
MEASURED_WALL: Column = ("wall_s", "wall s (measured)")
MODELLED: tuple[Column, ...] = (("modelled_wall_s", "modelled wall s"), ("hbm_gb", "modelled HBM GB"))
# The scripted run's columns: its only honest time is the modelled one (its measured wall is the
# scripted server's, not a model's).
MEANS: tuple[Column, ...] = (*TOKENS, *MODELLED)
SUCCESS = 1.0


def columns(*, measured: bool, modelled: bool) -> tuple[Column, ...]:
    """The columns of a run: real endpoints add the measured wall; a run without a cost model has no modelled ones."""
    return (*TOKENS, *((MEASURED_WALL,) if measured else ()), *(MODELLED if modelled else ()))


def ratio_columns(means: Sequence[Column]) -> tuple[Column, ...]:
    """Those with a ratio to strong-only (it makes no weak call, so the weak columns have none)."""
    return tuple((key, title) for key, title in means if not key.startswith("weak_"))


def pass_hat_k(outcomes: Mapping[str, Sequence[bool]], k: int) -> float:
    """tau2-bench's pass^k over tasks: mean of C(c, k) / C(n, k); tasks with fewer than k trials are left out."""
    terms = [math.comb(sum(trials), k) / math.comb(len(trials), k) for trials in outcomes.values() if len(trials) >= k]
    return sum(terms) / len(terms) if terms else float("nan")


def summarize(
    records: Sequence[Mapping[str, Any]], modes: Sequence[str], trials: int, means: Sequence[Column] = MEANS
) -> dict[str, dict[str, Any]]:
    """Per mode: runs, pass rate, pass^k (k = 1..trials), per-run `means`, totals, counts, ratios to strong-only."""
    out: dict[str, dict[str, Any]] = {}
    for mode in modes:
        mine = [r for r in records if r["mode"] == mode]
        if not mine:
            continue
        outcomes: dict[str, list[bool]] = defaultdict(list)
        for r in mine:
            outcomes[str(r["task"])].append(float(r["reward"]) >= SUCCESS)
        n = len(mine)
        rate = sum(float(r["reward"]) >= SUCCESS for r in mine) / n
        averages = {key: sum(float(r[key]) for r in mine) / n for key, _ in means}
        totals = {key: sum(float(r[key]) for r in mine) for key, _ in means}
        seconds: defaultdict[str, float] = defaultdict(float)
        events: Counter[str] = Counter()
        purposes: Counter[str] = Counter()
        for r in mine:
            for key, value in r["modelled_s_by_call"].items():
                seconds[key] += float(value)
            events.update(r["events"])
            purposes.update(r["strong_calls_by_purpose"])
        seconds["tools+proxy (measured)"] = sum(float(r["other_s"]) for r in mine)
        out[mode] = {
            "runs": n,
            "tasks": len(outcomes),
            "pass_rate": rate,
            "pass_rate_se": math.sqrt(rate * (1 - rate) / n),
            "pass_hat_k": {k: pass_hat_k(outcomes, k) for k in range(1, trials + 1)},
            "means": averages,
            "totals": totals,
            "status": dict(Counter(str(r["status"]) for r in mine)),
            "strong_calls_by_purpose": dict(purposes),
            "drafted_steps": sum(int(r["drafted_steps"]) for r in mine),
            # Records written before the judged/failed split lack these: they read as 0.
            "judged_steps": sum(int(r.get("judged_steps", 0)) for r in mine),
            "failed_steps": sum(int(r.get("failed_steps", 0)) for r in mine),
            "accepted_steps": sum(int(r["accepted_steps"]) for r in mine),
            "dropped_calls": sum(int(r.get("dropped_calls", 0)) for r in mine),
            "replacements": sum(int(r["replacements"]) for r in mine),
            "repairs": sum(int(r["repairs"]) for r in mine),
            "strong_led": sum(bool(r.get("strong_led")) for r in mine),
            "modelled_seconds": {key: round(value, 3) for key, value in sorted(seconds.items())},
            "events": dict(sorted(events.items())),
        }
    base = out.get(BASELINE)
    for summary in out.values():
        summary["vs_strong_only"] = ratios(summary, base, ratio_columns(means)) if base is not None else None
    return out


def ratios(summary: Mapping[str, Any], base: Mapping[str, Any], of: Sequence[Column]) -> dict[str, float | None]:
    result: dict[str, float | None] = {"pass_rate_points": 100 * (summary["pass_rate"] - base["pass_rate"])}
    for key, _ in of:
        denominator = base["means"][key]
        result[key] = summary["means"][key] / denominator if denominator else None
    return result


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


def tables(summary: Mapping[str, Mapping[str, Any]], trials: int, means: Sequence[Column] = MEANS) -> str:
    """The two markdown tables: per-run means by mode, then each as a ratio to strong-only."""
    ks = list(range(1, trials + 1))
    head = ["mode", "runs", "pass rate", *(f"pass^{k}" for k in ks), *(title for _, title in means)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, s in summary.items():
        cells = [
            mode,
            str(s["runs"]),
            f"{100 * s['pass_rate']:.1f} % ± {100 * s['pass_rate_se']:.1f}",
            *(f"{s['pass_hat_k'][k]:.3f}" for k in ks),
            *(_number(s["means"][key]) for key, _ in means),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if not any(s["vs_strong_only"] for s in summary.values()):
        return "\n".join(lines)
    head = ["mode", "pass rate vs strong-only", *(title for _, title in ratio_columns(means))]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode, s in summary.items():
        r = s["vs_strong_only"]
        cells = [mode, f"{r['pass_rate_points']:+.1f} points", *(_ratio(r[key]) for key, _ in ratio_columns(means))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """Where the modelled seconds go, what the weak model drafted, and what the scripted world did."""
    lines = ["where the modelled seconds go (all runs of a mode; role purpose: prefill + decode s):"]
    for mode, s in summary.items():
        parts = [f"{key} {value:.1f}" for key, value in s["modelled_seconds"].items()]
        lines.append(f"  {mode:<12} " + "; ".join(parts))
    lines.append("what ran (all runs of a mode):")
    for mode, s in summary.items():
        # The engine's own rate: accepted of judged steps, failed drafts judged and failed.
        rate = acceptance(s["accepted_steps"], s["judged_steps"], s["failed_steps"])
        lines.append(
            f"  {mode:<12} status {s['status']}; strong calls by purpose {s['strong_calls_by_purpose']}; "
            f"drafted {s['drafted_steps']}, judged {s['judged_steps']} (failed drafts {s['failed_steps']}), "
            f"accepted {s['accepted_steps']}"
            + (f" ({100 * rate:.1f} % of judged)" if rate is not None else "")
            + (f", dropped calls {s['dropped_calls']}" if s["dropped_calls"] else "")
            + f", replacements {s['replacements']}, repairs {s['repairs']}"
            + (f", LEASH strong-led {s['strong_led']}" if s["strong_led"] else "")
        )
    lines.append("scripted events (all runs of a mode):")
    for mode, s in summary.items():
        lines.append(f"  {mode:<12} " + ", ".join(f"{key} {value}" for key, value in s["events"].items()))
    return "\n".join(lines)


def plot(
    summary: Mapping[str, Mapping[str, Any]],
    out: Path,
    prefix: str = "tau2",
    means: Sequence[Column] = MEANS,
    agents: str = "scripted agents",
) -> list[Path]:
    """Two PNGs: pass rate against mean strong decode tokens, and against mean wall time (measured where
    the run has it, else modelled)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    keys = {key for key, _ in means}
    wall = (
        ("wall_s", "measured wall time per task run, s (mean)")
        if MEASURED_WALL[0] in keys
        else ("modelled_wall_s", "modelled wall time per task run, s (mean)")
    )
    panels = (
        ("strong_decode_tokens", "strong-model decode tokens per task run (mean)", "success-vs-strong-tokens"),
        (*wall, "success-vs-wall"),
    )
    for key, label, name in panels:
        figure, axes = plt.subplots(figsize=(6, 4.2), dpi=120)
        for mode, s in summary.items():
            x, y, err = s["means"][key], 100 * s["pass_rate"], 100 * s["pass_rate_se"]
            axes.errorbar([x], [y], yerr=[err], fmt="o", capsize=4, label=mode)
            axes.annotate(mode, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9)
        axes.set_xlabel(label)
        axes.set_ylabel("pass rate, % (± 1 s.e.)")
        axes.set_title(f"tau2-bench retail, {agents}: success against " + label.split(" per ")[0])
        axes.title.set_fontsize(10)
        widest = max((s["means"][key] for s in summary.values()), default=0.0)
        axes.set_xlim(left=-0.04 * widest if widest > 0 else -1)  # a mode at 0 (weak-only) stays visible
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="lower right")
        figure.tight_layout()
        path = out / f"{prefix}-{name}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def deterministic(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record without its measured times: what a rerun with the same seed must reproduce exactly."""
    measured = {"wall_s", "model_latency_s", "other_s", "modelled_wall_s"}
    return {key: value for key, value in record.items() if key not in measured}


def order(
    records: Iterable[Mapping[str, Any]], modes: Sequence[str], task_ids: Sequence[str]
) -> list[Mapping[str, Any]]:
    """Records in mode, trial, task order (the order they are written in)."""
    position = {task_id: n for n, task_id in enumerate(task_ids)}
    return sorted(records, key=lambda r: (modes.index(r["mode"]), r["trial"], position.get(str(r["task"]), 0)))
