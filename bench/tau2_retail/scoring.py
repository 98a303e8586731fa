"""Scoring a task run as tau2 does (TOOLS.md sections 4 and 5).

The core is the DB check: replay the task's gold `actions` on a fresh DB (failing actions are
recorded and skipped, as tau2 does), hash it, and compare with the hash of the DB the run left
(the retail server's state file). Reward 1.0 iff equal.

The other components of a task's `reward_basis`:

- `COMMUNICATE` (no retail task uses it today): implemented — every `communicate_info` string
  must occur, case-insensitively, in an agent message with its commas removed. Judged only when
  the agent's messages are given.
- `NL_ASSERTION`: needs an LLM judge, which this module does not have. A task without
  assertions scores 1.0 on it; otherwise the caller may pass its own verdict
  (`nl_assertions_met`), or the component is reported in `Score.unjudged` and left out of the
  product.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.tau2_retail.catalogue import TOOLS, call_tool
from bench.tau2_retail.db import Db, db_hash, fresh_db
from bench.tau2_retail.tools import ToolError, error_text, render

Task = dict[str, Any]


def load_tasks(path: Path) -> list[Task]:
    """The tasks of `tasks.json`, in file order."""
    tasks: list[Task] = json.loads(path.read_text(encoding="utf-8"))
    return tasks


SPLITS = ("train", "test", "all")
SPLIT_FILE = "split_tasks.json"


class SplitNotFound(LookupError):
    """A split the data folder does not hold (the message says where to find it)."""


def load_split(folder: Path, split: str) -> list[Task]:
    """The tasks of one split of a data folder (`train`, `test`, or `all` of them), in file order.

    A tau2-bench checkout keeps every task in `tasks.json` and names each split's ids in
    `split_tasks.json`. The repository's own folder has no such file: it holds the 74 train tasks
    only (see its NOTICE.md), so it serves `train` and `all` (the same tasks) and refuses `test`.
    """
    if split not in SPLITS:
        raise SplitNotFound(f"unknown split {split!r}: expected {', '.join(SPLITS)}")
    tasks = load_tasks(folder / "tasks.json")
    if split == "all":
        return tasks
    listing = folder / SPLIT_FILE
    if not listing.is_file():
        if split == "train":
            return tasks
        raise SplitNotFound(
            f"{folder} has no {SPLIT_FILE}, so it holds no {split} split (the repository's data/tau2-retail "
            "holds only the 74 train tasks): clone https://github.com/sierra-research/tau2-bench and pass "
            "its data/tau2/domains/retail as --data"
        )
    splits = json.loads(listing.read_text(encoding="utf-8"))
    if split not in splits:
        raise SplitNotFound(f"{listing} names no {split!r} split (it has {', '.join(sorted(splits))})")
    wanted = {str(task_id) for task_id in splits[split]}
    return [task for task in tasks if str(task["id"]) in wanted]


def load_train_tasks(folder: Path) -> list[Task]:
    """The train tasks of a data folder, in file order (`load_split(folder, "train")`)."""
    return load_split(folder, "train")


def gold_actions(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    actions: list[dict[str, Any]] = task["evaluation_criteria"]["actions"] or []
    return actions


def instruction(task: Mapping[str, Any]) -> str:
    """The customer's goal, as the user simulator is told it (used as the oracle's write intent)."""
    return str(task["user_scenario"]["instructions"]["reason_for_call"])


@dataclass(frozen=True)
class Replayed:
    """One replayed call: what ran and what the agent would have read."""

    name: str
    arguments: Mapping[str, Any]
    ok: bool
    output: str


def replay(db: Db, calls: Iterable[tuple[str, Mapping[str, Any]]], *, mutating_only: bool = False) -> list[Replayed]:
    """Run `calls` on `db` in order, in place; a failing call is recorded and the replay goes on.

    `mutating_only` skips everything but the seven WRITE tools (unknown names included), as tau2
    does when it rebuilds the agent's DB from a conversation.
    """
    steps = []
    for name, arguments in calls:
        spec = TOOLS.get(name)
        if mutating_only and (spec is None or not spec.mutating):
            continue
        try:
            steps.append(Replayed(name, arguments, True, render(call_tool(db, name, arguments))))
        except ToolError as exc:
            steps.append(Replayed(name, arguments, False, error_text(exc)))
    return steps


def gold_db(task: Mapping[str, Any], original: Db) -> tuple[Db, list[Replayed]]:
    """A fresh DB with the task's gold actions replayed on it, and the replay."""
    db = fresh_db(original)
    steps = replay(db, ((action["name"], action["arguments"]) for action in gold_actions(task)))
    return db, steps


def gold_hash(task: Mapping[str, Any], original: Db) -> str:
    return db_hash(gold_db(task, original)[0])


def agent_hash(original: Db, calls: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """The hash tau2 gives an agent's recorded calls: only the WRITE ones re-run on a fresh DB.

    For runners that have a transcript but no state file; tau2's comparison of each re-run
    call's output with the recorded one is not done here.
    """
    db = fresh_db(original)
    replay(db, calls, mutating_only=True)
    return db_hash(db)


def communicate_reward(task: Mapping[str, Any], messages: Sequence[str]) -> float:
    """1.0 iff every `communicate_info` string is in some agent message (no commas, any case)."""
    texts = [message.replace(",", "").lower() for message in messages]
    wanted = task["evaluation_criteria"].get("communicate_info") or []
    return 1.0 if all(any(info.lower() in text for text in texts) for info in wanted) else 0.0


@dataclass(frozen=True)
class Score:
    task_id: str
    reward: float
    """Product of the judged components of the task's `reward_basis`."""
    db_reward: float
    gold_hash: str
    agent_hash: str
    communicate_reward: float | None
    nl_assertions: tuple[str, ...]
    unjudged: tuple[str, ...]
    """Components of `reward_basis` left out of `reward` (e.g. `NL_ASSERTION` without a judge)."""


def score_task(
    task: Mapping[str, Any],
    original: Db,
    end_hash: str,
    *,
    agent_messages: Sequence[str] | None = None,
    nl_assertions_met: bool | None = None,
    expected_hash: str | None = None,
) -> Score:
    """Score a run whose DB ended with hash `end_hash` (`expected_hash` skips the gold replay)."""
    criteria = task["evaluation_criteria"]
    gold = expected_hash if expected_hash is not None else gold_hash(task, original)
    db_reward = 1.0 if gold == end_hash else 0.0
    communicate = communicate_reward(task, agent_messages) if agent_messages is not None else None
    assertions = tuple(criteria.get("nl_assertions") or ())
    components: dict[str, float | None] = {
        "DB": db_reward,
        "COMMUNICATE": communicate,
        "NL_ASSERTION": 1.0 if not assertions else None if nl_assertions_met is None else float(nl_assertions_met),
    }
    reward, unjudged = 1.0, []
    for component in criteria.get("reward_basis") or ["DB"]:
        value = components.get(component)
        if value is None:
            unjudged.append(component)
        else:
            reward *= value
    return Score(
        task_id=str(task["id"]),
        reward=reward,
        db_reward=db_reward,
        gold_hash=gold,
        agent_hash=end_hash,
        communicate_reward=communicate,
        nl_assertions=assertions,
        unjudged=tuple(unjudged),
    )
