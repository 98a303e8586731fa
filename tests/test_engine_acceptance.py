"""What the engine reports as acceptance, and how many drafted calls one segment runs, from outside.

Scripted weak and strong models over real HTTP, and an in-process backend whose ledger records
every call it really ran (reads too): a failed draft (an unknown tool, arguments its schema
refuses, a reply that is no action) never counts as accepted, whatever a reviewer says of the
segment it sits in; acceptance is the judged steps' accepted share, reads committed without
review left out; and one weak turn with more calls than K runs K of them, the rest dropped and
the model told.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.server import Server

from mcp_spec_proxy.engine import Engine, RunResult
from mcp_spec_proxy.prompts import review_steps
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import proxied, segment_length, verdict

pytestmark = pytest.mark.anyio

TEXT = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


class Shelf:
    """An in-process backend: `look` (a read) and `save` (a write); the ledger has every call it ran."""

    def __init__(self) -> None:
        self.ledger: list[tuple[str, str]] = []

    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        read, write = types.ToolAnnotations(read_only_hint=True), types.ToolAnnotations(read_only_hint=False)
        return types.ListToolsResult(
            tools=[
                types.Tool(name="look", description="Look a thing up.", input_schema=TEXT, annotations=read),
                types.Tool(name="save", description="Save a thing.", input_schema=TEXT, annotations=write),
            ]
        )

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text"))
        self.ledger.append((params.name, text))
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"{params.name}: {text}")])

    def looks(self) -> list[str]:
        return [text for name, text in self.ledger if name == "look"]

    def server(self) -> Server[Any]:
        return Server("shelf", on_list_tools=self.list_tools, on_call_tool=self.call_tool)


def look(*texts: str) -> Reply:
    """One weak turn that makes these reads."""
    return Reply(tool_calls=[ToolCall("shelf__look", {"text": t}) for t in texts])


def save(text: str) -> ToolCall:
    return ToolCall("shelf__save", {"text": text})


@dataclass
class World:
    shelf: Shelf
    server: ScriptedModelServer
    engine: Engine
    telemetry: Path

    def drafts(self) -> list[ChatRequest]:
        return [r for r in self.server.chat_requests if r.model == "weak-model"]

    def reviews(self) -> list[ChatRequest]:
        return [r for r in self.server.chat_requests if r.model == "strong-model" and r.json_schema is not None]

    def task_line(self) -> dict[str, Any]:
        (line,) = [e for e in map(json.loads, self.telemetry.read_text().splitlines()) if e["kind"] == "task"]
        return dict(line)


@asynccontextmanager
async def world(
    tmp_path: Path,
    weak: list[Reply | str],
    strong: Callable[[ChatRequest], Reply | str],
    *,
    weak_model: dict[str, Any] | None = None,
    **speculation: Any,
) -> AsyncIterator[World]:
    shelf = Shelf()
    drafts = iter(weak)

    def answer(request: ChatRequest) -> Reply | str:
        return next(drafts) if request.model == "weak-model" else strong(request)

    telemetry = tmp_path / "telemetry.jsonl"
    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        config = {
            "servers": {"shelf": {"command": sys.executable, "args": ["-c", "pass"]}},
            "models": {
                "weak": {**endpoint, "model": "weak-model", **(weak_model or {})},
                "strong": {**endpoint, "model": "strong-model"},
            },
            "review": {"default": "strong"},
            "speculation": speculation,
        }
        async with proxied(config, tmp_path / "state", telemetry=telemetry, in_process={"shelf": shelf.server()}) as p:
            assert p.proxy.engine is not None
            yield World(shelf, server, p.proxy.engine, telemetry)


def accept_all(request: ChatRequest) -> str:
    """A reviewer that accepts whatever segment it is shown."""
    return verdict(segment_length(request))


async def run(w: World, task: str) -> RunResult:
    with anyio.fail_after(60):
        return await w.engine.run(task)


# -- failed drafts -----------------------------------------------------------------------------


async def test_a_run_whose_drafts_all_fail_reports_acceptance_zero_and_runs_nothing(tmp_path: Path) -> None:
    weak: list[Reply | str] = [
        Reply(tool_calls=[ToolCall("shelf__nope", {"text": "a"})]),  # no such tool
        Reply(tool_calls=[ToolCall("shelf__look", {"txt": "b"})]),  # arguments its schema refuses
        Reply(tool_calls=[ToolCall("shelf__save", {"text": 3})]),  # a write with arguments it refuses
        "I did it.",
    ]
    async with world(tmp_path, weak, accept_all) as w:
        result = await run(w, "Save the thing")
        task = w.task_line()
    assert w.shelf.ledger == []
    summary = result.summary()
    assert summary["acceptance"] == 0.0 and task["acceptance"] == 0.0
    assert summary["accepted_steps"] == 0 and summary["failed_steps"] == 3


async def test_unparseable_json_actions_are_failures_not_accepted_reads(tmp_path: Path) -> None:
    weak: list[Reply | str] = [
        "{this is not json",
        '{"tool": "shelf__nope", "arguments": {}}',
        '{"neither": "a call nor an answer"}',
        '{"answer": "I did it."}',
    ]
    async with world(tmp_path, weak, accept_all, weak_model={"actions": "json"}) as w:
        result = await run(w, "Save the thing")
    assert result.answer == "I did it."
    assert w.shelf.ledger == []
    assert result.summary()["acceptance"] == 0.0 and result.summary()["failed_steps"] == 3


async def test_a_reviewer_that_accepts_a_segment_does_not_make_its_failed_drafts_accepted(tmp_path: Path) -> None:
    weak: list[Reply | str] = [
        Reply(tool_calls=[ToolCall("shelf__nope", {"text": "a"})]),
        Reply(tool_calls=[ToolCall("shelf__look", {"txt": "b"})]),
        Reply(tool_calls=[save("c")]),
        "Saved.",
    ]
    async with world(tmp_path, weak, accept_all) as w:
        result = await run(w, "Save c")
        (review,) = w.reviews()
    assert segment_length(review) == 3  # the reviewer was shown both failures and the write, and took them all
    assert w.shelf.ledger == [("save", "c")]
    summary = result.summary()
    # Only the write was a step to judge; the two failures are failures, whatever the verdict said.
    assert (summary["judged_steps"], summary["failed_steps"], summary["accepted_steps"]) == (1, 2, 1)
    assert summary["acceptance"] == round(1 / 3, 4)


# -- K bounds each segment ---------------------------------------------------------------------


async def test_a_weak_turn_with_k_plus_3_reads_runs_k_of_them_before_the_verify(tmp_path: Path) -> None:
    seen_at_review: list[list[str]] = []

    def strong(request: ChatRequest) -> str:
        seen_at_review.append(w.shelf.looks())  # what the backend had run when the verifier was asked
        return accept_all(request)

    weak: list[Reply | str] = [
        Reply(tool_calls=[ToolCall("shelf__look", {"text": f"r{n}"}) for n in range(1, 7)] + [save("x")]),
        Reply(tool_calls=[save("x")]),
        "Saved.",
    ]
    async with world(tmp_path, weak, strong, draft_steps=3) as w:
        result = await run(w, "Look things up, then save x")
        drafts = w.drafts()
        reviews = w.reviews()
    assert seen_at_review == [["r1", "r2", "r3"]]  # K = 3 of the turn's six reads, and not one more
    assert w.shelf.ledger == [("look", "r1"), ("look", "r2"), ("look", "r3"), ("save", "x")]
    # The three reads committed as a chunk; the write, drafted again, was verified alone.
    assert [segment_length(r) for r in reviews] == [1]
    # The model was told, in its next draft, which calls did not run.
    told = str(drafts[1].messages[-1]["content"])
    assert drafts[1].messages[-1]["role"] == "user" and "did not run" in told
    assert all(f"r{n}" in told for n in (4, 5, 6)) and "shelf__save" in told
    assert all(f"r{n}" not in told for n in (1, 2, 3))  # those ran: their results are in the history
    assert result.summary()["dropped_calls"] == 4


async def test_k_bounds_a_segment_drafted_over_several_turns(tmp_path: Path) -> None:
    weak: list[Reply | str] = [
        look("a", "b"),
        Reply(tool_calls=[ToolCall("shelf__look", {"text": "c"}), ToolCall("shelf__look", {"text": "d"}), save("x")]),
        Reply(tool_calls=[save("x")]),
        "Saved.",
    ]
    async with world(tmp_path, weak, accept_all, draft_steps=3) as w:
        await run(w, "Look things up, then save x")
        reviews = w.reviews()
    assert w.shelf.looks() == ["a", "b", "c"]  # the second turn had room for one more step
    assert [segment_length(r) for r in reviews] == [1]
    assert w.shelf.ledger[-1] == ("save", "x")


async def test_calls_after_a_held_write_are_dropped_and_the_model_is_told(tmp_path: Path) -> None:
    weak: list[Reply | str] = [
        Reply(tool_calls=[ToolCall("shelf__look", {"text": "a"}), save("x"), ToolCall("shelf__look", {"text": "z"})]),
        "Saved.",
    ]
    async with world(tmp_path, weak, accept_all) as w:
        await run(w, "Look a up, then save x")
        drafts = w.drafts()
    assert w.shelf.ledger == [("look", "a"), ("save", "x")]
    told = str(drafts[1].messages[-1]["content"])
    assert "did not run" in told and '"z"' in told


# -- acceptance is the judged steps' accepted share --------------------------------------------


async def test_a_normal_runs_acceptance_equals_judged_accepted_over_judged(tmp_path: Path) -> None:
    judged: list[tuple[int, int]] = []  # (steps shown, steps accepted) per verdict, as the reviewer gave them

    def strong(request: ChatRequest) -> str:
        _, numbered = review_steps(request.messages)
        shown = segment_length(request)
        if numbered[-1].arguments.get("text") == "wrong":
            judged.append((shown, shown - 1))
            return verdict(shown - 1, "save the right thing", {"tool": "shelf__save", "arguments": {"text": "right"}})
        judged.append((shown, shown))
        return verdict(shown)

    weak: list[Reply | str] = [
        look("a"),
        look("b"),
        Reply(tool_calls=[save("wrong")]),  # segment 1: two reads and a write, rejected at the write
        look("c", "d", "e"),  # segment 2: K reads, committed without review
        Reply(tool_calls=[save("more")]),  # segment 3: a write, accepted
        "Done.",
    ]
    async with world(tmp_path, weak, strong, draft_steps=3) as w:
        result = await run(w, "Save the right things")
        task = w.task_line()
    assert w.shelf.ledger == [
        *(("look", t) for t in "ab"),
        ("save", "right"),
        *(("look", t) for t in "cde"),
        ("save", "more"),
    ]
    assert judged == [(3, 2), (1, 1)]
    expected = round(sum(a for _, a in judged) / sum(s for s, _ in judged), 4)
    assert expected == 0.75
    summary = result.summary()
    assert summary["acceptance"] == expected and task["acceptance"] == expected
    assert (summary["judged_steps"], summary["accepted_steps"], summary["failed_steps"]) == (4, 3, 0)
