"""The verdict protocol a real model gets right: what the strong reviewer sends and what it reads.

Segment steps are numbered 1..L in their turns and in the block, committed calls not at all; the
verdict names the first rejected step's tool, and the count must agree with it; answers are read
the way real servers send them (thinking, fences, prose); an answer that still cannot be read
rejects the held call — whatever `on_error` says — and no prompt holds two messages of one role
in a row. The toy backend's record file is the ground truth of what ran.
"""

from __future__ import annotations

import inspect
import itertools
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.models import ChatModel
from mcp_spec_proxy.review.verdict import parse_verdict
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import Proxied, proxied, recorded, segment_length, text_of, toy, verdict

pytestmark = pytest.mark.anyio

Answer = Callable[[ChatRequest], Reply | str]
CALL_LINE = re.compile(r"^(?:Committed call|Step \d+): \{", re.MULTILINE)


@dataclass
class World:
    p: Proxied
    model: ScriptedModelServer
    tmp: Path

    @property
    def ledger(self) -> list[str]:
        return recorded(self.tmp / "ledger")

    def verdicts(self) -> list[dict[str, Any]]:
        return [e for e in read_audit(self.tmp / "state" / "audit.jsonl") if e["event"] == "verdict"]

    def verify_requests(self) -> list[ChatRequest]:
        return [r for r in self.model.chat_requests if r.json_schema is not None]

    async def echo(self, text: str) -> None:
        result = await self.p.client.call_tool("toy__echo", {"text": text})
        assert not result.is_error, text_of(result)

    async def record(self, value: str) -> str:
        return text_of(await self.p.client.call_tool("toy__record", {"value": value}))


@asynccontextmanager
async def world(
    tmp_path: Path, answer: Answer, *, review: dict[str, Any] | None = None, model: dict[str, Any] | None = None
) -> AsyncIterator[World]:
    async with ScriptedModelServer(Respond(answer)) as server:
        config = {
            "servers": {"toy": toy(tmp_path / "ledger")},
            "models": {
                "strong": {"base_url": server.base_url, "model": "strong-model", "max_retries": 0, **(model or {})}
            },
            "review": {"default": "strong", "intent": False, **(review or {})},
        }
        async with proxied(config, tmp_path / "state", twins=True) as p:
            yield World(p, server, tmp_path)


def calls_shown(request: ChatRequest) -> int:
    """Every call the prompt shows, committed or in the segment (old layout: `Step N:` messages)."""
    return sum(len(CALL_LINE.findall(str(m.get("content")))) for m in request.messages)


def accept_first_review(then: Answer) -> Answer:
    """Accept every segment while nothing is committed yet; answer the later reviews with `then`."""

    def answer(request: ChatRequest) -> Reply | str:
        return verdict(segment_length(request)) if calls_shown(request) == segment_length(request) else then(request)

    return answer


# -- reading what real servers return ------------------------------------------------------------

TOOLS = ["toy__echo", "toy__record"]
ACCEPT = {"reason": "fine", "first_rejected_tool": None, "accepted_steps": 2, "replacement_action": None}
REJECT = {
    "reason": "wrong value",
    "first_rejected_tool": "toy__record",
    "accepted_steps": 1,
    "replacement_action": None,
}


