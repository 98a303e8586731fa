"""`rules:` from outside: a client calls through the proxy, the toy backend's ledger says what ran,
and the audit trail names the rule that decided each call."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from tests.harness import proxied, recorded, text_of, toy

pytestmark = pytest.mark.anyio

NOTES = "/srv/ann/notes/"
RULES: list[dict[str, Any]] = [
    {"when": f'tool == "toy__record" && args.value.startsWith("{NOTES}")', "review": "allow"},
    {"name": "big-amounts", "when": 'server == "toy" && has(args.amount) && args.amount > 100', "review": "human"},
    {"when": 'tool == "toy__record" && args.value == "push"', "deny": "pushes go through CI"},
    {"when": 'tool == "toy__echo" && args.text.startsWith("DROP")', "effect": "write"},
    # Divides by zero whenever it is asked: a rule that throws at run time.
    {"when": 'args.value == "boom" && 1 / (size(args.value) - 4) == 0', "review": "allow"},
]


def config(tmp_path: Path) -> dict[str, Any]:
    return {
        "servers": {"toy": toy(tmp_path / "ledger")},
        "review": {"default": "deny", "intent": False},
        "rules": RULES,
    }


def audit(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "state" / "audit.jsonl"
    return read_audit(path) if path.exists() else []


def lines(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    return [line for line in audit(tmp_path) if line["event"] == event]


class Asked:
    """A client's elicitation callback that approves, and remembers what it was asked."""

    def __init__(self) -> None:
        self.questions: list[str] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.questions.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True, "note": ""})


async def test_a_write_under_notes_runs_by_its_rule_and_elsewhere_meets_the_default_reviewer(tmp_path: Path) -> None:
    async with proxied(config(tmp_path), tmp_path / "state", twins=True) as p:
        ran = await p.client.call_tool("toy__record", {"value": f"{NOTES}todo.md"})
        refused = await p.client.call_tool("toy__record", {"value": "/srv/ann/secrets/todo.md"})
    assert not ran.is_error and refused.is_error
    assert recorded(tmp_path / "ledger") == [f'{{"value": "{NOTES}todo.md"}}']
    decided = [(v.get("rule"), v["reviewer"], v["accepted"]) for v in lines(tmp_path, "verdict")]
    assert decided == [(1, "allow", True), (None, "deny", False)]


async def test_a_large_amount_asks_the_person_and_runs_once_they_approve(tmp_path: Path) -> None:
    asked = Asked()
    async with proxied(config(tmp_path), tmp_path / "state", twins=True, elicitation=asked) as p:
        large = await p.client.call_tool("toy__record", {"value": "pay", "amount": 250})
        small = await p.client.call_tool("toy__record", {"value": "pay", "amount": 50})
    assert not large.is_error and small.is_error
    assert len(asked.questions) == 1 and "toy__record" in asked.questions[0]
    assert recorded(tmp_path / "ledger") == ['{"amount": 250, "value": "pay"}']
    held = lines(tmp_path, "held")
    assert [(h.get("rule"), h["reviewer"]) for h in held] == [("big-amounts", "human"), (None, "deny")]


async def test_a_deny_rule_refuses_with_its_message_and_nothing_runs(tmp_path: Path) -> None:
    asked = Asked()
    async with proxied(config(tmp_path), tmp_path / "state", twins=True, elicitation=asked) as p:
        result = await p.client.call_tool("toy__record", {"value": "push"})
    assert result.is_error and "pushes go through CI" in text_of(result)
    assert recorded(tmp_path / "ledger") == [] and asked.questions == []
    (verdict,) = lines(tmp_path, "verdict")
    assert verdict["rule"] == 3 and verdict["reviewer"] == "deny" and "denied by rule 3" in verdict["reason"]


async def test_effect_write_makes_a_read_held_and_leaves_other_reads_alone(tmp_path: Path) -> None:
    async with proxied(config(tmp_path), tmp_path / "state", twins=True) as p:
        held = await p.client.call_tool("toy__echo", {"text": "DROP TABLE users"})
        read = await p.client.call_tool("toy__echo", {"text": "hello"})
    assert held.is_error and "DROP" not in text_of(held).split("\n")[-1]
    assert text_of(read) == "hello"
    (line,) = lines(tmp_path, "held")
    assert (line["tool"], line["effect"], line["rule"], line["reviewer"]) == ("toy__echo", "write", 4, "deny")
    assert "rule 4 makes this call a write" in line["why"]
    assert [r["tool"] for r in lines(tmp_path, "read")] == ["toy__echo"]


@pytest.mark.parametrize(
    "arguments",
    [
        {"value": "pay", "amount": float("nan")},
        {"value": "pay", "amount": 2**70},
        {"value": "pay", "amount": "1000"},
        {"value": "boom"},
    ],
    # The SDK's client sends NaN as null (a rule then compares null); test_rules.py gives rules NaN itself.
    ids=["nan", "huge", "text-for-a-number", "throws"],
)
async def test_a_rule_that_cannot_decide_fails_closed(tmp_path: Path, arguments: dict[str, Any]) -> None:
    asked = Asked()  # a person who says yes to everything: failing closed must not reach them here
    async with proxied(config(tmp_path), tmp_path / "state", twins=True, elicitation=asked) as p:
        result = await p.client.call_tool("toy__record", arguments)
    assert result.is_error
    assert recorded(tmp_path / "ledger") == []
    (line,) = lines(tmp_path, "held")
    # The strictest the rules could have chosen: the tool's own reviewer (deny) over the failed rule's.
    assert line["reviewer"] == "deny" and line["rule_failed"], line


async def test_non_ascii_arguments_are_compared_as_text(tmp_path: Path) -> None:
    async with proxied(config(tmp_path), tmp_path / "state", twins=True) as p:
        ran = await p.client.call_tool("toy__record", {"value": f"{NOTES}ünïcödé €.md"})
        lookalike = await p.client.call_tool("toy__record", {"value": NOTES.replace("o", "\u043e") + "a.md"})
    assert not ran.is_error and lookalike.is_error
    assert len(recorded(tmp_path / "ledger")) == 1
