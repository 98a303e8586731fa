"""The SpecAgent engine with scripted weak and strong models and the real filesystem server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from mcp_spec_proxy.engine import Engine, RunResult
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests import backends
from tests.harness import PROXY_COMMAND, Proxied, proxied, segment_length, stdio, verdict

pytestmark = pytest.mark.anyio


def call(name: str, **arguments: Any) -> Reply:
    return Reply(tool_calls=[ToolCall(name, arguments)])


@dataclass
class World:
    p: Proxied
    server: ScriptedModelServer
    root: Path
    telemetry: Path

    @property
    def engine(self) -> Engine:
        assert self.p.proxy.engine is not None
        return self.p.proxy.engine

    def by(self, model: str, purpose: str | None = None) -> list[ChatRequest]:
        found = [r for r in self.server.chat_requests if r.model == model]
        if purpose == "verify":
            return [r for r in found if r.json_schema is not None]
        if purpose == "repair":
            return [r for r in found if r.tools and r.json_schema is None]
        return found


@asynccontextmanager
async def world(
    tmp_path: Path,
    weak: list[Reply | str],
    strong: Callable[[ChatRequest], Reply | str],
    **speculation: Any,
) -> AsyncIterator[World]:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("buy milk\n")
    (root / "other.txt").write_text("unrelated\n")
    drafts = iter(weak)

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return next(drafts)
        return strong(request)

    telemetry = tmp_path / "telemetry.jsonl"
    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        config = {
            "servers": {"fs": stdio(backends.filesystem(root))},
            "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
            "review": {"default": "strong"},
            "speculation": speculation,
        }
        async with proxied(config, tmp_path / "state", telemetry=telemetry) as p:
            yield World(p, server, root, telemetry)


def summary(result: RunResult) -> dict[str, Any]:
    return result.summary()


async def test_reads_then_an_accepted_write_commit_with_exactly_one_strong_call(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [
        call("fs__read_text_file", path=notes),
        call("fs__write_file", path=str(tmp_path / "files" / "todo.txt"), content="buy milk"),
        "I copied your notes into todo.txt.",
    ]
    async with world(tmp_path, weak, lambda r: verdict(segment_length(r))) as w:
        result = await w.engine.run("Copy my notes into todo.txt")
        verify = w.by("strong-model", "verify")
    assert result.status == "answered" and result.answer == "I copied your notes into todo.txt."
    assert (w.root / "todo.txt").read_text() == "buy milk"
    assert len(w.by("strong-model")) == 1 and len(verify) == 1
    assert verify[0].chat_template_kwargs == {"enable_thinking": False}
    assert segment_length(verify[0]) == 2
    assert [s.tool for s in result.steps] == ["fs__read_text_file", "fs__write_file"]
    assert summary(result)["acceptance"] == 1.0


async def test_rejection_at_step_j_commits_j_steps_and_repairs_with_one_more_strong_call(tmp_path: Path) -> None:
    notes, other = str(tmp_path / "files" / "notes.txt"), str(tmp_path / "files" / "other.txt")
    weak: list[Reply | str] = [
        call("fs__list_directory", path=str(tmp_path / "files")),
        call("fs__read_text_file", path=other),  # the wrong file: step 2
        call("fs__write_file", path=str(tmp_path / "files" / "todo.txt"), content="unrelated"),
        call("fs__write_file", path=str(tmp_path / "files" / "todo.txt"), content="buy milk"),
        "Done.",
    ]
    verdicts: Iterator[Callable[[ChatRequest], str]] = iter(
        [
            lambda r: verdict(1, "read the notes, not other.txt"),
            lambda r: verdict(segment_length(r)),
        ]
    )

    def strong(request: ChatRequest) -> Reply | str:
        if request.tools and request.json_schema is None:  # the repair turn
            return Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": notes})], reasoning="the notes")
        return next(verdicts)(request)

    async with world(tmp_path, weak, strong) as w:
        result = await w.engine.run("Copy my notes into todo.txt")
        strong_calls = w.by("strong-model")
        repair = w.by("strong-model", "repair")
        later_drafts = w.by("weak-model")[3:]
    assert [s.tool for s in result.steps] == [
        "fs__list_directory",  # j = 1 step committed
        "fs__read_text_file",  # the repaired step 2
        "fs__write_file",
    ]
    assert result.steps[1].arguments == {"path": notes}
    assert len(strong_calls) == 3  # verify, repair, verify
    assert len(repair) == 1 and repair[0].chat_template_kwargs == {"enable_thinking": True}
    # The rejected suffix is gone from what the weak model sees afterwards.
    assert all("unrelated" not in json.dumps(r.messages) for r in later_drafts)
    assert (w.root / "todo.txt").read_text() == "buy milk"
    assert summary(result)["repairs"] == 1


async def test_k_reads_without_a_write_commit_without_a_strong_call(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [call("fs__read_text_file", path=notes) for _ in range(3)] + ["You need milk."]
    async with world(tmp_path, weak, lambda r: verdict(0, "should not be asked"), draft_steps=3) as w:
        result = await w.engine.run("What is on my list?")
        strong_calls = w.by("strong-model")
    assert result.status == "answered" and result.answer == "You need milk."
    assert strong_calls == []
    assert len(result.steps) == 3


async def test_several_reads_in_one_turn_run_concurrently_and_all_commit(tmp_path: Path) -> None:
    files = tmp_path / "files"
    weak: list[Reply | str] = [
        Reply(
            tool_calls=[
                ToolCall("fs__read_text_file", {"path": str(files / "notes.txt")}),
                ToolCall("fs__read_text_file", {"path": str(files / "other.txt")}),
            ]
        ),
        "Both read.",
    ]
    async with world(tmp_path, weak, lambda r: verdict(0)) as w:
        result = await w.engine.run("Read both files")
    assert [s.observation for s in result.steps] == ["buy milk\n", "unrelated\n"]


async def test_held_final_answer_is_verified(tmp_path: Path) -> None:
    weak: list[Reply | str] = ["The answer is 41."]
    better = {"tool": "final_answer", "arguments": {"answer": "The answer is 42."}}
    async with world(tmp_path, weak, lambda r: verdict(0, "off by one", better), answer_graded=True) as w:
        result = await w.engine.run("What is six times seven?")
        verify = w.by("strong-model", "verify")
    assert len(verify) == 1
    assert '"tool": "final_answer"' in verify[0].last_user_text
    assert result.answer == "The answer is 42."
    assert summary(result)["replacements"] == 1


async def test_weak_only_and_strong_only_are_policies_of_the_same_loop(tmp_path: Path) -> None:
    target = str(tmp_path / "files" / "x.txt")
    weak: list[Reply | str] = [call("fs__write_file", path=target, content="weak"), "weak done"]
    strong_steps: Iterator[Reply | str] = iter([call("fs__write_file", path=target, content="strong"), "strong done"])
    async with world(tmp_path, weak, lambda r: next(strong_steps)) as w:
        weak_only = await w.engine.run("Write x", mode="weak-only", baseline=True)
        assert (w.root / "x.txt").read_text() == "weak"
        assert w.by("strong-model") == []
        strong_only = await w.engine.run("Write x", mode="strong-only", baseline=True)
        assert (w.root / "x.txt").read_text() == "strong"
        assert len(w.by("weak-model")) == 2
        assert w.by("strong-model")[0].chat_template_kwargs == {"enable_thinking": True}
    assert weak_only.answer == "weak done" and strong_only.answer == "strong done"
    assert summary(strong_only)["weak_calls"] == 0 and summary(weak_only)["strong_calls"] == 0


async def test_limits_end_the_task_with_a_clear_status(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [call("fs__read_text_file", path=notes) for _ in range(10)]
    async with world(tmp_path, weak, lambda r: verdict(0), max_steps=3, draft_steps=1) as w:
        result = await w.engine.run("Loop forever")
    assert result.status == "max_steps" and result.answer is None
    assert len(result.steps) == 3


async def test_drafted_call_to_an_unknown_tool_is_shown_to_the_model_as_an_error(tmp_path: Path) -> None:
    weak: list[Reply | str] = [call("fs__no_such_tool"), "gave up"]
    async with world(tmp_path, weak, lambda r: verdict(0)) as w:
        result = await w.engine.run("Do a thing")
        second = w.by("weak-model")[1]
    assert result.answer == "gave up"
    assert "unknown tool 'fs__no_such_tool'" in json.dumps(second.messages)


async def test_each_task_ends_with_a_summary_line_and_every_model_call_is_logged(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [call("fs__read_text_file", path=notes), "milk"]
    async with world(tmp_path, weak, lambda r: verdict(0)) as w:
        await w.engine.run("What do I need?")
    lines = [json.loads(line) for line in w.telemetry.read_text().splitlines()]
    calls = [line for line in lines if line["kind"] == "model_call"]
    (task,) = [line for line in lines if line["kind"] == "task"]
    assert len(calls) == 2 and all(c["role"] == "weak" and c["decode_tokens"] > 0 for c in calls)
    assert all(c["prefill_tokens"] == c["prompt_tokens"] - c["cached_tokens"] for c in calls)
    assert task["status"] == "answered" and task["steps"] == 1 and task["weak_calls"] == 2
    assert task["strong_calls"] == 0 and task["wall_s"] > 0


async def test_delegate_tool_runs_a_task_and_reports_progress(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [call("fs__read_text_file", path=notes), "You need milk."]
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)

    async with world(tmp_path, weak, lambda r: verdict(0)) as w:
        listed = {tool.name: tool for tool in (await w.p.client.list_tools()).tools}
        result = await w.p.client.call_tool("delegate", {"task": "What do I need?"}, progress_callback=on_progress)
        bad = await w.p.client.call_tool("delegate", {"task": "x", "mode": "fastest"})
    assert listed["delegate"].input_schema["required"] == ["task"]
    assert not result.is_error
    texts = [block.text for block in result.content if hasattr(block, "text")]
    assert texts[0] == "You need milk."
    assert "1. fs__read_text_file" in texts[1] and "status answered" in texts[1]
    assert "read fs__read_text_file" in messages
    assert bad.is_error and "mode must be one of spec, weak-only, strong-only" in str(bad.content[0])


async def test_delegate_is_cancelled_with_its_call(tmp_path: Path) -> None:
    weak: list[Reply | str] = [Reply(content="too late", delay_s=30)]
    async with world(tmp_path, weak, lambda r: verdict(0)) as w:
        with anyio.move_on_after(1) as scope:
            await w.p.client.call_tool("delegate", {"task": "slow"})
        assert scope.cancelled_caught
        # The proxy keeps serving after the cancelled run.
        listed = await w.p.client.list_tools()
    assert any(tool.name == "fs__read_text_file" for tool in listed.tools)


async def test_cli_run_prints_the_answer_and_a_summary(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("buy milk\n")
    drafts: Iterator[Reply | str] = iter([call("fs__read_text_file", path=str(root / "notes.txt")), "You need milk."])

    def answer(request: ChatRequest) -> Reply | str:
        return next(drafts) if request.model == "weak-model" else verdict(0)

    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        config = {
            "servers": {"fs": stdio(backends.filesystem(root))},
            "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
        }
        (tmp_path / "servers.yaml").write_text(yaml.safe_dump(config))
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [
                    PROXY_COMMAND,
                    "run",
                    "What do I need?",
                    "--config",
                    str(tmp_path / "servers.yaml"),
                    "--state-dir",
                    str(tmp_path / "state"),
                ],
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "You need milk."
    stderr = done.stderr.decode()
    assert "… read fs__read_text_file" in stderr
    assert "status=answered  mode=spec  steps=1" in stderr and "strong_calls=0" in stderr


async def test_an_unreadable_verification_stops_the_segment_and_runs_no_repair(tmp_path: Path) -> None:
    """A failed verification is no rejection: nothing is repaired, nothing written (the backend's
    files are the ledger), and the task ends saying why."""
    weak: list[Reply | str] = [
        call("fs__write_file", path=str(tmp_path / "files" / "notes.txt"), content="overwritten"),
        "Done.",
    ]

    def strong(request: ChatRequest) -> Reply | str:
        if request.tools and request.json_schema is None:  # a repair turn: it must never come
            return Reply(
                tool_calls=[ToolCall("fs__write_file", {"path": str(tmp_path / "files" / "x"), "content": "r"})]
            )
        return "this is not a verdict"

    async with world(tmp_path, weak, strong) as w:
        result = await w.engine.run("Tidy my notes")
        repairs = w.by("strong-model", "repair")
    assert repairs == []
    assert (w.root / "notes.txt").read_text() == "buy milk\n"
    assert not (w.root / "x").exists()
    assert result.status == "model_error" and "the verification failed" in (result.error or "")
    assert summary(result)["repairs"] == 0
