"""LEASH's decisions on labelled τ² retail steps: routing and step-escalation precision and recall.

    .venv/bin/python -m bench.leash_decisions                 # hashing encoder, 5 trials, 30 % held out
    .venv/bin/python -m bench.leash_decisions --trials 10 --held-out 0.5 --seed 1
    .venv/bin/python -m bench.leash_decisions --encoder embedding --local-model   # SmolLM2-135M's embeddings
    .venv/bin/python -m bench.leash_decisions --encoder embedding --embedding-url URL --embedding-model M

Where the labels come from (SIMULATED): the retail benchmark's scripted weak author
(`bench/tau2_retail/authors.py`, `bench.toml`'s error rates) drafts each of the 74 train tasks step by
step against an in-process copy of the retail DB (`catalogue.call_tool`, no MCP, no model server).
A drafted step is labelled as the scripted verifier would judge it: `success` if it is the gold step
at that point, else `failure`; a failed step is then replaced by the gold one (a repair that always
succeeds), executed, and drafting goes on. A task is labelled `success` when the weak author made no
error in it (an early final answer included; answers themselves are not steps LEASH scores). Every
trial draws its own errors (the authors' seeded draws).

Tasks (not steps) are split into train and held-out by a seeded draw, so no held-out step shares a
task with a banked one. Train labels go into fresh banks through the runtime's own `Leash.label_steps`
and `label_task`; held-out steps and tasks are scored by `Leash.step_score` / `task_score` and decided
by `Leash.at_least`, exactly as step escalation (`LeashWatch.drafted`) and routing (`route`) decide —
as drafted, before they run, with no observation. Printed per threshold: the share escalated, the
precision (escalated steps that were failures) and recall (failures escalated), and the share with no
opinion (too few near neighbours; never escalated). Prints markdown, then one `LEASH_DECISIONS {json}` line.

Encoders: `hashing` (the offline default), or `embedding`: the runtime's own `EmbeddingEncoder` (the
texts it sends are the runtime's `step_text` / `task_text`) against an OpenAI-compatible `/v1/embeddings`
— `--embedding-url`, or `--local-model`, which starts SmolLM2-135M on llama.cpp (`bench.measure.local_model`;
last-token pooling, one thread). Trials repeat most texts (the gold steps, the same 74 instructions),
so each distinct text is embedded once and its vector reused (`OnceEach`): 5 trials are 435 distinct
texts, 66k characters (285k without the memo), 12 minutes of SmolLM2's one thread on a loaded 2-core
machine (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from bench.measure import local_model, machine_line
from bench.tau2_retail.authors import Action, Authors, Seen, correct, gold, progress, seeded
from bench.tau2_retail.catalogue import call_tool
from bench.tau2_retail.db import data_dir, fresh_db, load_db
from bench.tau2_retail.params import load as load_params
from bench.tau2_retail.scoring import Task, instruction, load_train_tasks
from bench.tau2_retail.tools import ToolError, error_text, render
from mcp_spec_proxy.config.schema import EmbeddingEndpoint, LeashConfig
from mcp_spec_proxy.leash.bank import Bank, Label
from mcp_spec_proxy.leash.encoders import EmbeddingEncoder
from mcp_spec_proxy.leash.layers import Leash, Score
from mcp_spec_proxy.trajectory import Effect, Step

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
PREFIX = "retail__"
LOCAL_MODEL = "smollm2-135m"  # the name scripts/local_model.py serves


class OnceEach(EmbeddingEncoder):
    """The runtime's embedding encoder, asking the endpoint once per distinct text.

    Only the transport is memoised: the texts are still the runtime's (`encode_steps` → `step_text`,
    `encode_texts` → `task_text`), sent in its batches, normalised by it; a text met again (the
    next trial's gold step) reuses the vector the endpoint gave for it."""

    def __init__(self, base_url: str, model: str) -> None:
        super().__init__(base_url, model, timeout=600)  # one slow thread: a batch of 128 takes a while
        self.vectors: dict[str, np.ndarray] = {}
        self.sent_chars = 0
        self.seconds = 0.0

    async def encode_texts_raw(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.vectors))
        if missing:
            started = time.perf_counter()
            found = await super().encode_texts_raw(missing)
            self.seconds += time.perf_counter() - started
            self.sent_chars += sum(map(len, missing))
            self.vectors.update(zip(missing, found, strict=True))
        return np.stack([self.vectors[t] for t in texts]) if texts else np.zeros((0, self.dim or 0), np.float32)

    def cost(self) -> dict[str, Any]:
        return {"texts": len(self.vectors), "chars": self.sent_chars, "seconds": round(self.seconds, 1)}


