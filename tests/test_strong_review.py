"""The strong-model reviewer at the barrier: the real filesystem server behind the proxy, a
scripted OpenAI-compatible model server (real HTTP, real `openai` client) as the strong model."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from mcp_spec_proxy.testing.tokens import tokenize
from tests import backends
from tests.harness import Proxied, proxied, segment_length, stdio, text_of, verdict

pytestmark = pytest.mark.anyio


@dataclass
class Setup:
    p: Proxied
    model: ScriptedModelServer
    root: Path
    telemetry: Path

    def verify_requests(self) -> list[ChatRequest]:
        return [r for r in self.model.chat_requests if r.tools is None or not r.tools]

    def repair_requests(self) -> list[ChatRequest]:
        return [r for r in self.model.chat_requests if r.tools]

    async def write(self, name: str, content: str = "x") -> types.CallToolResult:
        return await self.p.client.call_tool(
            "fs__write_file", {"path": str(self.root / name), "content": content, "intent": f"user wants {name}"}
        )


@asynccontextmanager
async def setup(
    tmp_path: Path,
    answer: Callable[[ChatRequest], Reply | str],
    *,
    review: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    elicitation: Any = None,
) -> AsyncIterator[Setup]:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("the notes\n")
    telemetry = tmp_path / "telemetry.jsonl"
    async with ScriptedModelServer(Respond(answer)) as server:
        config = {
            "servers": {"fs": stdio(backends.filesystem(root))},
            "models": {
                "strong": {"base_url": server.base_url, "model": "strong-model", "max_retries": 0, **(model or {})}
            },
            "review": {"default": "strong", **(review or {})},
        }
        async with proxied(config, tmp_path / "state", elicitation=elicitation, telemetry=telemetry) as p:
            yield Setup(p, server, root, telemetry)


async def test_accepted_write_is_on_disk_and_was_reviewed_in_one_request(tmp_path: Path) -> None:
    async with setup(tmp_path, lambda r: verdict(segment_length(r))) as s:
        await s.p.client.call_tool("fs__read_text_file", {"path": str(s.root / "notes.txt")})
        result = await s.write("a.txt", "hello")
        requests = s.verify_requests()
    assert not result.is_error, text_of(result)
    assert (s.root / "a.txt").read_text() == "hello"
    assert len(requests) == 1
    request = requests[0]
    assert request.json_schema is not None and request.json_schema["name"] == "verdict"
    assert request.chat_template_kwargs == {"enable_thinking": False}  # thinking off for verification
    assert segment_length(request) == 2
    # The read's output reaches the reviewer fenced as data, in a message of its own.
    assert {"role": "user", "content": "Result of step 1 (ok):\n<<<tool-output\nthe notes\n\ntool-output>>>"} in (
        request.messages
    )


async def test_rejected_write_is_not_on_disk_and_the_client_sees_why(tmp_path: Path) -> None:
    suggestion = {"tool": "fs__write_file", "arguments": {"path": "/elsewhere", "content": "x", "intent": "i"}}

    def answer(request: ChatRequest) -> str:
        return verdict(segment_length(request) - 1, "the user asked for b.txt, not a.txt", suggestion)

    async with setup(tmp_path, answer) as s:
        result = await s.write("a.txt")
    assert result.is_error
    assert "the user asked for b.txt, not a.txt" in text_of(result)
    assert '"path": "/elsewhere"' in text_of(result)  # the suggested call, for the client model
    assert not (s.root / "a.txt").exists()


async def test_valid_replacement_runs_instead(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> str:
        instead = {
            "tool": "fs__write_file",
            "arguments": {"path": str(tmp_path / "files" / "b.txt"), "content": "right", "intent": "fixed"},
        }
        return verdict(segment_length(request) - 1, "wrong file", instead)

    async with setup(tmp_path, answer, review={"on_reject": "replace"}) as s:
        result = await s.write("a.txt", "wrong")
    assert not result.is_error, text_of(result)
    assert not (s.root / "a.txt").exists()
    assert (s.root / "b.txt").read_text() == "right"
    assert "replaced it with fs__write_file" in text_of(result)
    assert '"intent"' not in text_of(result).split("which ran")[0].split("fs__write_file", 2)[-1]


async def test_invalid_replacement_triggers_exactly_one_repair(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> Reply | str:
        if request.tools:  # the repair turn
            return Reply(
                tool_calls=[
                    ToolCall(
                        "fs__write_file",
                        {"path": str(tmp_path / "files" / "c.txt"), "content": "repaired", "intent": "repair"},
                    )
                ],
                reasoning="the user wanted c.txt",
            )
        return verdict(segment_length(request) - 1, "wrong file", {"tool": "fs__no_such_tool", "arguments": {}})

    async with setup(tmp_path, answer, review={"on_reject": "repair"}) as s:
        result = await s.write("a.txt")
        repairs = s.repair_requests()
    assert len(repairs) == 1
    assert repairs[0].chat_template_kwargs == {"enable_thinking": True}  # thinking on for repair
    assert repairs[0].raw["tool_choice"] == "required"
    # The verifier's verdict, with its reason, is the assistant turn before the repair instruction.
    assert json.loads(repairs[0].messages[-2]["content"])["reason"] == "wrong file"
    assert repairs[0].last_user_text.startswith("# Repair\nRejected step: step 1 (fs__write_file)")
    assert not result.is_error, text_of(result)
    assert "repaired it as fs__write_file" in text_of(result)
    assert (s.root / "c.txt").read_text() == "repaired"
    assert not (s.root / "a.txt").exists()


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ("this is not json", "not json"),
        ('{"reason": "ok"}', "missing fields"),
        ('{"reason": "ok", "accepted_steps": 7, "replacement_action": null}', "accepted_steps out of range"),
        ('{"reason": "ok", "accepted_steps": -1, "replacement_action": null}', "negative accepted_steps"),
    ],
)
async def test_malformed_verdict_is_retried_once_then_fails_closed(tmp_path: Path, bad: str, what: str) -> None:
    async with setup(tmp_path, lambda r: bad) as s:
        result = await s.write("a.txt")
        requests = s.verify_requests()
    assert result.is_error, what
    assert "malformed twice" in text_of(result) and "failing closed" in text_of(result)
    assert not (s.root / "a.txt").exists()
    assert len(requests) == 2  # one bounded retry
    assert "That is not a valid verdict" in requests[1].last_user_text


async def test_malformed_then_valid_verdict_is_used(tmp_path: Path) -> None:
    answers = iter(["garbage", None])

    def answer(request: ChatRequest) -> str:
        return next(answers) or verdict(segment_length(request))

    async with setup(tmp_path, answer) as s:
        result = await s.write("a.txt")
    assert not result.is_error
    assert (s.root / "a.txt").exists()


@pytest.mark.parametrize(
    "replacement",
    [
        {"tool": "fs__no_such_tool", "arguments": {}},
        {"tool": "fs__write_file", "arguments": {"path": 5}},
    ],
    ids=["unknown-tool", "arguments-fail-schema"],
)
async def test_invalid_replacement_under_replace_blocks(tmp_path: Path, replacement: dict[str, Any]) -> None:
    async with setup(
        tmp_path, lambda r: verdict(segment_length(r) - 1, "wrong", replacement), review={"on_reject": "replace"}
    ) as s:
        result = await s.write("a.txt")
        assert s.repair_requests() == []
    assert result.is_error
    assert "the replacement is not valid" in text_of(result)
    assert list(s.root.iterdir()) == [s.root / "notes.txt"]


async def test_model_timeout_fails_closed_within_the_configured_time(tmp_path: Path) -> None:
    async with setup(tmp_path, lambda r: Reply(content=verdict(1), delay_s=30), model={"timeout": 0.5}) as s:
        with anyio.fail_after(10):
            result = await s.write("a.txt")
    assert result.is_error
    assert "timed out after 0.5s" in text_of(result) and "failing closed" in text_of(result)
    assert not (s.root / "a.txt").exists()


async def test_model_http_error_fails_closed(tmp_path: Path) -> None:
    async with setup(tmp_path, lambda r: Reply(status=503)) as s:
        result = await s.write("a.txt")
    assert result.is_error and "HTTP 503" in text_of(result)
    assert not (s.root / "a.txt").exists()


async def test_reviewer_failure_forwards_only_when_on_error_allows(tmp_path: Path) -> None:
    async with setup(tmp_path, lambda r: Reply(status=500), review={"on_error": "allow"}) as s:
        result = await s.write("a.txt")
    assert not result.is_error
    assert (s.root / "a.txt").exists()


def schema_tokens(request: ChatRequest) -> int:
    return len(tokenize(json.dumps(request.response_format, ensure_ascii=False, separators=(",", ":"))))


async def test_reviews_in_a_session_share_the_stable_prefix(tmp_path: Path) -> None:
    async with setup(tmp_path, lambda r: verdict(segment_length(r))) as s:
        await s.p.client.call_tool("fs__read_text_file", {"path": str(s.root / "notes.txt")})
        await s.write("a.txt")
        await s.p.client.call_tool("fs__list_directory", {"path": str(s.root)})
        await s.write("b.txt")
        await s.write("c.txt")
        first, second, third = s.verify_requests()

    def committed_part(request: ChatRequest) -> list[dict[str, Any]]:
        """The messages before the segment's Step 1: instructions, data, the committed history."""
        start = next(i for i, m in enumerate(request.messages) if str(m["content"]).startswith("Step 1: "))
        return request.messages[:start]

    # The committed history is unnumbered and renders the same bytes in every later review: each
    # request starts with the previous one's messages up to its last committed step.
    assert json.dumps(second.messages[:2]) == json.dumps(first.messages[:2]) == json.dumps(committed_part(first))
    assert json.dumps(third.messages[: len(committed_part(second))]) == json.dumps(committed_part(second))
    assert [m["content"].split(" {", 1)[0] for m in committed_part(third) if m["role"] == "assistant"] == [
        "Committed call:"
    ] * 4  # the read, write a, the listing, write b
    # The segment is numbered from its own start, in its turns and in the block.
    assert [m["content"].split(" {", 1)[0] for m in third.messages[len(committed_part(third)) :]][:1] == ["Step 1:"]
    assert segment_length(second) == 2 and segment_length(third) == 1
    lines = [json.loads(line) for line in s.telemetry.read_text().splitlines()]
    calls = [line["model_calls"][0] for line in lines]
    assert calls[0]["cached_tokens"] == 0
    # The scripted server counts the verdict schema as prompt, after the messages (a grammar-bound
    # server does not): the messages before the segment are what the next review finds cached.
    assert calls[1]["cached_tokens"] > 0.8 * (calls[0]["prompt_tokens"] - schema_tokens(first))
    assert calls[2]["cached_tokens"] > 0.8 * (calls[1]["prompt_tokens"] - schema_tokens(second))
    assert all(call["prompt_tokens"] > 0 and call["completion_tokens"] > 0 for call in calls)


