"""The write barrier end to end: a real backend process behind the proxy, a real MCP client in front."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.errors import BACKEND_TIMEOUT
from tests.harness import ERAS, approve, call_error, proxied, recorded, text_of, toy

pytestmark = pytest.mark.anyio


def config(record: Path, review: dict[str, Any] | None = None, **server: Any) -> dict[str, Any]:
    return {"servers": {"toy": toy(record, **server)}, "review": review or {"default": "human"}}


def events(state_dir: Path) -> list[str]:
    path = state_dir / "audit.jsonl"
    return [event["event"] for event in read_audit(path)] if path.exists() else []


@pytest.mark.parametrize("mode", ERAS)
async def test_read_is_forwarded_at_once_without_review(tmp_path: Path, mode: str) -> None:
    async def must_not_ask(context: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("a read was sent for review")

    async with proxied(
        config(tmp_path / "rec"), tmp_path / "state", twins=True, mode=mode, elicitation=must_not_ask
    ) as p:
        result = await p.client.call_tool("toy__echo", {"text": "hello"})
    assert text_of(result) == "hello"
    assert not result.is_error
    assert events(tmp_path / "state") == ["read"]  # audited, never reviewed


async def test_write_is_not_forwarded_before_the_verdict(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    seen: dict[str, Any] = {}

    async def check_then_approve(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["on_disk_while_held"] = recorded(record)
        seen["audit_while_held"] = events(tmp_path / "state")
        seen["message"] = params.message
        return types.ElicitResult(action="accept", content={"approve": True})

    async with proxied(config(record), tmp_path / "state", twins=True, elicitation=check_then_approve) as p:
        await p.client.call_tool("toy__echo", {"text": "a"})
        result = await p.client.call_tool("toy__record", {"value": "v1", "intent": "the user asked to record v1"})

    assert not result.is_error, text_of(result)
    assert seen["on_disk_while_held"] == []
    assert seen["audit_while_held"] == ["read", "held"]
    assert "toy__record" in seen["message"] and "the user asked to record v1" in seen["message"]
    assert "Steps just before it: toy__echo" in seen["message"]
    assert [json.loads(line) for line in recorded(record)] == [{"value": "v1"}]  # intent stripped
    assert events(tmp_path / "state") == ["read", "held", "verdict", "forwarded"]


async def test_write_rejected_by_the_user_never_reaches_the_backend(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", twins=True, elicitation=approve(False, "wrong file")) as p:
        result = await p.client.call_tool("toy__record", {"value": "v1", "intent": "x"})
    assert result.is_error
    assert "rejected by the user: wrong file" in text_of(result)
    assert recorded(record) == []
    verdict = [e for e in read_audit(tmp_path / "state" / "audit.jsonl") if e["event"] == "verdict"]
    assert verdict[0]["accepted"] is False and verdict[0]["reviewer"] == "human"


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize(("policy", "forwarded"), [("allow", True), ("deny", False)])
async def test_allow_forwards_and_deny_blocks(tmp_path: Path, mode: str, policy: str, forwarded: bool) -> None:
    record = tmp_path / "rec"
    async with proxied(config(record, {"default": policy}), tmp_path / "state", twins=True, mode=mode) as p:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert bool(result.is_error) is not forwarded
    assert len(recorded(record)) == (1 if forwarded else 0)
    expected = ["held", "verdict", "forwarded"] if forwarded else ["held", "verdict", "blocked"]
    assert events(tmp_path / "state") == expected


@pytest.mark.parametrize("mode", ERAS)
async def test_client_that_cannot_be_asked_falls_back_to_deny(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", twins=True, mode=mode) as p:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert result.is_error
    assert "cannot ask the user" in text_of(result)
    assert recorded(record) == []


async def test_modern_client_approves_through_input_required(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    async with proxied(
        config(record), tmp_path / "state", twins=True, mode="2026-07-28", elicitation=approve(True)
    ) as p:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert not result.is_error, text_of(result)
    assert len(recorded(record)) == 1
    assert events(tmp_path / "state") == ["held", "awaiting-input", "held", "verdict", "forwarded"]


async def test_invalid_arguments_are_refused_before_review(tmp_path: Path) -> None:
    async def must_not_ask(context: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("invalid arguments reached the reviewer")

    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", twins=True, elicitation=must_not_ask) as p:
        result = await p.client.call_tool("toy__record", {"value": 5})
    assert result.is_error
    assert "intent" not in text_of(result)  # optional: a call valid for the backend is valid here
    assert "value: 5 is not of type 'string'" in text_of(result)
    assert recorded(record) == []
    assert events(tmp_path / "state") == []


async def test_unknown_tool_is_a_protocol_error(tmp_path: Path) -> None:
    async with proxied(config(tmp_path / "rec"), tmp_path / "state", twins=True) as p:
        with pytest.raises(MCPError, match="unknown tool 'toy__nope'"):
            await p.client.call_tool("toy__nope", {})


async def test_client_that_cancels_a_held_write_abandons_it(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    asked = anyio.Event()

    async def never_answer(context: Any, params: Any) -> types.ElicitResult:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with proxied(config(record), tmp_path / "state", twins=True, elicitation=never_answer) as p:
        abandoned = anyio.Event()
        record_event = p.proxy.audit.record

        async def spy(kind: str, **fields: Any) -> None:
            await record_event(kind, **fields)
            if kind == "abandoned":
                abandoned.set()

        p.proxy.audit.record = spy  # type: ignore[method-assign]
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.client.call_tool, "toy__record", {"value": "v", "intent": "x"})
            await asked.wait()
            tg.cancel_scope.cancel()
        with anyio.fail_after(10):
            await abandoned.wait()
        # The session goes on, and the abandoned write never turns up later.
        assert text_of(await p.client.call_tool("toy__echo", {"text": "still here"})) == "still here"
    assert recorded(record) == []
    assert events(tmp_path / "state") == ["held", "abandoned", "read"]


async def test_held_call_sends_progress_to_a_client_that_asked(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    progressed = anyio.Event()
    messages: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message)
        progressed.set()

    async def approve_after_progress(context: Any, params: Any) -> types.ElicitResult:
        with anyio.fail_after(10):
            await progressed.wait()
        return types.ElicitResult(action="accept", content={"approve": True})

    async with proxied(config(record), tmp_path / "state", twins=True, elicitation=approve_after_progress) as p:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"}, progress_callback=on_progress)
    assert not result.is_error
    assert messages and "held for review (human)" in str(messages[0])


async def test_reviewer_failure_fails_closed(tmp_path: Path) -> None:
    async def broken(context: Any, params: Any) -> types.ErrorData:
        return types.ErrorData(code=-32603, message="the dialog crashed")

    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", twins=True, elicitation=broken) as p:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert result.is_error
    assert "failing closed" in text_of(result)
    assert recorded(record) == []


async def test_review_timeout_fails_closed_within_the_configured_time(tmp_path: Path) -> None:
    async def never_answer(context: Any, params: Any) -> types.ElicitResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    record = tmp_path / "rec"
    review = {"default": "human", "timeout": 0.5}
    async with proxied(config(record, review), tmp_path / "state", twins=True, elicitation=never_answer) as p:
        with anyio.fail_after(10):
            result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert result.is_error
    assert "timed out after 0.5s" in text_of(result)
    assert recorded(record) == []


async def test_backend_progress_reaches_the_client(tmp_path: Path) -> None:
    updates: list[tuple[float, float | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total))

    async with proxied(config(tmp_path / "rec"), tmp_path / "state", twins=True) as p:
        result = await p.client.call_tool("toy__progress", {}, progress_callback=on_progress)
    assert text_of(result) == "done"
    assert updates == [(1, 3), (2, 3), (3, 3)]


async def test_backend_that_does_not_answer_in_time_gives_a_clear_error(tmp_path: Path) -> None:
    async with proxied(config(tmp_path / "rec", timeout=0.5), tmp_path / "state", twins=True) as p:
        with anyio.fail_after(10):
            error = await call_error(p.client, "toy__hang", {})
        assert error.code == BACKEND_TIMEOUT
        assert "backend 'toy' did not answer tools/call hang within 0.5s" in error.message
        assert text_of(await p.client.call_tool("toy__echo", {"text": "ok"})) == "ok"


async def test_per_tool_override_routes_review(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    cfg = config(record, {"default": "deny"}, tools={"overrides": {"record": {"review": "allow"}}})
    async with proxied(cfg, tmp_path / "state", twins=True) as p:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert not result.is_error
    assert len(recorded(record)) == 1


@pytest.mark.parametrize("backend_era", ["--legacy-only", "--modern"])
async def test_client_cancellation_reaches_the_backend(tmp_path: Path, backend_era: str) -> None:
    flags = [backend_era] if backend_era == "--legacy-only" else []
    cfg = {"servers": {"toy": toy(tmp_path / "rec", *flags)}}
    async with proxied(cfg, tmp_path / "state", twins=True) as p:
        with anyio.move_on_after(0.5):
            await p.client.call_tool("toy__hang", {})
        assert text_of(await p.client.call_tool("toy__was_cancelled", {})) == "true"
