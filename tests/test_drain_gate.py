"""The gate's part of the drain: a call cut anywhere before its forward still gets its terminal line.

The audit trail is the real `AuditLog`, whose disk is made slow on purpose for one line (a loaded
disk; a slow INSERT on Postgres); the executor keeps a ledger of what really ran. A cancel that
lands while the verdict line is made durable — its client left, or the replica stopped — leaves
the call `abandoned` with the true reason, never `held` for ever; a forward cut because a second
signal ended the drain says the replica shut down.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditLog, read_audit
from mcp_spec_proxy.calls.drain import SHUT_DOWN
from mcp_spec_proxy.calls.gate import Gate, GateCall
from mcp_spec_proxy.calls.results import text_result
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import SHUTTING_DOWN
from mcp_spec_proxy.review import ReviewerKind, ReviewRequest, Verdict
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.harness import approve, proxied, recorded, toy, verdict
from tests.ops_world import until

pytestmark = pytest.mark.anyio


class SlowLine(AuditLog):
    """An audit log whose disk stalls on the first line of one kind until `release` is set."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(path)
        self._kind = f'"event": "{kind}"'
        self.stalled = threading.Event()
        self.release = threading.Event()

    def _append(self, lines: list[str]) -> None:
        if not self.stalled.is_set() and any(self._kind in line for line in lines):
            self.stalled.set()
            self.release.wait(30)
        super()._append(lines)


class Approves:
    by = ReviewerKind.CONSOLE.chain

    async def review(self, request: ReviewRequest, user: Any) -> Verdict:
        return Verdict(True, "approved", len(request.segment), by=self.by)


async def _no_listing(server: str, listing: Any) -> None:
    return None


def _gate(log: AuditLog) -> tuple[Gate, GateCall]:
    config = ProxyConfig.model_validate({"servers": {}, "review": {"default": "console"}})
    definition = types.Tool(name="t__w", input_schema={"type": "object"})
    tool = CatalogTool("t__w", "t", "w", definition, "write", "default", "unannotated", None, None, "", False)
    request = ReviewRequest("s", tool, {}, None, Segment((Step("t__w", {}, "write"),)), History())
    gate = Gate(config, BackendPool({}, _no_listing), {"console": Approves()}, log)
    return gate, GateCall("s", tool, {}, "client", request)


def _lines(path: Path) -> list[tuple[str, str]]:
    return [(line["event"], line.get("reason", "")) for line in read_audit(path) if line.get("call")]


class _NoUser:
    """A client that cannot ask its person anything."""

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


@pytest.mark.parametrize("replica_stopped", [False, True])
async def test_a_write_cut_while_its_verdict_line_is_made_durable_is_abandoned_with_the_true_reason(
    tmp_path: Path, replica_stopped: bool
) -> None:
    log = SlowLine(tmp_path / "audit.jsonl", "verdict")
    gate, call = _gate(log)
    ran: list[str] = []

    async def executor(tool: CatalogTool, arguments: dict[str, Any], report: Any) -> types.CallToolResult:
        ran.append(tool.name)
        return text_result("ran")

    with anyio.fail_after(30):
        async with anyio.create_task_group() as process:
            process.start_soon(lambda: gate.write(call, _NoUser(), executor=executor))
            await until(log.stalled.is_set)
            if replica_stopped:
                with anyio.CancelScope() as second_signal:
                    second_signal.cancel()  # the drain cut short at once: the replica stops
                    await gate.drain.run(30)
            process.cancel_scope.cancel()  # the client left, or the process stops
            log.release.set()
    log.close()
    why = SHUT_DOWN if replica_stopped else "the client cancelled or disconnected"
    assert _lines(tmp_path / "audit.jsonl") == [("held", ""), ("verdict", "approved"), ("abandoned", why)]
    assert ran == []


