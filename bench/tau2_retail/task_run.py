"""One task run: a fresh proxy and retail server, the engine (or a conversation with the user simulator), the score."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from bench.tau2_retail import report
from bench.tau2_retail.agents import World
from bench.tau2_retail.db import db_hash, fresh_db
from bench.tau2_retail.oracle import proxy_config
from bench.tau2_retail.params import Params
from bench.tau2_retail.records import record
from bench.tau2_retail.scoring import Task, instruction, score_task
from bench.tau2_retail.server import RetailServer, read_state
from bench.tau2_retail.settings import LEASH_MODE, Endpoints, Settings
from bench.tau2_retail.user_sim import Conversation, UserSimulator, converse
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.engine import AGENT_INSTRUCTIONS, Engine, Mode, RunResult
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.models import ChatModel, ModelConfig
from mcp_spec_proxy.proxy import StatePaths, running_proxy

RETAIL_TOOLS = 16
RUN_TIMEOUT_S = 900
CONVERSING = (
    "You are talking with a customer: your plain-text reply is your message to them, and they answer "
    "in the next turn. Follow the policy below."
)


@dataclass(frozen=True)
class Models:
    """The model entries a run's config gets, and the clients to pass the proxy (None: it builds them)."""

    configs: dict[str, ModelConfig]
    clients: Callable[[], dict[str, ChatModel] | None]


def task_text(task: Task, params: Params) -> str:
    """The engine's task: the customer's instruction (and, if configured, what the customer knows)."""
    text = instruction(task)
    if params.run.task_text == "instruction+known_info":
        known = task["user_scenario"]["instructions"].get("known_info") or ""
        text = f"{text} {known}".strip()
    return text


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