@dataclass
class Run:
    task: Task
    trial: int
    steps: list[tuple[Step, Label]]
    success: bool


def draft(authors: Authors, task: Task, trial: int, original: Any) -> Run:
    """The scripted weak author's drafted steps for one task, each labelled as the verifier judges it."""
    db = fresh_db(original)
    golden = gold(task)
    seen: list[Seen] = []
    steps: list[tuple[Step, Label]] = []
    early = False
    for _ in range(len(golden) + 1):
        texts = [instruction(task), *(s.text for s in seen)]
        position = progress(golden, seen)
        action = authors.next("weak", task, golden, seen, trial=trial, texts=texts).action
        right = correct(golden, position, action)
        if action.is_answer:
            # LEASH scores no answer as a step (the runtime screens tool calls); an early one fails the task.
            early = not right
            break
        effect: Effect = "write" if action.is_write else "read"
        steps.append((Step(action.tool, action.arguments, effect), "success" if right else "failure"))
        ran = action if right else golden[position]  # a rejected step is repaired with the gold one
        seen.append(execute(db, ran))
    return Run(task, trial, steps, success=not early and all(label == "success" for _, label in steps))


def execute(db: Any, action: Action) -> Seen:
    try:
        return Seen(action, text=render(call_tool(db, action.tool.removeprefix(PREFIX), action.arguments)))
    except ToolError as exc:
        return Seen(action, error=True, text=error_text(exc))


@dataclass(frozen=True)
class Row:
    threshold: float
    escalated: float
    precision: float | None
    recall: float | None


def rows(scores: Sequence[Score], failed: Sequence[bool], leash: Leash) -> list[Row]:
    out = []
    failures = sum(failed)
    for threshold in THRESHOLDS:
        flagged = [leash.at_least(score, threshold) for score in scores]
        hits = sum(f and bad for f, bad in zip(flagged, failed, strict=True))
        out.append(
            Row(
                threshold,
                sum(flagged) / len(scores) if scores else 0.0,
                hits / sum(flagged) if any(flagged) else None,  # nothing escalated: no precision
                hits / failures if failures else None,
            )
        )
    return out


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def table(title: str, found: list[Row], count: int, failures: int, unscored: int) -> str:
    lines = [
        f"**{title}**: {count} held out, {failures} failures ({failures / max(count, 1):.1%} — the precision of"
        f" escalating everything), {unscored} with no opinion ({unscored / max(count, 1):.1%})",
        "",
        "| threshold | escalated | precision | recall |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r.threshold:.2f} | {r.escalated:.1%} | {percent(r.precision)} | {percent(r.recall)} |" for r in found
    ]
    return "\n".join(lines)


