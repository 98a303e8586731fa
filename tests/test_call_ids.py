"""Call ids and idempotency keys, attacked from outside with the toy's ledger as ground truth.

A client learns each call's id (`_meta["mcp-spec-proxy/call"]`, as the audit names it) on both
paths, reads included; an audit line that cannot be written is told for what it is — before the
forward the write is refused and nothing ran, after it the backend's real result stands and the
line is written late, never lost; a call replayed with the same idempotency key, one after the
other or at once, runs once in the ledger, whether the front's memory or the gate's claim stops it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.session import ElicitationFnT

from mcp_spec_proxy.calls.audit import AuditLog, AuditSink, read_audit
from mcp_spec_proxy.calls.results import AUDIT_META, CALL_META, FIRST_META
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import CALL_REPLAYED, StateError
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.fronts.replays import KEY_META, Replays
from mcp_spec_proxy.proxy import Proxy, StatePaths, running_proxy
from tests.harness import ERAS, approve, recorded, request_meta, text_of, toy, toy_twins

pytestmark = pytest.mark.anyio


def world(ledger: Path, review: str = "allow") -> dict[str, Any]:
    return {"servers": {"toy": toy(ledger)}, "review": {"default": review, "intent": False}}


@asynccontextmanager
async def served(
    config: dict[str, Any], state: Path, *, mode: str = "legacy", elicitation: ElicitationFnT | None = None
) -> AsyncIterator[tuple[Client, McpFront, Proxy]]:
    """The proxy with its toy twin, and a client on its front (the front is the test's to reach)."""
    with anyio.fail_after(60):
        async with running_proxy(
            ProxyConfig.model_validate(config), StatePaths(state), in_process=toy_twins(config)
        ) as proxy:
            front = McpFront(proxy)
            async with Client(front.server, mode=mode, elicitation_callback=elicitation) as client:
                yield client, front, proxy


class FailingOnce:
    """The proxy's audit sink, except that its first `kind` line fails as a full disk would."""

    def __init__(self, inner: AuditSink, kind: str) -> None:
        self.inner = inner
        self.kind = kind
        self.failed = False

    async def record(self, kind: str, **fields: Any) -> None:
        if kind == self.kind and not self.failed:
            self.failed = True
            raise StateError("cannot append to audit.jsonl: No space left on device")
        await self.inner.record(kind, **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def audit(state: Path) -> list[dict[str, Any]]:
    return [line for line in read_audit(state / "audit.jsonl") if line["event"] != "claimed"]


def call_of(result: types.CallToolResult) -> str:
    assert result.meta is not None and isinstance(result.meta.get(CALL_META), str), result.meta
    return str(result.meta[CALL_META])


@pytest.mark.parametrize("mode", ERAS)
async def test_every_result_names_its_call_as_the_audit_does_on_both_paths(tmp_path: Path, mode: str) -> None:
    ledger = tmp_path / "ledger"
    async with served(world(ledger), tmp_path / "state", mode=mode) as (client, _, _):
        read = await client.call_tool("toy__echo", {"text": "hi"})  # the lean path
        wrote = await client.call_tool("toy__record", {"value": "one"})  # the SDK's path, through the gate
    lines = audit(tmp_path / "state")
    assert text_of(read) == "hi" and not wrote.is_error
    assert [line["call"] for line in lines if line["event"] == "read"] == [call_of(read)]
    assert {line["call"] for line in lines if line["event"] != "read"} == {call_of(wrote)}
    assert call_of(read) != call_of(wrote)


async def test_an_audit_line_lost_after_the_forward_leaves_the_real_result_and_is_written_late(
    tmp_path: Path,
) -> None:
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    async with served(world(ledger), state) as (client, _, proxy):
        proxy.gate._audit = FailingOnce(proxy.gate._audit, "forwarded")
        ran = await client.call_tool("toy__record", {"value": "once"})
        await client.call_tool("toy__record", {"value": "next"})  # the disk takes lines again
        assert isinstance(proxy.store.audit, AuditLog)
        await proxy.store.audit.write_late()  # the background work, now
    assert not ran.is_error, text_of(ran)  # the backend's answer, not "nothing was forwarded"
    assert ran.meta is not None and "the backend ran this call" in ran.meta[AUDIT_META]
    assert recorded(ledger) == ['{"value": "once"}', '{"value": "next"}']
    first = [line for line in audit(state) if line["call"] == call_of(ran)]
    assert [line["event"] for line in first] == ["held", "verdict", "forwarded"]
    assert first[-1]["late"] is True


async def test_an_audit_line_lost_before_the_forward_refuses_the_write_with_its_call_and_settles_it(
    tmp_path: Path,
) -> None:
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    async with served(world(ledger), state) as (client, _, proxy):
        proxy.gate._audit = FailingOnce(proxy.gate._audit, "verdict")
        with pytest.raises(MCPError) as refused:
            await client.call_tool("toy__record", {"value": "never"})
        await client.call_tool("toy__record", {"value": "after"})
        assert isinstance(proxy.store.audit, AuditLog)
        await proxy.store.audit.write_late()
    error = refused.value.error
    assert "was not forwarded" in error.message and "no write runs without its audit line" in error.message
    assert isinstance(error.data, dict)
    call = error.data[CALL_META]
    assert recorded(ledger) == ['{"value": "after"}']
    # Held, then settled: the call is not left `held` for ever.
    assert [line["event"] for line in audit(state) if line["call"] == call] == ["held", "abandoned"]


async def test_a_key_replayed_after_its_call_gets_the_first_outcome_and_runs_once(tmp_path: Path) -> None:
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    async with served(world(ledger), state) as (client, _, _):
        first = await client.call_tool("toy__record", {"value": "pay"}, meta=request_meta({KEY_META: "order-7"}))
        again = await client.call_tool("toy__record", {"value": "pay"}, meta=request_meta({KEY_META: "order-7"}))
        other = await client.call_tool("toy__record", {"value": "pay"}, meta=request_meta({KEY_META: "order-8"}))
    assert recorded(ledger) == ['{"value": "pay"}', '{"value": "pay"}']  # order-7 once, order-8 once
    assert again == first and call_of(again) == call_of(first) != call_of(other)
    replayed = [line for line in audit(state) if line["event"] == "replayed"]
    assert [line["first"] for line in replayed] == [call_of(first)]


def held_until(release: anyio.Event, asked: list[anyio.Event]) -> ElicitationFnT:
    """A person who approves each call once `release` is set; `asked[n]` is set as call n is shown."""
    count = 0

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        nonlocal count
        asked[count].set()
        count += 1
        await release.wait()
        return await approve(True)(context, params)

    return answer


async def test_a_key_replayed_while_its_call_is_held_is_refused_and_the_write_runs_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    release, asked = anyio.Event(), [anyio.Event(), anyio.Event()]
    meta = request_meta({KEY_META: "order-9"})
    async with served(world(ledger, "human"), tmp_path / "state", elicitation=held_until(release, asked)) as (
        client,
        _,
        _,
    ):
        results: list[types.CallToolResult] = []

        async def first() -> None:
            results.append(await client.call_tool("toy__record", {"value": "pay"}, meta=meta))

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await asked[0].wait()  # the first call is held for the person
            with pytest.raises(MCPError) as refused:
                await client.call_tool("toy__record", {"value": "pay"}, meta=meta)
            release.set()
        after = await client.call_tool("toy__record", {"value": "pay"}, meta=meta)
    assert refused.value.error.code == CALL_REPLAYED and "still running" in refused.value.error.message
    assert isinstance(refused.value.error.data, dict)
    assert refused.value.error.data[FIRST_META] == call_of(results[0]) == call_of(after)
    assert not asked[1].is_set()  # the replay was never shown to the person
    assert recorded(ledger) == ['{"value": "pay"}']


@pytest.mark.parametrize("together", [False, True], ids=["one-after-the-other", "at-once"])
async def test_the_gate_forwards_one_write_per_key_when_the_front_remembers_nothing(
    tmp_path: Path, together: bool
) -> None:
    """As on another replica, or past the front's bound: the gate's claim alone holds the key."""
    ledger = tmp_path / "ledger"
    release, asked = anyio.Event(), [anyio.Event(), anyio.Event()]
    meta = request_meta({KEY_META: "order-10"})
    outcomes: list[types.CallToolResult | MCPError] = []
    async with served(world(ledger, "human"), tmp_path / "state", elicitation=held_until(release, asked)) as (
        client,
        front,
        _,
    ):
        front.replays = Replays(limit=0)

        async def call() -> None:
            try:
                outcomes.append(await client.call_tool("toy__record", {"value": "pay"}, meta=meta))
            except MCPError as exc:
                outcomes.append(exc)

        if together:
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                tg.start_soon(call)
                await asked[0].wait()
                # The second is sent while the first is held: it waits for its session's earlier
                # write (the barrier settles one at a time), then finds the key claimed at its forward.
                release.set()
        else:
            release.set()
            await call()
            await call()
    assert recorded(ledger) == ['{"value": "pay"}']
    ran = [o for o in outcomes if isinstance(o, types.CallToolResult)]
    refused = [o.error for o in outcomes if isinstance(o, MCPError)]
    assert len(ran) == 1 and not ran[0].is_error and len(refused) == 1
    assert refused[0].code == CALL_REPLAYED and isinstance(refused[0].data, dict)
    assert refused[0].data[FIRST_META] == call_of(ran[0])


@pytest.mark.parametrize(
    ("tool", "arguments", "other"),
    [("toy__record", {"value": "refund"}, "other arguments"), ("toy__echo", {"text": "pay"}, "another tool")],
    ids=["other-arguments", "another-tool"],
)
async def test_a_key_reused_for_another_call_is_refused_and_nothing_runs(
    tmp_path: Path, tool: str, arguments: dict[str, Any], other: str
) -> None:
    """Never the first call's result for another call: that call would silently never run."""
    ledger = tmp_path / "ledger"
    meta = request_meta({KEY_META: "order-11"})
    async with served(world(ledger), tmp_path / "state") as (client, _, _):
        first = await client.call_tool("toy__record", {"value": "pay"}, meta=meta)
        with pytest.raises(MCPError) as refused:
            await client.call_tool(tool, arguments, meta=meta)
        fresh = await client.call_tool(tool, arguments, meta=request_meta({KEY_META: "order-12"}))
    error = refused.value.error
    assert error.code == CALL_REPLAYED and isinstance(error.data, dict)
    assert error.data[FIRST_META] == call_of(first) != error.data[CALL_META]
    assert f"used by call {call_of(first)} of this session with {other}" in error.message
    assert "this call was not run — send a fresh key for a new call" in error.message
    assert call_of(fresh) != call_of(first) and not fresh.is_error
    written = [] if tool == "toy__echo" else ['{"value": "refund"}']
    assert recorded(ledger) == ['{"value": "pay"}', *written]  # the refused call ran nowhere


async def test_a_keyed_retry_that_words_its_intent_anew_is_the_same_call(tmp_path: Path) -> None:
    """The `intent` note never reaches the backend: a retry that rewords it replays, and runs once."""
    ledger = tmp_path / "ledger"
    config = {**world(ledger), "review": {"default": "allow", "intent": True}}
    meta = request_meta({KEY_META: "order-13"})
    async with served(config, tmp_path / "state") as (client, _, _):
        first = await client.call_tool("toy__record", {"value": "pay", "intent": "the user asked to pay"}, meta=meta)
        again = await client.call_tool("toy__record", {"value": "pay", "intent": "pay, as asked"}, meta=meta)
    assert again == first
    assert recorded(ledger) == ['{"value": "pay"}']


async def test_a_key_is_scoped_to_its_session(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    async with served(world(ledger), tmp_path / "state") as (one, front, _), Client(front.server) as two:
        await one.call_tool("toy__record", {"value": "a"}, meta=request_meta({KEY_META: "k"}))
        await two.call_tool("toy__record", {"value": "b"}, meta=request_meta({KEY_META: "k"}))
    assert recorded(ledger) == ['{"value": "a"}', '{"value": "b"}']


@pytest.mark.parametrize("key", ["", 7, "x" * 257])
async def test_a_key_the_proxy_cannot_honour_is_refused_and_nothing_runs(tmp_path: Path, key: Any) -> None:
    ledger = tmp_path / "ledger"
    async with served(world(ledger), tmp_path / "state") as (client, _, _):
        with pytest.raises(MCPError, match="idempotency-key must be a string"):
            await client.call_tool("toy__record", {"value": "x"}, meta=request_meta({KEY_META: key}))
    assert recorded(ledger) == []
