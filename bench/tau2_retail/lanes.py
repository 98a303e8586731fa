"""Every (mode, trial, task) run, spread over lanes: each lane serves blocks from its own scripted server."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from bench.tau2_retail.agents import STRONG_MODEL, WEAK_MODEL, World
from bench.tau2_retail.db import Db
from bench.tau2_retail.scoring import Task, gold_hash
from bench.tau2_retail.served import served_models
from bench.tau2_retail.settings import LEASH_MODE, Endpoints, Settings
from bench.tau2_retail.task_run import Models, run_one
from bench.tau2_retail.tokens import regex_count
from mcp_spec_proxy.config.schema import LeashConfig
from mcp_spec_proxy.engine import Mode
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.models import ChatModel, ModelConfig
from mcp_spec_proxy.testing import Respond, ScriptedModelServer


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
    world = World(settings.params, settings.seed, settings.count or regex_count)
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
    if settings.endpoints is not None:
        settings.served = await served_models(settings.endpoints)
    settings.gold_hashes = {
        str(task["id"]): await anyio.to_thread.run_sync(gold_hash, task, settings.original) for task in settings.tasks
    }
    leash = None
    if LEASH_MODE in settings.modes:
        endpoints = settings.endpoints
        if endpoints is not None and endpoints.leash_encoder == "hidden":
            config = LeashConfig(encoder="hidden", dim=endpoints.leash_dim, bank_dir=str(settings.leash_dir))
            native = endpoints.weak.hidden_states == "native"
            leash = Leash.open(config, hidden_model=endpoints.weak.model, hidden_native=native)
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
