"""`python -m bench.tau2_retail.table RUN... [--out FILE]`: the SpecAgent table from runner outputs.

The SpecAgent README reports, per mode: pass@1, and the strong model's decode tokens, the wall
time and the HBM traffic as ratios to strong-only. This module builds that table from one or more
runner `--out` folders (`scripts/gpu-tau2.sh` runs one mode per folder, so that each mode has the
GPU to itself), reading their `results.jsonl` together:

- pass@1 is tau2-bench's pass^1 (with more trials, pass^k beside it), over the runs of a mode;
- strong decode is the mean of the endpoints' own completion-token counts;
- wall is MEASURED when every run had real endpoints (the agent's own turns; the user
  simulator's time is left out) or no run had a cost model, else the runs' modelled wall;
- HBM is always MODELLED (nothing here measures HBM traffic): the run's `--cost-model` applied to
  its token counts, `n/a` where a run had none.

Runs are combined only if they agree on what a ratio needs: the same tasks and trials in every
mode, one cost model, and each mode in one folder only; anything else is refused by name.
`empty()` is the same table with no figures, as docs/BENCHMARKS.md shows it before a GPU run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from bench.tau2_retail import report

MODES = ("weak-only", "strong-only", "spec", "spec+leash")
ROLES = ("weak", "strong", "user")
NOT_RUN = "not yet run on a GPU"
EMPTY = "—"


class RunsDisagree(ValueError):
    """Runner outputs that cannot go in one table (other tasks, trials or cost models, a mode twice)."""


@dataclass(frozen=True)
class Runs:
    """What the folders hold together: every record, the trials, and what the figures are."""

    records: list[dict[str, Any]]
    modes: list[str]
    trials: int
    measured_wall: bool
    cost_model: str | None
    meta: list[dict[str, Any]]


def read(folders: Sequence[Path]) -> Runs:
    """The records of every folder (`results.jsonl`, `summary.json`), checked to belong in one table."""
    records: list[dict[str, Any]] = []
    metas: list[dict[str, Any]] = []
    owner: dict[str, Path] = {}
    for folder in folders:
        try:
            lines = (folder / "results.jsonl").read_text(encoding="utf-8").splitlines()
            meta = json.loads((folder / "summary.json").read_text(encoding="utf-8"))["meta"]
        except FileNotFoundError as exc:
            raise RunsDisagree(f"{folder} is not a finished runner output: {exc.filename} is missing") from None
        mine = [json.loads(line) for line in lines if line.strip()]
        for mode in {str(r["mode"]) for r in mine}:
            if mode in owner:
                raise RunsDisagree(f"mode {mode} is in both {owner[mode]} and {folder}")
            owner[mode] = folder
        records += mine
        metas.append(meta)
    if not records:
        raise RunsDisagree("no task runs in " + ", ".join(map(str, folders)))
    models = {meta.get("cost_model") for meta in metas}
    if len(models) > 1:
        raise RunsDisagree(f"the runs modelled different deployments: {sorted(map(str, models))}")
    modes = [mode for mode in MODES if mode in owner] + sorted(set(owner) - set(MODES))
    covered = {
        mode: sorted({(str(r["task"]), int(r["trial"])) for r in records if r["mode"] == mode}) for mode in modes
    }
    first = modes[0]
    for mode in modes[1:]:
        if covered[mode] != covered[first]:
            raise RunsDisagree(f"{mode} ran other tasks or trials than {first}: a ratio needs the same ones")
    trials = len({trial for _, trial in covered[first]})
    model = models.pop()
    # Without a cost model there is no modelled wall: the measured one is all a run has.
    measured = all(bool(meta.get("real_endpoints")) for meta in metas) or model is None
    return Runs(records, modes, trials, measured, model, metas)


def columns(runs: Runs) -> tuple[report.Column, ...]:
    wall = report.MEASURED_WALL if runs.measured_wall else report.MODELLED[0]
    return ("strong_decode_tokens", "strong decode"), wall, *((report.MODELLED[1],) if runs.cost_model else ())


def header(trials: int, measured_wall: bool = True) -> list[str]:
    wall = "measured" if measured_wall else "modelled"
    return [
        "mode",
        "tasks",
        "pass@1",
        *(f"pass^{k}" for k in range(2, trials + 1)),
        "strong decode vs strong-only",
        f"wall vs strong-only ({wall})",
        "HBM vs strong-only (modelled)",
    ]


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render(runs: Runs) -> str:
    """The table, a line per mode, and a line saying what the figures are."""
    summary = report.summarize(runs.records, runs.modes, runs.trials, columns(runs))
    head = header(runs.trials, runs.measured_wall)
    lines = [_row(head), "|" + "---|" * len(head)]
    for mode, s in summary.items():
        ratios: Mapping[str, float | None] = s["vs_strong_only"] or {}
        wall = "wall_s" if runs.measured_wall else "modelled_wall_s"
        cells = [
            mode,
            str(s["tasks"]),
            f"{100 * s['pass_hat_k'][1]:.1f} %",
            *(f"{100 * s['pass_hat_k'][k]:.1f} %" for k in range(2, runs.trials + 1)),
            *(report._ratio(ratios.get(key)) for key in ("strong_decode_tokens", wall, "hbm_gb")),
        ]
        lines.append(_row(cells))
    lines += ["", what(runs)]
    return "\n".join(lines)


def what(runs: Runs) -> str:
    splits = sorted({str(meta.get("split")) for meta in runs.meta})
    wall = (
        "wall: the agent's measured turns (it moves with the machine's load)"
        if runs.measured_wall
        else "wall: MODELLED"
    )
    hbm = f"HBM: MODELLED by {runs.cost_model}" if runs.cost_model else "HBM: n/a (no cost model)"
    models = sorted({_models(meta) for meta in runs.meta})
    return (
        f"{'; '.join(models)}; split {', '.join(splits)}; trials {runs.trials}; {wall}; {hbm}; "
        "ratios are to strong-only's means"
    )


def _models(meta: Mapping[str, Any]) -> str:
    endpoints = meta.get("endpoints")
    if not endpoints:
        return "scripted models"
    # What each endpoint listed beside the name asked for (served.py); a run from before that, the name only.
    return ", ".join(endpoints[role].get("described") or f"{role} {endpoints[role]['model']}" for role in ROLES)


def empty(modes: Sequence[str] = MODES, trials: int = 1) -> str:
    """The table before any run: its header, a row per mode with no figures, and the note saying so."""
    head = header(trials)
    lines = [_row(head), "|" + "---|" * len(head)]
    lines += [_row([mode, *([EMPTY] * (len(head) - 1))]) for mode in modes]
    return "\n".join([*lines, "", f"({NOT_RUN})"])


@click.command("tau2-table")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="also write it here")
def main(folders: tuple[Path, ...], out: Path | None) -> None:
    """The SpecAgent table (pass@1; strong decode, wall, HBM vs strong-only) of runner outputs FOLDERS."""
    try:
        text = render(read(folders))
    except RunsDisagree as exc:
        raise click.UsageError(str(exc)) from None
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    click.echo(text)


if __name__ == "__main__":
    main()
