"""`mcp-spec-proxy bank`: what LEASH's banks hold, importing labelled examples, calibrating thresholds.

Every command here opens LEASH strictly: an operator asked for it, so a LEASH failure is an error,
never a silent fallback. `calibrate` scores held-out steps without importing them, with the runtime's
own representation (`steps.view`) and decision (`calibrate.flags`), so its curve is what the proxy does.
Under the `hidden` encoder neither `import` nor `calibrate` can work (a JSONL example has no hidden state)
and both say so instead of reporting what did not happen.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import file_options, open_configured_leash, run_loop
from mcp_spec_proxy.trajectory import Step

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads when a bank command runs, not with every command
    from mcp_spec_proxy.leash.bank import Label
    from mcp_spec_proxy.leash.layers import Leash, Score


@main.group()
def bank() -> None:
    """LEASH's banks: stats, import, calibrate."""


@bank.command("stats")
@file_options
@click.pass_context
def bank_stats(ctx: click.Context) -> None:
    """Print what each bank holds."""
    leash = open_configured_leash(ctx, strict=True)
    banks = [("task", leash.tasks), ("step", leash.steps)]
    if leash.observed is not None:  # `hidden`: judged steps no weak call drafted, in the fallback's space
        banks.append(("observed", leash.observed))
    for name, store in banks:
        click.echo(f"{name}: " + json.dumps(store.stats(), default=str))


@bank.command("import")
@file_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.pass_context
def bank_import(ctx: click.Context, file: str) -> None:
    """Add labelled examples from a JSONL FILE.

    Each line: {"kind": "task", "text": "...", "label": "success"|"failure"} or
    {"kind": "step", "tool": "...", "arguments": {...}, "label": ...}. An "observation" is read and
    ignored: a step is judged before it runs, so LEASH represents it by its call alone. Refused under
    leash.encoder: hidden, whose vectors only the weak model's drafting calls give. The format, with an
    example: docs/LEASH.md, "Importing labelled examples".
    """
    leash = open_configured_leash(ctx, strict=True)  # a label not stored is an error here
    _refuse_hidden(leash, "import")
    tasks, steps = _examples(Path(file))

    async def add() -> tuple[int, int]:
        stored_tasks = 0
        for text, label in tasks:
            stored_tasks += int(await leash.label_task(text, label == "success", source="import"))
        stored_steps = 0
        if steps:
            stored_steps = await leash.label_steps(
                [s for s, _ in steps], [label for _, label in steps], source="import"
            )
        return stored_tasks, stored_steps

    stored_tasks, stored_steps = run_loop(add)
    # Say what the banks now hold, never what the file held: the two differ when an encoder gives no vector.
    click.echo(f"imported {stored_tasks} tasks and {stored_steps} steps")
    if (stored_tasks, stored_steps) != (len(tasks), len(steps)):
        raise click.ClickException(
            f"{file} holds {len(tasks)} tasks and {len(steps)} steps; the {leash.encoder.info.describe()} gave no"
            " vector for the rest, so they were not stored"
        )


@bank.command("calibrate")
@file_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--target-rate", type=click.FloatRange(0, 1), help="Escalate at most this share of steps.")
@click.option("--target-precision", type=click.FloatRange(0, 1), help="Escalations must be failures this often.")
@click.option(
    "--max-false-accept",
    type=click.FloatRange(0, 1),
    help="For `review: leash`: pick accept_threshold so at most this share of accepted steps failed, and record it.",
)
@click.pass_context
def bank_calibrate(
    ctx: click.Context,
    file: str,
    target_rate: float | None,
    target_precision: float | None,
    max_false_accept: float | None,
) -> None:
    """Pick a step threshold on labelled held-out steps (FILE, as for import, but NOT imported); print the curve.

    With --max-false-accept, pick leash.accept_threshold and write the calibration record
    (`calibration.json` in bank_dir) without which `review: leash` forwards nothing on its own.
    """
    if sum(option is not None for option in (target_rate, target_precision, max_false_accept)) != 1:
        raise click.BadParameter("give one of --target-rate, --target-precision and --max-false-accept")
    leash = open_configured_leash(ctx, strict=True)
    _refuse_hidden(leash, "calibrate")
    _, steps = _examples(Path(file))
    if not steps:
        raise click.ClickException(f"{file}: no step examples to calibrate on")
    failed = [label == "failure" for _, label in steps]

    async def scores() -> list[Score]:
        # The runtime's own score of each step (its observation, if the file gives one, plays no part).
        return [await leash.step_score(step) for step, _ in steps]

    found = run_loop(scores)
    from mcp_spec_proxy.leash.calibrate import curve, pick, table

    if max_false_accept is not None:
        _calibrate_accept(leash, file, found, failed, max_false_accept)
        return
    # Unscored steps stay unscored: the runtime never escalates on no opinion, and neither does the curve.
    points = curve([score.value for score in found], failed)
    click.echo(table(points))
    chosen = pick(points, target_rate=target_rate, target_precision=target_precision)
    click.echo(
        f"\nthreshold {chosen.threshold:.2f}: escalates {chosen.escalation_rate:.1%}, precision"
        f" {chosen.precision:.1%}, recall {chosen.recall:.1%} — set leash.escalate_threshold and"
        " leash.observe_threshold to it"
    )