async def test_a_forward_cut_by_a_second_signal_is_interrupted_because_the_replica_shut_down(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    gate, call = _gate(log)
    ran: list[str] = []
    forwarding = anyio.Event()

    async def hangs(tool: CatalogTool, arguments: dict[str, Any], report: Any) -> types.CallToolResult:
        ran.append(tool.name)
        forwarding.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.fail_after(30):
        async with anyio.create_task_group() as process:
            process.start_soon(lambda: gate.write(call, _NoUser(), executor=hangs))
            await forwarding.wait()
            async with anyio.create_task_group() as signals:
                signals.start_soon(gate.drain.run, 30.0)
                await anyio.wait_all_tasks_blocked()
                signals.cancel_scope.cancel()  # the second signal: the drain is over before its grace
            process.cancel_scope.cancel()
    log.close()
    assert ran == ["t__w"]
    interrupted = [reason for event, reason in _lines(tmp_path / "audit.jsonl") if event == "forward-interrupted"]
    assert interrupted == [f"{SHUT_DOWN} while forwarding: the backend may or may not have run it"]


async def test_a_2026_era_approval_arriving_during_the_drain_runs_its_call_and_nothing_else_gets_in(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    cfg = {"servers": {"toy": toy(ledger)}, "review": {"default": "human", "intent": False}}
    async with proxied(cfg, tmp_path / "state", twins=True, mode="2026-07-28", elicitation=approve(True)) as p:
        session = p.client.session
        asked = await session.call_tool("toy__record", {"value": "approved"}, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        (key,) = (asked.input_requests or {}).keys()
        yes: types.InputResponses = {key: types.ElicitResult(action="accept", content={"approve": True})}
        await p.proxy.gate.drain.run(30)  # SIGTERM while the person decides
        with pytest.raises(MCPError) as new:
            await session.call_tool("toy__record", {"value": "new"}, allow_input_required=True)
        answered = await session.call_tool(
            "toy__record",
            {"value": "approved"},
            input_responses=yes,
            request_state=asked.request_state,
            allow_input_required=True,
        )
        with pytest.raises(MCPError) as spent:  # the ticket is spent: a replay is a new call, refused
            await session.call_tool(
                "toy__record",
                {"value": "approved"},
                input_responses=yes,
                request_state=asked.request_state,
                allow_input_required=True,
            )
    assert new.value.error.code == SHUTTING_DOWN and spent.value.error.code == SHUTTING_DOWN
    assert isinstance(answered, types.CallToolResult) and not answered.is_error, answered
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["approved"]


@pytest.mark.parametrize("on_reject", ["replace", "repair"])
async def test_a_substitute_of_a_write_rejected_during_the_drain_runs_as_part_of_that_call(
    tmp_path: Path, on_reject: str
) -> None:
    asked = anyio.Event()
    go = anyio.Event()
    substitute = {"tool": "b__record", "arguments": {"value": "instead"}}

    async def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:  # the verifier: it answers once the drain has begun
            asked.set()
            await go.wait()
            return verdict(0, "use b", substitute if on_reject == "replace" else None)
        return Reply(tool_calls=[ToolCall("b__record", {"value": "instead"})])  # the repair turn

    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        cfg = {
            "servers": {"a": toy(tmp_path / "a-ledger"), "b": toy(tmp_path / "b-ledger")},
            "models": {"strong": {**endpoint, "model": "strong-model"}},
            "review": {"default": "strong", "on_reject": on_reject, "intent": False},
        }
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            results: list[types.CallToolResult] = []
            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:

                    async def client() -> None:
                        results.append(await p.client.call_tool("a__record", {"value": "held"}))

                    tg.start_soon(client)
                    await asked.wait()
                    tg.start_soon(p.proxy.gate.drain.run, 30.0)  # SIGTERM while the write is reviewed
                    await until(lambda: p.proxy.gate.drain.draining)
                    go.set()
            assert not p.proxy.gate.drain.expired  # the drain ended with the call, substitute included
    [result] = results
    assert not result.is_error, result
    assert recorded(tmp_path / "a-ledger") == []
    assert [json.loads(line)["value"] for line in recorded(tmp_path / "b-ledger")] == ["instead"]
    assert "refused" not in [line["event"] for line in read_audit(tmp_path / "state" / "audit.jsonl")]
