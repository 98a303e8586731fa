"""Calibrate the scripted authors' error rates: weak-only and strong-only pass rates without the stack.

    python -m bench.tau2_retail.calibrate [--params FILE] [--seeds 40]
        [--weak-rates 0.09,0.11,0.13] [--strong-rates 0.045,0.055,0.065]

Runs the scripted author (`authors.Authors`) of each role straight on a fresh DB per task, as the
engine's weak-only and strong-only loops do (every step executes, the first answer ends the
run), over `--seeds` seeds, and prints the mean DB pass rate over the train tasks for each error
rate given. The observations it reads are the tools' own rendering, as the retail server sends
them. Only the outcome is simulated here; tokens and cost come from the real run.
"""

from __future__ import annotations

import argparse
import hashlib
import marshal
import os
import statistics
import sys
from pathlib import Path

from bench.tau2_retail.authors import PREFIX, Authors, Seen, gold
from bench.tau2_retail.catalogue import call_tool
from bench.tau2_retail.db import Db, data_dir, fresh_db, load_db
from bench.tau2_retail.params import Params, load
from bench.tau2_retail.scoring import Task, gold_db, instruction, load_tasks
from bench.tau2_retail.tools import ToolError, error_text, render
from mcp_spec_proxy.trajectory import OBSERVATION_LIMIT


def observation(text: str) -> str:
    """What the engine keeps of a result (trajectory.observation_text's limit)."""
    if len(text) > OBSERVATION_LIMIT:
        return text[:OBSERVATION_LIMIT] + f"\n[… {len(text) - OBSERVATION_LIMIT} more characters]"
    return text


def digest(db: Db) -> bytes:
    """A fingerprint of the DB's state, cheaper than db_hash: equal for equal states (the tools keep key order)."""
    # marshal version 2 writes no object references, so how objects are shared cannot change the bytes.
    return hashlib.sha256(marshal.dumps(db, 2)).digest()


def direct_run(authors: Authors, role: str, task: Task, original: Db, *, trial: int, max_steps: int) -> bytes:
    """One weak-only or strong-only run of the scripted author on a fresh DB; returns its `digest`."""
    db = fresh_db(original)
    golden = gold(task)
    seen: list[Seen] = []
    for _ in range(max_steps):
        texts = [instruction(task), *(step.text for step in seen)]
        action = authors.next(role, task, golden, seen, trial=trial, texts=texts).action
        if action.is_answer:
            break
        try:
            text, failed = render(call_tool(db, action.tool.removeprefix(PREFIX), action.arguments)), False
        except ToolError as exc:
            text, failed = error_text(exc), True
        seen.append(Seen(action, failed, observation(text)))
    return digest(db)


def pass_rate(
    params: Params, role: str, tasks: list[Task], original: Db, gold_digests: dict[str, bytes], seeds: int
) -> list[float]:
    rates = []
    for seed in range(seeds):
        authors = Authors(params, seed)
        passed = sum(
            direct_run(authors, role, task, original, trial=0, max_steps=params.run.max_steps)
            == gold_digests[task["id"]]
            for task in tasks
        )
        rates.append(passed / len(tasks))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=Path, default=None)
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--weak-rates", default="")
    parser.add_argument("--strong-rates", default="")
    args = parser.parse_args(argv)
    params = load(args.params)
    folder = data_dir(os.environ)
    original = load_db(folder / "db.json")
    tasks = load_tasks(folder / "tasks.json")
    gold_digests = {task["id"]: digest(gold_db(task, original)[0]) for task in tasks}
    for role, rates in (("weak", args.weak_rates), ("strong", args.strong_rates)):
        current = params.weak.error_rate if role == "weak" else params.strong.error_rate
        for rate in [float(r) for r in rates.split(",") if r] or [current]:
            table = replace_rate(params, role, rate)
            runs = pass_rate(table, role, tasks, original, gold_digests, args.seeds)
            print(
                f"{role}-only  error_rate {rate:.3f}: pass rate {statistics.mean(runs):.3f} "
                f"(sd over {args.seeds} seeds {statistics.pstdev(runs):.3f}, range {min(runs):.3f}-{max(runs):.3f})"
            )
    return 0


def replace_rate(params: Params, role: str, rate: float) -> Params:
    if role == "weak":
        return params.model_copy(update={"weak": params.weak.model_copy(update={"error_rate": rate})})
    return params.model_copy(update={"strong": params.strong.model_copy(update={"error_rate": rate})})


if __name__ == "__main__":
    sys.exit(main())
