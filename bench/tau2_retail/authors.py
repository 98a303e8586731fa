"""What the scripted authors of the retail benchmark decide: the next step, and the errors they make.

    author    the weak model (drafts; weak-only) or the strong one (strong-only, LEASH strong-led
              runs) follows the gold actions in order, then answers. At each step it errs with its
              role's `error_rate`, in one of the kinds of `[errors]` (`ERROR_KINDS`): an id taken
              from another record it has seen, a write before the reads that justify it, a write
              tool of the same effect, or the final answer while a write is still due.
    repair    the strong model's repair turn takes the gold step with probability
              `repair.success`, else errs as the strong author does.

Where an author stands is read off the steps it can see (`progress`): a step equal to a gold
action at or after the current position moves past it (so a premature write with the right
arguments skips the reads it jumped over); a write that succeeded but matches no gold action
counts as the next gold write, done wrong (the author believes it is done); anything else (a
wrong read, a wrong write that failed) leaves the position, and the author takes the gold step.

Every draw comes from a `random.Random` seeded by a string naming the seed, trial, task, role and
place in the trajectory (`seeded`), so a run is reproducible whatever runs beside it, and
weak-only and spec (or strong-only and a repair) draw the same errors at the same place.
Decisions carry no text: `agents.World` writes it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.tau2_retail.catalogue import TOOLS
from bench.tau2_retail.params import Params
from bench.tau2_retail.scoring import Task, gold_actions
from bench.tau2_retail.tools import CANCEL_REASONS
from mcp_spec_proxy.prompts import FINAL_ANSWER

PREFIX = "retail__"
WRITES = frozenset(PREFIX + name for name, spec in TOOLS.items() if spec.kind != "read" and name != "calculate")
ERROR_KINDS = ("wrong_record", "premature_write", "wrong_tool", "early_answer")

_ID_PATTERNS: dict[str, re.Pattern[str]] = {
    "order_id": re.compile(r"#W\d+"),
    "item_id": re.compile(r'"item_id":\s*"(\d+)"'),
    "product_id": re.compile(r'"product_id":\s*"(\d+)"'),
    "payment_method_id": re.compile(r"\b(?:credit_card|paypal|gift_card)_\d+\b"),
    "user_id": re.compile(r"\b(?!credit_card_|gift_card_)[a-z]+_[a-z]+_\d+\b"),
}
_ARGUMENT_KINDS = {
    "order_id": "order_id",
    "item_id": "item_id",
    "item_ids": "item_id",
    "new_item_ids": "item_id",
    "product_id": "product_id",
    "payment_method_id": "payment_method_id",
    "user_id": "user_id",
}
_ADDRESS = ("address1", "address2", "city", "state", "country", "zip")


@dataclass(frozen=True)
class Action:
    """A tool call by catalog name (`retail__...`), or the final answer (`final_answer` {answer})."""

    tool: str
    arguments: dict[str, Any]

    @property
    def is_answer(self) -> bool:
        return self.tool == FINAL_ANSWER

    @property
    def is_write(self) -> bool:
        return self.tool in WRITES

    def as_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}


@dataclass(frozen=True)
class Seen:
    """A step an author or the verifier can see, with what it returned (if it ran)."""

    action: Action
    error: bool = False
    text: str = ""


def gold(task: Task) -> list[Action]:
    return [Action(PREFIX + action["name"], dict(action["arguments"])) for action in gold_actions(task)]


def progress(golden: Sequence[Action], seen: Sequence[Seen]) -> int:
    """How many gold actions the author believes done after `seen` (see the module docstring)."""
    position = 0
    for step in seen:
        if step.action.is_answer:
            continue
        match = next((j for j in range(position, len(golden)) if golden[j] == step.action), None)
        if match is not None:
            position = match + 1
        elif step.action.is_write and not step.error:
            due = next((j for j in range(position, len(golden)) if golden[j].is_write), None)
            if due is not None:
                position = due + 1
    return position


def correct(golden: Sequence[Action], position: int, action: Action) -> bool:
    """Is `action` the right step at `position`: the gold action there, or the answer once all are done."""
    if action.is_answer:
        return position >= len(golden)
    return position < len(golden) and golden[position] == action


def seeded(*parts: object) -> random.Random:
    return random.Random("|".join(map(str, parts)))


# -- errors -----------------------------------------------------------------------------------


def observed(kind: str, texts: Sequence[str], exclude: str, near: str | None = None) -> list[str]:
    """Ids of `kind` seen in `texts`, in order of appearance; first those from texts holding `near`."""
    pattern = _ID_PATTERNS[kind]
    first: list[str] = []
    rest: list[str] = []
    for text in texts:
        target = first if near is not None and near in text else rest
        for found in pattern.finditer(text):
            value = found.group(1) if pattern.groups else found.group(0)
            if value != exclude and value not in first and value not in rest:
                target.append(value)
    return first + [value for value in rest if value not in first]


def wrong_record(rng: random.Random, step: Action, texts: Sequence[str], later: Sequence[Action]) -> Action | None:
    """One id argument (or a list element) replaced by another seen id of its kind; a cancel's other reason."""
    options: list[tuple[str, int | None, str]] = []
    for name, value in step.arguments.items():
        kind = _ARGUMENT_KINDS.get(name)
        if name == "reason" and value in CANCEL_REASONS:
            options.append((name, None, next(r for r in CANCEL_REASONS if r != value)))
        elif kind is not None and isinstance(value, str):
            options.extend((name, None, other) for other in observed(kind, texts, value, near=value)[:3])
        elif kind is not None and isinstance(value, list):
            for index, element in enumerate(value):
                others = [o for o in observed(kind, texts, element, near=element) if o not in value][:3]
                options.extend((name, index, other) for other in others)
    rng.shuffle(options)
    for name, at, other in options:
        arguments = dict(step.arguments)
        if at is None:
            arguments[name] = other
        else:
            arguments[name] = [other if i == at else v for i, v in enumerate(arguments[name])]
        candidate = Action(step.tool, arguments)
        if candidate not in later:
            return candidate
    return None


