"""What a retail benchmark run is set up with: parameters, modes, tasks, data, and real endpoints if any."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from bench.cost_model import CostModel
from bench.tau2_retail.db import Db
from bench.tau2_retail.params import Params
from bench.tau2_retail.report import Column, columns
from bench.tau2_retail.scoring import Task
from bench.tau2_retail.tokens import Count
from mcp_spec_proxy.engine import Mode
from mcp_spec_proxy.models import ModelConfig

if TYPE_CHECKING:  # served.py reads Endpoints from here
    from bench.tau2_retail.served import Served

LEASH_MODE: Mode = "spec+leash"
MAX_TURNS = 30


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
    cost: CostModel | None  # None: `--cost-model none`, nothing is modelled
    endpoints: Endpoints | None = None
    count: Count | None = None  # the tokenizer the scripted server counts with (None: its regex)
    in_process: bool = False  # tests: the retail server as its in-process twin, not a process
    progress: Callable[[dict[str, Any]], None] | None = None
    gold_hashes: dict[str, str] = field(default_factory=dict)
    policy: str = ""
    leash_start: tuple[int, int] = (0, 0)  # task and step labels the banks held before the run
    max_turns: int = MAX_TURNS  # real endpoints: agent turns per conversation
    agent_policy: str = ""  # real endpoints: the policy in the agent's system prompt, as tau2-bench gives it
    split: str = "train"  # where the tasks came from: a split of the data, or "--tasks" (named by the user)
    served: dict[str, Served] = field(default_factory=dict)  # endpoints: what each role's lists, asked at the start

    @property
    def columns(self) -> tuple[Column, ...]:
        """The report's per-run columns: real endpoints add their measured wall; no cost model, no modelled ones."""
        measured = self.endpoints is not None or self.cost is None
        return columns(measured=measured, modelled=self.cost is not None)
