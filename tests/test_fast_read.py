"""The lean read path (`fronts/fast_read.py`): only reads take it, and they stay audited.

Ground truth is the toy's ledger (what the backend ran) and the audit log; a spy on the gate's
two front doors for reads tells which path a call took. A write, an unknown tool, a tool held for a
changed definition and the proxy's own tools must never reach `Barrier.read_json`.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, MCPError

from mcp_spec_proxy.backends.raw import Answer, RawCalls, WireResult, tool_result
from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import Author, Read, Report
from mcp_spec_proxy.calls.rules import Decision
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import RESULT_TOO_LARGE
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.sessions.barrier import Session
from mcp_spec_proxy.testing import Respond, ScriptedModelServer
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import Step
from tests.harness import ERAS, PROXY_COMMAND, Proxied, call_error, proxied, recorded, spawned, text_of, toy

pytestmark = pytest.mark.anyio


def config(record: Path, review: str = "deny", **server: Any) -> dict[str, Any]:
    return {"servers": {"toy": toy(record, **server)}, "review": {"default": review}}


def audit_events(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return list(read_audit(path)) if path.exists() else []


@asynccontextmanager
async def spied(p: Proxied) -> AsyncIterator[dict[str, list[str]]]:
    """Which tools came in by the lean door (`Barrier.read_json`) and which by the SDK's handler
    (`Barrier.call`), as the gate's one read (`Gate.read`) sees them."""
    barrier, gate = p.proxy.barrier, p.proxy.gate
    seen: dict[str, list[str]] = {"fast": [], "model": []}
    lean: ContextVar[bool] = ContextVar("lean", default=False)
    fast, model = barrier.read_json, gate.read

    async def read_json(
        session: Session, tool: CatalogTool, arguments: dict[str, Any], call: str | None = None
    ) -> WireResult:
        seen["fast"].append(tool.name)
        token = lean.set(True)
        try:
            return await fast(session, tool, arguments, call)
        finally:
            lean.reset(token)

    async def read(
        session: str,
        tool: CatalogTool,
        arguments: dict[str, Any],
        step: Step,
        author: Author = "client",
        report: Report | None = None,
        call: str | None = None,
        rule: Decision | None = None,
        principal: Principal | None = None,
    ) -> Read[WireResult]:
        if not lean.get():
            seen["model"].append(tool.name)
        return await model(session, tool, arguments, step, author, report, call, rule, principal=principal)

    barrier.read_json = read_json  # type: ignore[method-assign]
    gate.read = read  # type: ignore[method-assign]
    yield seen


@pytest.mark.parametrize("mode", ERAS)
async def test_read_takes_the_fast_path_and_is_audited(tmp_path: Path, mode: str) -> None:
    # A real stdio backend: the read goes out on the proxy's own channel, past the SDK client.
    async with proxied(config(tmp_path / "rec"), tmp_path / "state", mode=mode) as p, spied(p) as seen:
        result = await p.client.call_tool("toy__echo", {"text": "héllo 😀"})
    assert text_of(result) == "héllo 😀" and not result.is_error
    assert seen == {"fast": ["toy__echo"], "model": []}
    reads = [e for e in audit_events(tmp_path / "state") if e["event"] == "read"]
    assert [(e["tool"], e["author"]) for e in reads] == [("toy__echo", "client")]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_rule_that_may_make_a_read_a_write_keeps_reads_off_the_fast_path(tmp_path: Path, mode: str) -> None:
    rules = [
        {"when": 'args.text == "hi"', "name": "greeting", "review": "human"},
        {"when": 'args.text.startsWith("DROP")', "effect": "write"},
    ]
    cfg = {**config(tmp_path / "rec"), "rules": rules}
    async with proxied(cfg, tmp_path / "state", mode=mode) as p, spied(p) as seen:
        held = await p.client.call_tool("toy__echo", {"text": "DROP it"})
        read = await p.client.call_tool("toy__echo", {"text": "hi"})
    assert held.is_error and "Blocked at the write barrier" in text_of(held) and text_of(read) == "hi"
    assert seen == {"fast": [], "model": ["toy__echo"]}  # the read took the SDK's path, where rules run first
    events = audit_events(tmp_path / "state")
    told = [(e["event"], e.get("rule")) for e in events]
    assert told == [("held", 2), ("verdict", 2), ("blocked", None), ("read", "greeting")]


