"""Steps are values: a segment a reviewer was shown never changes after it is made, and what a
call returned lands in one place, the history that owns the trajectory.

Tried at each door that used to write a result into a shared step: the MCP front's write (the
gate's forward), the engine's verified segment, and a person's edit of a call's arguments. The
ground truth of what ran is the toy backend's ledger, or the executor's.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditLog
from mcp_spec_proxy.calls.gate import Gate, GateCall
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.review import ReviewerKind, ReviewRequest, Verdict
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.harness import Proxied, proxied, segment_length, toy, verdict

pytestmark = pytest.mark.anyio


def ran(ledger: Path) -> list[Any]:
    """The writes the toy backend really ran, as it recorded them."""
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


class NoUser:
    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


@asynccontextmanager
async def shown_segments(p: Proxied) -> AsyncIterator[list[tuple[Segment, Segment]]]:
    """Every segment handed to the gate for a verdict, with a deep copy taken as it was handed."""
    gate = p.proxy.gate
    seen: list[tuple[Segment, Segment]] = []
    write = gate.write

    async def spy(call: GateCall, *args: Any, **kwargs: Any) -> Any:
        seen.append((call.request.segment, copy.deepcopy(call.request.segment)))
        return await write(call, *args, **kwargs)

    gate.write = spy  # type: ignore[method-assign]  # a spy in the gate's own door, for this test only
    yield seen


def test_a_step_of_a_segment_cannot_be_changed() -> None:
    segment = Segment((Step("fs__read", {"p": 1}, "read"), Step("fs__write", {"p": 1}, "write")))

    for field, value in (("observation", "forged"), ("is_error", True), ("arguments", {}), ("state", None)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(segment.held, field, value)
    ran = segment.held.observed("wrote it", duration_s=0.5)
    assert segment.held.observation is None and ran.observation == "wrote it" and ran.arguments == {"p": 1}


def test_the_history_hands_out_no_list_to_append_to() -> None:
    history = History(commit_every=None)
    history.record_read(Step("fs__read", {}, "read"))

    assert isinstance(history.committed, tuple) and isinstance(history.open, tuple)
    assert list(history.committed) == []  # `commit_every=None`: only its owner commits, by `commit`
    history.commit(*history.open)
    assert [step.tool for step in history.committed] == ["fs__read"]


async def test_a_segment_the_reviewer_saw_is_unchanged_after_its_write_ran(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    async with proxied(config, tmp_path / "state") as p, shown_segments(p) as seen:
        barrier = p.proxy.barrier
        session = barrier.new_session()
        with anyio.fail_after(30):
            await barrier.call(session, "toy__echo", {"text": "first"}, NoUser())
            result = await barrier.call(session, "toy__record", {"value": "v1"}, NoUser())
    assert not result.is_error and ran(ledger) == [{"value": "v1"}]
    [(segment, as_handed)] = seen
    assert segment == as_handed and segment.held.observation is None
    # The result landed in the session's history alone: the held call commits as it ran.
    echo, held = session.history.committed
    assert (echo.tool, echo.observation) == ("toy__echo", "first")
    assert held.tool == "toy__record" and held.observation is not None and not held.is_error
    assert held.arguments == segment.held.arguments and held is not segment.held


def drafting_then_writing(request: ChatRequest) -> Reply | str:
    """The weak model reads, then writes, then answers; the verifier accepts every segment."""
    if request.json_schema is not None:
        return verdict(segment_length(request))
    ran = sum(message.get("role") == "tool" for message in request.messages)
    if ran == 0:
        return Reply(tool_calls=[ToolCall("toy__echo", {"text": "seen"})])
    if ran == 1:
        return Reply(tool_calls=[ToolCall("toy__record", {"value": "v2"})])
    return "done"


async def test_the_engine_commits_what_ran_and_leaves_the_verified_segment_as_it_was(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    async with ScriptedModelServer(Respond(drafting_then_writing)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        config = {
            "servers": {"toy": toy(ledger)},
            "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
            "review": {"default": "strong", "intent": False},
        }
        async with proxied(config, tmp_path / "state") as p, shown_segments(p) as seen:
            assert p.proxy.engine is not None
            with anyio.fail_after(60):
                result = await p.proxy.engine.run("record v2", "spec")
    assert result.status == "answered" and ran(ledger) == [{"value": "v2"}]
    [(segment, as_handed)] = seen
    assert segment == as_handed and [step.tool for step in segment.steps] == ["toy__echo", "toy__record"]
    assert segment.held.observation is None
    echo, held = result.steps  # the run's history: the only place the write's result landed
    assert echo == segment.steps[0] and echo.observation == "seen"
    assert held.tool == "toy__record" and held.observation is not None and held is not segment.held


class Edits:
    """A person who approves the call with other arguments (the approval console's edit)."""

    by = ReviewerKind.HUMAN.chain

    async def review(self, request: ReviewRequest, user: Any) -> Verdict:
        return Verdict(True, "approved, edited", len(request.segment), by=self.by, arguments={"v": 2})


async def test_an_edited_call_runs_as_a_new_step_and_the_reviewed_segment_keeps_what_was_sent() -> None:
    config = ProxyConfig.model_validate({"servers": {}, "review": {"default": "human"}})

    async def no_listing(server: str, listing: Any) -> None:
        return None

    gate = Gate(config, BackendPool({}, no_listing), {"human": Edits()}, AuditLog(None))
    definition = types.Tool(name="t__w", input_schema={"type": "object"})
    tool = CatalogTool("t__w", "t", "w", definition, "write", "default", "unannotated", None, None, "", False)
    held = Step(tool.name, {"v": 1}, "write")
    request = ReviewRequest("s", tool, {"v": 1}, None, Segment((held,)), History())
    call = GateCall("s", tool, {"v": 1}, "client", request)
    ledger: list[dict[str, Any]] = []

    async def executor(tool: CatalogTool, arguments: dict[str, Any], report: Any) -> types.CallToolResult:
        ledger.append(arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text="ran")])

    with anyio.fail_after(10):
        outcome = await gate.write(call, NoUser(), executor=executor, step=held)
    assert ledger == [{"v": 2}]
    assert outcome.step is not None and outcome.step.arguments == {"v": 2} and outcome.step.observation == "ran"
    assert held.arguments == {"v": 1} and held.observation is None  # the step the person was shown
    assert request.segment.held is held and call.arguments == {"v": 1}