async def open_leash(args: argparse.Namespace, banks: str) -> Leash:
    """Fresh banks under `banks` and the configured encoder, as `Leash.open` builds them for a proxy —
    except that an embedding encoder is `OnceEach`, so a repeated text is not embedded again."""
    common = {"dim": args.dim, "bank_dir": banks, "k": args.k, "min_neighbours": args.min_neighbours}
    if args.encoder == "hashing":
        return Leash.open(LeashConfig(encoder="hashing", **common), strict=True)
    endpoint = EmbeddingEndpoint(base_url=args.embedding_url, model=args.embedding_model)
    config = LeashConfig(encoder="embedding", embedding=endpoint, **common)
    encoder = OnceEach(endpoint.base_url, endpoint.model)
    info = await encoder.probe()
    root = Path(banks)
    tasks = Bank.open(root / "task", kind="task", encoder=info)
    steps = Bank.open(root / "step", kind="step", encoder=info)
    return Leash(config, encoder, tasks, steps, strict=True)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    folder = data_dir()
    tasks = load_train_tasks(folder)
    original = load_db(folder / "db.json")
    authors = Authors(load_params(), args.seed)
    held = {str(t["id"]) for t in tasks if seeded(args.seed, "split", t["id"]).random() < args.held_out}
    runs = [draft(authors, task, trial, original) for trial in range(args.trials) for task in tasks]
    train = [run for run in runs if str(run.task["id"]) not in held]
    test = [run for run in runs if str(run.task["id"]) in held]
    with tempfile.TemporaryDirectory() as banks:
        leash = await open_leash(args, banks)
        for run in train:
            await leash.label_task(instruction(run.task), run.success, source="import")
        stored = await leash.label_steps(
            [s for run in train for s, _ in run.steps],
            [label for run in train for _, label in run.steps],
            source="import",
        )
        held_steps = [(s, label) for run in test for s, label in run.steps]
        step_scores = [await leash.step_score(s) for s, _ in held_steps]
        task_scores = [await leash.task_score(instruction(run.task)) for run in test]
        step_failed = [label == "failure" for _, label in held_steps]
        task_failed = [not run.success for run in test]
        reads = [i for i, (s, _) in enumerate(held_steps) if s.effect == "read"]
        result = {
            "encoder": leash.encoder.info.as_json(),
            "trials": args.trials,
            "seed": args.seed,
            "tasks": len(tasks),
            "held_out_tasks": len(held),
            "bank_steps": stored,
            "bank_tasks": len(train),
            "steps": rows(step_scores, step_failed, leash),
            "reads": rows([step_scores[i] for i in reads], [step_failed[i] for i in reads], leash),
            "routing": rows(task_scores, task_failed, leash),
            "counts": {
                "steps": (len(held_steps), sum(step_failed), sum(s.value is None for s in step_scores)),
                "reads": (
                    len(reads),
                    sum(step_failed[i] for i in reads),
                    sum(step_scores[i].value is None for i in reads),
                ),
                "routing": (len(test), sum(task_failed), sum(s.value is None for s in task_scores)),
            },
            "embedded": leash.encoder.cost() if isinstance(leash.encoder, OnceEach) else None,
        }
        await leash.aclose()
    return result


@contextmanager
def endpoint(args: argparse.Namespace) -> Iterator[None]:
    """With `--local-model`, the local SmolLM2 server for the run (its URL into `args`); else nothing."""
    if not args.local_model:
        yield
        return
    with local_model() as url:
        args.embedding_url, args.embedding_model = url, LOCAL_MODEL
        yield


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.leash_decisions", description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--held-out", type=float, default=0.3, help="share of tasks held out")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--min-neighbours", type=int, default=5)
    parser.add_argument("--encoder", choices=("hashing", "embedding"), default="hashing")
    parser.add_argument("--embedding-url", help="an OpenAI-compatible base URL ending in /v1 (--encoder embedding)")
    parser.add_argument("--embedding-model", default=LOCAL_MODEL, help="the model name sent to /v1/embeddings")
    parser.add_argument(
        "--local-model",
        action="store_true",
        help="start SmolLM2-135M on llama.cpp and embed with it (scripts/local_model.py)",
    )
    args = parser.parse_args(argv)
    if args.encoder == "embedding" and not (args.embedding_url or args.local_model):
        parser.error("--encoder embedding needs --embedding-url URL or --local-model")
    if args.encoder == "hashing" and (args.embedding_url or args.local_model):
        parser.error("--embedding-url and --local-model are for --encoder embedding")
    return args


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    with endpoint(args):
        result = anyio.run(measure, args)
    print(machine_line())
    encoder = result["encoder"]
    print(
        f"\n{encoder['name']} encoder '{encoder['model']}' ({encoder['dim']} dims), {result['trials']} trials,"
        f" seed {result['seed']}: {result['bank_tasks']} task and {result['bank_steps']} step labels banked,"
        f" {result['held_out_tasks']} of {result['tasks']} tasks held out\n"
    )
    if result["embedded"]:
        cost = result["embedded"]
        print(f"embedded {cost['texts']} distinct texts ({cost['chars']} characters) in {cost['seconds']} s\n")
    titles = {"steps": "Step escalation, every drafted step", "reads": "Drafted reads only", "routing": "Task routing"}
    for key, title in titles.items():
        print(table(title, result[key], *result["counts"][key]) + "\n")
    print("LEASH_DECISIONS " + json.dumps(result, default=lambda o: o.__dict__))


if __name__ == "__main__":
    main()
