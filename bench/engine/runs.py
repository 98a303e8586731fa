"""Every task in every mode through the real engine and proxy, in front of the npm filesystem server."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from bench.backends import filesystem_argv
from bench.cost_model import Cost, CostModel
from bench.engine.scripted import STRONG, WEAK, Scripted
from bench.engine.tasks import Task, reset, succeeded, tasks, warmup_task
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.engine import Mode, RunResult
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import Respond, ScriptedModelServer

MODES: tuple[Mode, ...] = ("spec", "strong-only", "weak-only")
RUN_TIMEOUT_S = 120


@dataclass
class Run:
    task: Task
    mode: Mode
    result: RunResult
    ok: bool
    costs: dict[tuple[str, str], Cost] = field(default_factory=dict)  # (role, purpose) → modelled cost
    other_s: float = 0.0  # measured: wall_s less the model calls' latencies

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary()

    def cost(self, model: CostModel) -> Cost:
        return model.total(list(self.result.calls))

    def wall(self, model: CostModel) -> float:
        return self.cost(model).seconds + self.other_s


async def run_all(args: argparse.Namespace, model: CostModel, tmp: Path) -> tuple[list[Run], list[str]]:
    root = tmp / "files"
    root.mkdir()
    world = Scripted(args.seed)
    runs: list[Run] = []
    async with ScriptedModelServer(Respond(world.reply), models=(WEAK, STRONG)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0, "timeout": 60}
        argv = filesystem_argv(root)
        config = ProxyConfig.model_validate(
            {
                "servers": {"fs": {"command": argv[0], "args": argv[1:]}},
                "models": {"weak": {**endpoint, "model": WEAK}, "strong": {**endpoint, "model": STRONG}},
                "review": {"default": "strong"},
                "speculation": {"draft_steps": args.draft_steps},
            }
        )
        async with running_proxy(config, StatePaths(tmp / "state")) as proxy:
            engine = proxy.engine
            assert engine is not None, "the proxy built no engine: is models.strong configured?"
            base = engine.limits
            for task in [warmup_task(root), *tasks(root)]:
                for mode in MODES:
                    reset(root)
                    world.task = task
                    engine.limits = base.model_copy(update={"answer_graded": task.answer_graded})
                    print(f"  {task.id:<15} {mode:<12}", end="", file=sys.stderr, flush=True)
                    with anyio.fail_after(RUN_TIMEOUT_S):
                        result = await engine.run(task.prompt, mode, baseline=True)
                    ok = succeeded(root, task, result)
                    if task.id == "warm-up":
                        print(f" {result.status:<9} (not measured)", file=sys.stderr, flush=True)
                        continue
                    print(f" {result.status:<9} {'ok' if ok else 'FAILED'}", file=sys.stderr, flush=True)
                    run = Run(task, mode, result, ok, other_s=result.wall_s - sum(c.latency_s for c in result.calls))
                    for call in result.calls:
                        key = (call.role, call.purpose)
                        run.costs[key] = run.costs.get(key, Cost()) + model.cost(call)
                    runs.append(run)
            engine.limits = base
    return runs, world.repair_mismatches