@pytest.mark.parametrize("mode", ERAS)
async def test_write_never_takes_the_fast_path(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", mode=mode) as p, spied(p) as seen:
        result = await p.client.call_tool("toy__record", {"value": "v", "intent": "test"})
    assert result.is_error and "Blocked at the write barrier" in text_of(result)
    assert recorded(record) == []  # the backend never ran it
    assert seen == {"fast": [], "model": []}
    assert [e["event"] for e in audit_events(tmp_path / "state")] == ["held", "verdict", "blocked"]


@pytest.mark.parametrize("mode", ERAS)
async def test_unknown_tool_never_takes_the_fast_path(tmp_path: Path, mode: str) -> None:
    async with proxied(config(tmp_path / "rec"), tmp_path / "state", mode=mode, twins=True) as p, spied(p) as seen:
        with pytest.raises(MCPError, match="unknown tool"):
            await p.client.call_tool("toy__nope", {})
    assert seen == {"fast": [], "model": []}


@pytest.mark.parametrize("mode", ERAS)
async def test_tool_with_a_changed_definition_is_held_not_read(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", mode=mode) as p:
        assert text_of(await p.client.call_tool("toy__echo", {"text": "before"})) == "before"
        await p.client.call_tool("toy__rug_pull", {})
        # The listing refresh lands when the backend's list_changed has been handled.
        for _ in range(200):
            if p.proxy.catalog.lookup("toy__echo").effect == "write":
                break
            await p.client.list_tools()
        assert p.proxy.catalog.lookup("toy__echo").reason == "changed-definition"
        async with spied(p) as seen:
            result = await p.client.call_tool("toy__echo", {"text": "after", "intent": "test"})
    assert result.is_error and "Blocked at the write barrier" in text_of(result)
    assert seen == {"fast": [], "model": []}
    held = [e for e in audit_events(tmp_path / "state") if e["event"] == "held"]
    assert [e["tool"] for e in held] == ["toy__echo"]


@pytest.mark.parametrize("mode", ERAS)
async def test_tool_added_after_the_first_listing_is_held_not_read(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", mode=mode) as p:
        await p.client.call_tool("toy__add_tool", {})
        for _ in range(200):  # the refresh lands once the backend's list_changed is handled
            if any(tool.name == "toy__extra" for tool in (await p.client.list_tools()).tools):
                break
        assert p.proxy.catalog.lookup("toy__extra").reason == "new-tool"  # annotated read-only, yet held
        async with spied(p) as seen:
            result = await p.client.call_tool("toy__extra", {"intent": "test"})
    assert result.is_error and "Blocked at the write barrier" in text_of(result)
    assert seen == {"fast": [], "model": []}
    held = [e["tool"] for e in audit_events(tmp_path / "state") if e["event"] == "held"]
    assert held == ["toy__extra"]


async def test_own_tools_never_take_the_fast_path(tmp_path: Path) -> None:
    async with ScriptedModelServer(Respond(lambda request: "Nothing to do.")) as model:
        cfg = config(tmp_path / "rec")
        cfg["models"] = {"strong": {"base_url": model.base_url, "model": "strong-model", "max_retries": 0}}
        async with proxied(cfg, tmp_path / "state", twins=True) as p, spied(p) as seen:
            result = await p.client.call_tool("delegate", {"task": "Anything to do?"})
    assert not result.is_error and text_of(result).startswith("Nothing to do.")
    assert seen["fast"] == []


async def test_read_with_a_progress_token_takes_the_sdk_path(tmp_path: Path) -> None:
    updates: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append(progress)

    async with proxied(config(tmp_path / "rec"), tmp_path / "state", twins=True) as p, spied(p) as seen:
        result = await p.client.call_tool("toy__progress", {}, progress_callback=on_progress)
    assert text_of(result) == "done" and updates == [1, 2, 3]
    assert seen == {"fast": [], "model": ["toy__progress"]}


@pytest.mark.parametrize("mode", ERAS)
async def test_fast_read_refuses_invalid_arguments_before_the_backend(tmp_path: Path, mode: str) -> None:
    async with proxied(config(tmp_path / "rec"), tmp_path / "state", mode=mode, twins=True) as p:
        result = await p.client.call_tool("toy__echo", {"text": 5})
    assert result.is_error and "text" in text_of(result)
    assert audit_events(tmp_path / "state") == []  # refused before the gate: nothing ran


async def test_fast_read_over_the_size_bound_is_withheld(tmp_path: Path) -> None:
    async with proxied(config(tmp_path / "rec", max_result_bytes=1000), tmp_path / "state") as p:
        error = await call_error(p.client, "toy__big", {"size": 5000})
        small = await p.client.call_tool("toy__big", {"size": 10})
    assert error.code == RESULT_TOO_LARGE and "max_result_bytes" in error.message
    assert text_of(small) == "x" * 10


async def test_param_header_check_gets_the_schema_the_client_was_shown(tmp_path: Path) -> None:
    # The SDK checks a 2026-07-28 HTTP call's Mcp-Param-* headers against this schema; it must be
    # the listed one (a write's added `intent` included), without running tools/list per call.
    async with proxied(config(tmp_path / "rec"), tmp_path / "state", twins=True) as p:
        listed = {tool.name: tool.input_schema for tool in (await p.client.list_tools()).tools}
        front = McpFront(p.proxy)
        lookup = front.server.get_tool_input_schema
        assert lookup is not None
        assert lookup("toy__record") == listed["toy__record"]
        assert "intent" in listed["toy__record"]["properties"]
        assert lookup("toy__echo") == listed["toy__echo"]
        assert lookup("toy__nope") is None


def test_raw_channel_takes_only_answers_to_its_own_requests() -> None:
    # What a backend writes is hostile until shown otherwise: only an answer (no `method`) whose
    # id is one the fast path is waiting for is taken; the rest goes to the SDK client as before.
    raw = RawCalls()
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[Answer] = loop.create_future()
        raw._pending["msp-7"] = future  # as `request` leaves it while it waits
        assert not raw.answer(b'{"jsonrpc":"2.0","id":"msp-7","method":"roots/list"}')
        assert not raw.answer(b'{"jsonrpc":"2.0","id":7,"result":{"content":[]}}')
        assert not raw.answer(b'{"jsonrpc":"2.0","id":"msp-8","result":{}}')
        assert not raw.answer(b"[" * 100_000 + b'"msp-7"')
        assert not raw.answer(b'{"id": ["msp-7"]}')
        assert not future.done()
        assert raw.answer(b'{"jsonrpc":"2.0","id":"msp-7","result":{"content":[]}}')
        assert future.result() == {"jsonrpc": "2.0", "id": "msp-7", "result": {"content": []}}
        assert not raw.answer(b'{"jsonrpc":"2.0","id":"msp-7","result":{"content":[]}}')  # once only
    finally:
        loop.close()


def test_only_a_finished_tool_result_passes() -> None:
    modern = "2026-07-28"
    assert tool_result({"content": [{"type": "text", "text": "x"}]}, modern) is not None
    assert tool_result({"content": [], "resultType": "complete"}, modern) is not None
    assert tool_result({"content": [], "resultType": "input_required"}, modern) is None
    assert tool_result({"content": "x"}, modern) is None
    assert tool_result(["content"], modern) is None
    assert tool_result({"content": [{"type": "nope"}]}, modern) is None  # what the SDK client refuses
    # A handshake-era backend's `resultType` means nothing in its era: the SDK client ignores it too.
    assert tool_result({"content": [], "resultType": "input_required"}, "2025-11-25") is not None


@pytest.mark.parametrize("mode", ERAS)
async def test_over_http_a_read_takes_the_fast_path_and_a_write_does_not(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    raw = config(record, review="allow")
    seen: list[str] = []
    with anyio.fail_after(60):
        async with (
            running_proxy(ProxyConfig.model_validate(raw), StatePaths(tmp_path / "state")) as proxy,
            anyio.create_task_group() as tg,
        ):
            fast = proxy.barrier.read_json

            async def read_json(
                session: Session, tool: CatalogTool, arguments: dict[str, Any], call: str | None = None
            ) -> WireResult:
                seen.append(tool.name)
                return await fast(session, tool, arguments, call)

            proxy.barrier.read_json = read_json  # type: ignore[method-assign]
            front = McpFront(proxy)
            port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
            async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode) as client:
                echoed = await client.call_tool("toy__echo", {"text": "over http"})
                written = await client.call_tool("toy__record", {"value": "v", "intent": "x"})
            tg.cancel_scope.cancel()
    assert text_of(echoed) == "over http" and not written.is_error
    assert seen == ["toy__echo"]
    assert len(recorded(record)) == 1
    events = [(e["event"], e["tool"]) for e in audit_events(tmp_path / "state") if "tool" in e]
    assert events[0] == ("read", "toy__echo") and ("held", "toy__record") in events


# -- the stdio front's own lean reads (lines taken before the SDK parses them) ----------------


@pytest.mark.parametrize("mode", ERAS)
async def test_spawned_proxy_reads_audited_and_writes_held(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    async with spawned(config(record), tmp_path, mode=mode) as client:
        echoed = await client.call_tool("toy__echo", {"text": "héllo 😀"})
        invalid = await client.call_tool("toy__echo", {"text": 5})
        written = await client.call_tool("toy__record", {"value": "v", "intent": "test"})
        with pytest.raises(MCPError, match="unknown tool"):
            await client.call_tool("toy__nope", {})
    assert text_of(echoed) == "héllo 😀" and not echoed.is_error
    assert invalid.is_error and "text" in text_of(invalid)
    assert written.is_error and "Blocked at the write barrier" in text_of(written)
    assert recorded(record) == []
    events = [(e["event"], e.get("tool")) for e in audit_events(tmp_path / "state")]
    assert events == [("read", "toy__echo"), ("held", "toy__record"), ("verdict", "toy__record"), ("blocked", None)]


@pytest.mark.parametrize("mode", ERAS)
async def test_spawned_proxy_passes_a_cancelled_lean_read_to_the_backend(tmp_path: Path, mode: str) -> None:
    async with spawned(config(tmp_path / "rec"), tmp_path, mode=mode) as client:
        await client.list_tools()  # the proxy is serving: the call below reaches the backend before its cancel
        with anyio.move_on_after(0.5):
            await client.call_tool("toy__hang", {})
        assert text_of(await client.call_tool("toy__was_cancelled", {})) == "true"
        assert text_of(await client.call_tool("toy__echo", {"text": "after"})) == "after"


async def test_a_legacy_call_before_the_handshake_gets_the_sdk_answer(tmp_path: Path) -> None:
    cfg = tmp_path / "servers.yaml"
    cfg.write_text(yaml.safe_dump(config(tmp_path / "rec")))
    params = {"name": "toy__echo", "arguments": {"text": "x"}}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    argv = [PROXY_COMMAND, "--config", str(cfg), "--state-dir", str(tmp_path / "state"), "--log-level", "WARNING"]
    async with await anyio.open_process(argv, stderr=subprocess.DEVNULL) as process:
        assert process.stdin is not None and process.stdout is not None
        await process.stdin.send((json.dumps(call) + "\n").encode())
        with anyio.fail_after(60):
            answer = json.loads((await process.stdout.receive()).split(b"\n")[0])
        await process.stdin.aclose()
    assert answer["id"] == 1 and "error" in answer and "result" not in answer
    assert audit_events(tmp_path / "state") == []  # nothing reached the backend


@pytest.mark.parametrize("mode", ERAS)
async def test_concurrent_reads_each_get_their_own_answer(tmp_path: Path, mode: str) -> None:
    # Many reads in flight at once share the backend's stdin (written together when they queue)
    # and its stdout: each answer must reach the call that asked, whatever the order.
    results: dict[int, str] = {}
    async with spawned(config(tmp_path / "rec"), tmp_path, mode=mode) as client:

        async def echo(n: int) -> None:
            results[n] = text_of(await client.call_tool("toy__echo", {"text": f"call {n}"}))

        async with anyio.create_task_group() as tg:
            for n in range(40):
                tg.start_soon(echo, n)
    assert results == {n: f"call {n}" for n in range(40)}
    reads = [e for e in audit_events(tmp_path / "state") if e["event"] == "read"]
    assert len(reads) == 40


def test_stdio_front_serves_regular_files_too(tmp_path: Path) -> None:
    # Pipe transports cannot serve a regular file or /dev/null (uvloop would abort the process on
    # one): a front whose stdin and stdout are such falls back to reading and writing in threads.
    cfg = tmp_path / "servers.yaml"
    cfg.write_text(yaml.safe_dump(config(tmp_path / "rec")))
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    requests, answers = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    requests.write_text(json.dumps(initialize) + "\nnot json\n")
    argv = [PROXY_COMMAND, "--config", str(cfg), "--state-dir", str(tmp_path / "state"), "--log-level", "WARNING"]
    with requests.open("rb") as stdin, answers.open("wb") as stdout:
        done = subprocess.run(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
    by_id = {line["id"]: line for line in map(json.loads, answers.read_text().splitlines())}
    assert set(by_id) == {1, None}  # each answered, in whichever order they were done
    assert "serverInfo" in by_id[1]["result"] and by_id[None]["error"]["code"] == -32700
    # A device it cannot poll: the client is gone at once, and the proxy ends cleanly.
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