def premature_write(rng: random.Random, golden: Sequence[Action], position: int, texts: Sequence[str]) -> Action | None:
    """The next gold write, now; an id not yet observed is replaced by a seen id of its kind."""
    due = next((j for j in range(position + 1, len(golden)) if golden[j].is_write), None)
    if due is None:
        return None
    seen_text = "\n".join(texts)
    arguments: dict[str, Any] = {}
    for name, value in golden[due].arguments.items():
        kind = _ARGUMENT_KINDS.get(name)
        values = value if isinstance(value, list) else [value]
        guessed = []
        for element in values:
            if kind is None or not isinstance(element, str) or element in seen_text:
                guessed.append(element)
                continue
            others = observed(kind, texts, element)
            if not others:
                return None  # nothing to guess from: this author would read first
            guessed.append(rng.choice(others[:3]))
        arguments[name] = guessed if isinstance(value, list) else guessed[0]
    return Action(golden[due].tool, arguments)


def wrong_tool(rng: random.Random, step: Action, texts: Sequence[str]) -> Action | None:
    """A write tool of the same effect, with the arguments it takes filled from the gold step."""
    name, args = step.tool.removeprefix(PREFIX), step.arguments
    if name == "exchange_delivered_order_items":
        keep = {k: args[k] for k in ("order_id", "item_ids", "payment_method_id")}
        return Action(PREFIX + "return_delivered_order_items", keep)
    if name == "return_delivered_order_items":
        return Action(PREFIX + "exchange_delivered_order_items", {**args, "new_item_ids": list(args["item_ids"])})
    if name == "modify_pending_order_items":
        return Action(PREFIX + "exchange_delivered_order_items", dict(args))
    address = {k: args[k] for k in _ADDRESS if k in args}
    if name == "modify_pending_order_address":
        users = observed("user_id", texts, "")
        return Action(PREFIX + "modify_user_address", {"user_id": users[0], **address}) if users else None
    if name == "modify_user_address":
        orders = observed("order_id", texts, "")
        return (
            Action(PREFIX + "modify_pending_order_address", {"order_id": rng.choice(orders), **address})
            if orders
            else None
        )
    return None


@dataclass(frozen=True)
class Decision:
    action: Action
    error: str | None = None  # the kind of error made, or None for the gold step


class Authors:
    """The decisions of the scripted authors and the repair turn (no text: `World` writes it)."""

    def __init__(self, params: Params, seed: int) -> None:
        self.params = params
        self.seed = seed

    def next(
        self, role: str, task: Task, golden: Sequence[Action], seen: Sequence[Seen], *, trial: int, texts: Sequence[str]
    ) -> Decision:
        """The author's next step after `seen` (`role`: weak, strong or repair)."""
        position = progress(golden, seen)
        rng = seeded(self.seed, trial, task["id"], role, position, len(seen))
        if role == "repair":
            errs = rng.random() >= self.params.repair.success
        else:
            rate = self.params.weak.error_rate if role == "weak" else self.params.strong.error_rate
            errs = rng.random() < rate
        due = golden[position] if position < len(golden) else Action(FINAL_ANSWER, {"answer": ""})
        if errs and not due.is_answer:
            made = self.error(rng, golden, position, texts)
            if made is not None:
                return made
        return Decision(due)

    def error(
        self, rng: random.Random, golden: Sequence[Action], position: int, texts: Sequence[str]
    ) -> Decision | None:
        step = golden[position]
        table = self.params.errors.write if step.is_write else self.params.errors.read
        weights: dict[str, float] = {str(kind): weight for kind, weight in table.items()}
        # An answer ends the task with a write still due, once the author is at a write or has made
        # one already: it believes the work done, or stops to report instead of acting.
        write_due = any(action.is_write for action in golden[position:]) and (
            step.is_write or any(action.is_write for action in golden[:position])
        )
        later = golden[position:]
        builders: dict[str, Callable[[], Action | None]] = {
            "wrong_record": lambda: wrong_record(rng, step, texts, later),
            "premature_write": lambda: premature_write(rng, golden, position, texts),
            "wrong_tool": lambda: wrong_tool(rng, step, texts),
            "early_answer": lambda: Action(FINAL_ANSWER, {"answer": ""}) if write_due else None,
        }
        while weights:
            kinds = sorted(weights)
            kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0] if sum(weights.values()) > 0 else None
            if kind is None:
                return None
            action = builders[kind]()
            if action is not None:
                return Decision(action, kind)
            del weights[kind]
        return None