async def test_telemetry_has_one_line_per_decision_with_its_model_calls(tmp_path: Path) -> None:
    async with setup(tmp_path, lambda r: verdict(segment_length(r) - 1, "no")) as s:
        await s.write("a.txt")
    (line,) = [json.loads(text) for text in s.telemetry.read_text().splitlines()]
    assert line["kind"] == "decision" and line["action"] == "blocked"
    assert line["verdict"]["accepted"] is False and line["verdict"]["reason"] == "no"
    assert [step["tool"] for step in line["segment"]] == ["fs__write_file"]
    assert line["model_calls"][0]["purpose"] == "verify" and line["model_calls"][0]["role"] == "strong"


async def test_strong_then_human_asks_the_user_about_what_the_model_rejects(tmp_path: Path) -> None:
    asked: list[str] = []

    async def user(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with setup(
        tmp_path,
        lambda r: verdict(segment_length(r) - 1, "looks wrong to me"),
        review={"default": "strong_then_human"},
        elicitation=user,
    ) as s:
        result = await s.write("a.txt")
    assert not result.is_error
    assert (s.root / "a.txt").exists()
    assert "the strong reviewer rejected it: looks wrong to me" in asked[0]


async def test_a_verdict_accepting_every_step_runs_the_call_and_ignores_its_replacement(tmp_path: Path) -> None:
    """Accept wins: a replacement answers only a rejection, so one that comes with an acceptance of
    every step is dropped — the reviewer's call is the one it accepted, and nothing else runs."""

    def answer(request: ChatRequest) -> str:
        instead = {"tool": "fs__write_file", "arguments": {"path": str(tmp_path / "files" / "b.txt"), "content": "x"}}
        return verdict(segment_length(request), "fine", instead)

    async with setup(tmp_path, answer, review={"on_reject": "replace"}) as s:
        result = await s.write("a.txt", "hello")
    assert not result.is_error, text_of(result)
    assert (s.root / "a.txt").read_text() == "hello"
    assert not (s.root / "b.txt").exists()
    assert "replaced" not in text_of(result)