@pytest.mark.parametrize(
    ("content", "accepted"),
    [
        (f"<think>The read returned hi, so the write follows.</think>\n{json.dumps(ACCEPT)}", 2),
        (f"The read is fine.\n</think>\n\n{json.dumps(REJECT)}", 1),  # the template opened the think block
        (f"Here is my verdict:\n```json\n{json.dumps(REJECT)}\n```\nThat is all.", 1),
        (f"I checked both steps. {json.dumps(ACCEPT)} Done.", 2),
        (json.dumps({**ACCEPT, "accepted_steps": True}), 2),
        (json.dumps({**REJECT, "accepted_steps": False}), 1),  # false: the held call (the last step) is rejected
        (json.dumps({**REJECT, "accepted_steps": "1"}), 1),
        (json.dumps({"reason": "old form", "accepted_steps": 2, "replacement_action": None}), 2),
    ],
    ids=["think", "unopened-think", "prose-and-fence", "prose", "true", "false", "string-number", "no-tool-named"],
)
def test_verdicts_are_read_the_way_real_servers_write_them(content: str, accepted: int) -> None:
    assert parse_verdict(content, TOOLS).accepted_steps == accepted


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        # the count names another step than the tool does
        (json.dumps({**REJECT, "first_rejected_tool": "toy__echo"}), "step 2 .toy__record. the first rejected"),
        (json.dumps({**ACCEPT, "first_rejected_tool": "toy__record"}), "accepts every step, yet"),
        (json.dumps({**REJECT, "first_rejected_tool": None}), "first_rejected_tool is None"),
        (json.dumps({**REJECT, "accepted_steps": 6}), "outside 0..2: count the steps of the segment"),
        (f"{json.dumps(ACCEPT)}\n{json.dumps(REJECT)}", "found 2"),  # two verdicts: which one?
        ("<think>step 2 writes the wrong value, so I will reject it with", "found 0"),  # thinking never closed
    ],
    ids=["tool-mismatch", "accept-naming-a-tool", "reject-naming-none", "session-count", "two-verdicts", "cut-think"],
)
def test_a_verdict_whose_count_disagrees_with_itself_is_malformed(content: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_verdict(content, TOOLS)


async def test_thinking_before_the_json_is_a_verdict(tmp_path: Path) -> None:
    thought = "<think>The echo returned the value the user asked for.</think>\n"
    async with world(tmp_path, lambda r: thought + verdict(segment_length(r))) as w:
        await w.echo("v")
        await w.record("v")
        requests = w.verify_requests()
    assert w.ledger == ['{"value": "v"}']
    assert len(requests) == 1  # read the first time, no retry


async def test_a_verdict_in_prose_and_a_fence_is_read(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> str:
        body = verdict(segment_length(request) - 1, "the user asked for w", None)
        rejected = json.loads(body) | {"first_rejected_tool": "toy__record"}
        return f"Let me check the segment.\n\n```json\n{json.dumps(rejected)}\n```\n\nThe write is wrong."

    async with world(tmp_path, answer) as w:
        await w.echo("w")
        text = await w.record("v")
        requests = w.verify_requests()
    assert w.ledger == []
    assert "the user asked for w" in text
    assert len(requests) == 1
    assert [v["decided_by"] for v in w.verdicts()] == ["strong"]


# -- numbering: the segment counts from its own start ----------------------------------------------


def session_counter(request: ChatRequest) -> str:
    """A model that numbers steps from the session's start: it rejects the held write, the last call shown."""
    shown = calls_shown(request)
    return json.dumps(
        {
            "reason": f"step {shown} records the wrong value",
            "first_rejected_tool": "toy__record",
            "accepted_steps": shown - 1,
            "replacement_action": None,
        }
    )


@pytest.mark.parametrize(
    ("reads_before", "review"),
    [(4, {"on_error": "allow"}), (0, {})],
    ids=["5-committed-count-out-of-range", "1-committed-count-in-range"],
)
async def test_a_session_count_never_turns_a_rejection_into_acceptance(
    tmp_path: Path, reads_before: int, review: dict[str, Any]
) -> None:
    async with world(tmp_path, accept_first_review(session_counter), review=review) as w:
        for n in range(reads_before):
            await w.echo(f"r{n}")
        await w.record("first")  # accepted: its segment commits
        await w.echo("now")
        await w.record("second")  # the trap: a segment of 2 behind a committed history
        requests = w.verify_requests()
    assert w.ledger == ['{"value": "first"}']
    last = requests[-1]
    assert calls_shown(last) == reads_before + 3 and segment_length(last) == 2
    # The committed calls carry no numbers; the segment's are 1..2, in its turns and in the schema.
    shown = [line.split(" {", 1)[0] for m in last.messages for line in CALL_LINE.findall(str(m["content"]))]
    assert shown == ["Committed call:"] * (reads_before + 1) + ["Step 1:", "Step 2:"]
    assert last.json_schema is not None
    counts = [branch["properties"]["accepted_steps"]["enum"] for branch in last.json_schema["schema"]["anyOf"]]
    assert counts == [[0], [1], [2]]
    decided = w.verdicts()[-1]
    assert decided["accepted"] is False and decided["accepted_steps"] == 1
    assert decided["decided_by"] == "strong (unreadable)"


# -- every prompt alternates roles -----------------------------------------------------------------


async def test_no_prompt_holds_two_messages_of_one_role_in_a_row(tmp_path: Path) -> None:
    answers = iter(["not a verdict at all"])

    def answer(request: ChatRequest) -> Reply | str:
        if request.tools:  # the repair turn
            return Reply(tool_calls=[ToolCall("toy__record", {"value": "repaired"})])
        if segment_length(request) == calls_shown(request):
            return verdict(segment_length(request))
        return next(answers, None) or json.dumps(
            {"reason": "no", "first_rejected_tool": "toy__record", "accepted_steps": 1, "replacement_action": None}
        )

    async with world(tmp_path, answer, review={"on_reject": "repair"}) as w:
        await w.echo("a")
        await w.echo("b")
        await w.record("first")
        await w.echo("c")
        await w.record("second")  # malformed once, then rejected and repaired
        requests = list(w.model.chat_requests)
    assert w.ledger == ['{"value": "first"}', '{"value": "repaired"}']
    assert len(requests) == 4  # a review, a malformed answer and its retry, the repair
    for request in requests:
        roles = [m["role"] for m in request.messages]
        assert roles[0] == "system" and roles[-1] == "user"
        assert all(a != b for a, b in itertools.pairwise(roles)), roles
    # The repair's prompt is the verifier's, every message, then the verdict and the instruction.
    review, repair = requests[1], requests[3]
    assert repair.messages[: len(review.messages)] == review.messages
    assert [m["role"] for m in repair.messages[len(review.messages) :]] == ["assistant", "user"]
    assert repair.last_user_text.startswith("# Repair\nRejected step: step 2 (toy__record)")


# -- answers that cannot be read -------------------------------------------------------------------


async def test_a_cut_off_verdict_is_retried_once_with_more_room_then_rejects(tmp_path: Path) -> None:
    cut = Reply(content='{"reason": "The echo returned v, which matches what the user', finish_reason="length")
    async with world(tmp_path, lambda r: cut, review={"on_error": "allow"}, model={"max_tokens": 64}) as w:
        await w.echo("v")
        text = await w.record("v")
        requests = w.verify_requests()
    assert w.ledger == []
    assert len(requests) == 2
    assert "cut off" in requests[1].last_user_text
    if "max_tokens" in inspect.signature(ChatModel.complete).parameters:
        assert requests[1].raw["max_tokens"] > requests[0].raw["max_tokens"] == 64
    (decided,) = w.verdicts()
    assert decided["accepted"] is False and decided["decided_by"] == "strong (unreadable)"
    assert decided["accepted_steps"] == 1  # the read before it stands
    assert "cut off" in text


async def test_an_unreadable_verdict_rejects_whatever_on_error_says(tmp_path: Path) -> None:
    async with world(tmp_path, lambda r: "I think it is probably fine.", review={"on_error": "allow"}) as w:
        text = await w.record("v")
        requests = w.verify_requests()
    assert w.ledger == []
    assert len(requests) == 2
    events = [e["event"] for e in read_audit(tmp_path / "state" / "audit.jsonl") if e.get("tool") == "toy__record"]
    assert events[:2] == ["held", "verdict"]
    (decided,) = w.verdicts()
    assert decided["accepted"] is False and decided["decided_by"] == "strong (unreadable)"
    assert "malformed twice" in text and "failing closed" in text


async def test_unreadable_error_keeps_the_reviewer_failure_path(tmp_path: Path) -> None:
    review = {"unreadable": "error", "on_error": "allow"}
    async with world(tmp_path, lambda r: "garbage", review=review) as w:
        await w.record("v")
    (decided,) = w.verdicts()
    assert decided["decided_by"] == "on_error" and decided["accepted"] is True
    assert w.ledger == ['{"value": "v"}']