def _refuse_hidden(leash: Leash, command: str) -> None:
    """The hidden encoder's vectors exist only for steps the weak model drafted here: refuse, in one line."""
    if leash.encoder.info.name == "hidden":
        raise click.ClickException(
            f"bank {command} cannot work under leash.encoder: hidden — its vectors are the weak model's own states,"
            " returned with the drafting calls of its server, and a JSONL example has none; the runtime labels"
            " drafted steps itself (or set leash.encoder to hashing or embedding)"
        )


def _calibrate_accept(leash: Leash, file: str, found: list[Score], failed: list[bool], bound: float) -> None:
    from mcp_spec_proxy.leash.calibrate import MIN_HELD_OUT, Calibration, accept_curve, accept_table, pick_accept

    if leash.encoder.info.name == "hashing":
        raise click.ClickException(
            "the hashing encoder cannot back `review: leash`: set leash.encoder to embedding (or hidden) first"
        )
    if len(found) < MIN_HELD_OUT:
        raise click.ClickException(
            f"{file}: {len(found)} held-out steps say too little about a false-accept rate;"
            f" give at least {MIN_HELD_OUT}"
        )
    # A held-out step whose twin is in the bank scores itself: its figure says nothing about new steps.
    twins = sum(1 for score in found if score.neighbours and score.neighbours[0].score >= 0.9999)
    points = accept_curve([score.value for score in found], failed)
    click.echo(accept_table(points))
    chosen = pick_accept(points, bound)
    if chosen is None:
        raise click.ClickException(
            f"no threshold accepts any held-out step with at most {bound:.1%} false accepts; nothing recorded"
        )
    record = Calibration.measured(
        leash.encoder.info, chosen, failed, max_false_accept=bound, bank_steps=len(leash.steps), source=file
    )
    path = record.save(Path(leash.config.bank_dir))
    if twins:
        click.echo(
            f"\nwarning: {twins} of {len(found)} held-out steps have an identical step in the bank; hold them out"
            " (do not import them) for honest figures",
            err=True,
        )
    click.echo(
        f"\naccept_threshold {chosen.threshold:.2f}: accepts {chosen.accept_rate:.1%} of {len(found)} held-out steps,"
        f" {chosen.false_accepts} of {chosen.accepted} accepted failed ({chosen.false_accept_rate:.1%}) —"
        f" recorded in {path}; set leash.accept_threshold to {chosen.threshold:.2f} or lower"
    )


def _examples(path: Path) -> tuple[list[tuple[str, str]], list[tuple[Step, Label]]]:
    """The labelled tasks and steps in a JSONL file; a bad line is an error naming its file and line."""
    tasks: list[tuple[str, str]] = []
    steps: list[tuple[Step, Label]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.ClickException(f"{path}:{number}: not a JSON object ({exc.msg}) — {IMPORT_FORMAT}") from None
        why = _bad_example(item)
        if why:
            raise click.ClickException(f"{path}:{number}: {why} — {IMPORT_FORMAT}")
        if item.get("kind", "step") == "task":
            tasks.append((str(item["text"]), item["label"]))
        else:
            step = Step(str(item["tool"]), dict(item.get("arguments") or {}), "read", item.get("observation"))
            steps.append((step, item["label"]))
    return tasks, steps


IMPORT_FORMAT = (
    'each line is {"kind": "task", "text": "...", "label": "success"} or {"kind": "step", "tool": "...",'
    ' "arguments": {...}, "label": "failure"} (docs/LEASH.md#importing-labelled-examples-bank-import)'
)


def _bad_example(item: object) -> str | None:
    """What is wrong with one line of an examples file, or None."""
    if not isinstance(item, dict):
        return "not a JSON object"
    kind = item.get("kind", "step")
    if kind not in ("task", "step"):
        return f"kind {kind!r} is neither task nor step"
    for key in ("label", "text" if kind == "task" else "tool"):
        if key not in item:
            return f"a {kind} needs {key!r}"
    if item["label"] not in ("success", "failure"):
        return f"label {item['label']!r} is neither success nor failure"
    if kind == "step" and not isinstance(item.get("arguments") or {}, dict):
        return "a step's arguments must be a JSON object"
    return None
