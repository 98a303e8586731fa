"""Attacks on the lean read path: the second route to the backends must lead nowhere else.

The stdio front takes a client's read off the wire before the SDK parses it (`fronts/stdio.py`),
and the proxy reads the answer off the backend's pipe before the SDK client does
(`backends/raw.py`). Both are parsers of hostile bytes beside the SDK's own. Ground truth: the
toy's ledger (a write that ran), the audit log, and the exact lines the proxy writes to its
client, read here from a real spawned proxy with request shapes no SDK client would send.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from mcp_spec_proxy.backends.raw import WireResult
from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import Author, Read, Report
from mcp_spec_proxy.calls.rules import Decision
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import Step
from tests.harness import ERAS, PROXY_COMMAND, proxied, recorded, spawned, text_of, toy, verdict

pytestmark = pytest.mark.anyio

RAW_SERVER = Path(__file__).parent / "fixtures" / "raw_server.py"
WRITE: dict[str, Any] = {"name": "toy__record", "arguments": {"value": "v", "intent": "x"}}


def config(record: Path, review: str = "deny") -> dict[str, Any]:
    return {"servers": {"toy": toy(record)}, "review": {"default": review}}


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return list(read_audit(path)) if path.exists() else []


def strict(line: bytes) -> Any:
    """`line` as JSON, refusing what Python's parser accepts but JSON is not (NaN, Infinity)."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(line, parse_constant=refuse)


class Wire:
    """A spawned proxy's stdin and stdout, one JSON line at a time."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._buffer = b""
        self.seen: dict[Any, dict[str, Any]] = {}  # every answer read so far, by id (JSON-encoded)

    async def send(self, line: str | dict[str, Any]) -> None:
        text = line if isinstance(line, str) else json.dumps(line)
        assert self._process.stdin is not None
        await self._process.stdin.send(text.encode() + b"\n")

    async def line(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        while b"\n" not in self._buffer:
            self._buffer += await self._process.stdout.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = strict(line)  # every line the client gets is one strict JSON message
        return message

    async def answer(self, request_id: Any) -> dict[str, Any]:
        key = json.dumps(request_id)
        while key not in self.seen:
            message = await self.line()
            if "id" in message and "method" not in message:
                # An error with a null id answers a request whose id was unreadable or of no
                # allowed kind (1.5, {}): one each, so those alone may repeat.
                repeatable = message["id"] is None and "error" in message
                assert repeatable or json.dumps(message["id"]) not in self.seen, f"answered twice: {message}"
                self.seen[json.dumps(message["id"])] = message
        return self.seen[key]

    async def call(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})
        return await self.answer(request_id)


@asynccontextmanager
async def wired(cfg: dict[str, Any], tmp: Path, *, handshake: bool = True) -> AsyncIterator[Wire]:
    """A spawned proxy (the installed command) on raw pipes, after a handshake-era `initialize`."""
    import yaml

    config_file = tmp / "servers.yaml"
    config_file.write_text(yaml.safe_dump(cfg))
    argv = [PROXY_COMMAND, "--config", str(config_file), "--state-dir", str(tmp / "state"), "--log-level", "WARNING"]
    log = tmp / "proxy-stderr.log"  # named in the failure if the proxy hangs or leaves early
    try:
        with anyio.fail_after(90), log.open("wb") as stderr:
            async with wired_process(argv, stderr, handshake=handshake) as wire:
                yield wire
    except (TimeoutError, anyio.EndOfStream) as exc:
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
        what = "hung (answering or exiting)" if isinstance(exc, TimeoutError) else "closed its stdout before answering"
        raise AssertionError(f"the spawned proxy {what}; its stderr ends:\n{tail}") from None


@asynccontextmanager
async def wired_process(argv: list[str], stderr: Any, *, handshake: bool) -> AsyncIterator[Wire]:
    async with await anyio.open_process(argv, stderr=stderr) as process:
        wire = Wire(process)
        if handshake:
            info = {"name": "attacker", "version": "1"}
            params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": info}
            await wire.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": params})
            await wire.answer("init")
            await wire.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        try:
            yield wire
        finally:
            assert process.stdin is not None
            await process.stdin.aclose()


# -- which requests the lean path may take -----------------------------------------------------


def _call(request_id: Any, params: Any) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})


WRITE_ARGS = '"arguments":{"value":"v","intent":"x","text":"t"}'
SHAPES: dict[str, str] = {
    # Duplicate keys: whichever one a parser keeps, a write must meet the gate.
    "name read then write": '{"jsonrpc":"2.0","id":"d1","method":"tools/call","params":{"name":"toy__echo",'
    '"name":"toy__record",' + WRITE_ARGS + "}}",
    "name write then read": '{"jsonrpc":"2.0","id":"d2","method":"tools/call","params":{"name":"toy__record",'
    '"name":"toy__echo",' + WRITE_ARGS + "}}",
    "params twice": '{"jsonrpc":"2.0","id":"d3","method":"tools/call","params":{"name":"toy__echo",'
    + WRITE_ARGS
    + '},"params":{"name":"toy__record",'
    + WRITE_ARGS
    + "}}",
    "method twice": '{"jsonrpc":"2.0","id":"d4","method":"tools/list","method":"tools/call","params":{"name":'
    '"toy__record",' + WRITE_ARGS + "}}",
    "escaped name": '{"jsonrpc":"2.0","id":"e1","method":"tools/call","params":{"name":"toy__\\u0072ecord",'
    + WRITE_ARGS
    + "}}",
    "escaped method": '{"jsonrpc":"2.0","id":"e2","method":"tools\\/call","params":{"name":"toy__record",'
    + WRITE_ARGS
    + "}}",
    "extra params field": _call("x1", {**WRITE, "task": {"ttl": 1000}}),
    "progress token": _call("p1", {**WRITE, "_meta": {"progressToken": "t"}}),
    "progress token deep": _call("p2", {**WRITE, "arguments": {**WRITE["arguments"], "_meta": {"progressToken": 1}}}),
    "float id": _call(1.5, WRITE),
    "object id": _call({"a": 1}, WRITE),
    "cyrillic o": _call("u1", {**WRITE, "name": "toy__rec\u043erd"}),
    "zero-width space": _call("u2", {**WRITE, "name": "toy__record\u200b"}),
    "fullwidth": _call("u3", {**WRITE, "name": "\uff54\uff4f\uff59__record"}),
    "lone surrogate": '{"jsonrpc":"2.0","id":"u4","method":"tools/call","params":{"name":"toy__record\\ud800",'
    + WRITE_ARGS
    + "}}",
    "own tool": _call("o1", {"name": "report_outcome", "arguments": {"outcome": "done"}}),
    "meta tool of search mode": _call("o2", {"name": "call_tool", "arguments": WRITE}),
    "batch": "[" + _call("b1", WRITE) + "," + _call("b2", {"name": "toy__echo", "arguments": {"text": "t"}}) + "]",
    "notification": json.dumps({"jsonrpc": "2.0", "method": "tools/call", "params": WRITE}),
}


def string_ids(shapes: Iterable[str]) -> list[str]:
    """The ids of the shapes that are one request with a string id (each of them is answered)."""
    ids: list[str] = []
    for shape in shapes:
        data = json.loads(shape)
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            ids.append(data["id"])
    return ids


async def test_no_request_shape_takes_a_write_past_the_gate(tmp_path: Path) -> None:
    # Every shape aims at the write `toy__record` under `deny`: whichever parser reads it, and
    # whichever path takes it, the toy's ledger stays empty, and the client still gets one
    # strict JSON line per answer.
    record = tmp_path / "rec"
    async with wired(config(record), tmp_path) as wire:
        for shape in SHAPES.values():
            await wire.send(shape)
        answered = await wire.call("last", {"name": "toy__echo", "arguments": {"text": "last"}})
        # The read after them all is no sign that they were handled: the lean path answers it
        # beside the SDK's, ahead of writes whose audit lines are still being fsynced. Each
        # request's own answer is; leaving before then would audit them `abandoned`.
        for request_id in string_ids(SHAPES.values()):
            await wire.answer(request_id)
    assert answered["result"]["content"] == [{"type": "text", "text": "last"}]
    assert recorded(record) == []
    for event in audit(tmp_path / "state"):
        assert event["event"] != "forwarded"
        if event.get("tool") == "toy__record":
            assert event["event"] in ("held", "verdict"), event


async def test_a_read_before_the_handshake_is_not_taken_and_nothing_runs(tmp_path: Path) -> None:
    async with wired(config(tmp_path / "rec"), tmp_path, handshake=False) as wire:
        answer = await wire.call(1, {"name": "toy__echo", "arguments": {"text": "early"}})
    assert "error" in answer and "result" not in answer
    assert audit(tmp_path / "state") == []


async def test_a_tool_pulled_from_read_to_changed_is_held_on_the_stdio_front(tmp_path: Path) -> None:
    async with wired(config(tmp_path / "rec"), tmp_path) as wire:
        before = await wire.call("a", {"name": "toy__echo", "arguments": {"text": "before"}})
        await wire.call("pull", {"name": "toy__rug_pull", "arguments": {}})
        for n in range(200):  # the listing refresh lands once the backend's list_changed is handled
            await wire.send({"jsonrpc": "2.0", "id": f"list{n}", "method": "tools/list"})
            tools = (await wire.answer(f"list{n}"))["result"]["tools"]
            if any("ignore previous" in (tool.get("description") or "") for tool in tools):
                break
        after = await wire.call("b", {"name": "toy__echo", "arguments": {"text": "after", "intent": "x"}})
    assert before["result"]["content"][0]["text"] == "before"
    assert after["result"]["isError"] and "Blocked at the write barrier" in after["result"]["content"][0]["text"]
    reads = [e["tool"] for e in audit(tmp_path / "state") if e["event"] == "read"]
    held = [e["tool"] for e in audit(tmp_path / "state") if e["event"] == "held"]
    assert reads == ["toy__echo", "toy__rug_pull"] and held == ["toy__echo"]


async def test_a_read_claimed_before_a_rug_pull_does_not_run_after_it(tmp_path: Path) -> None:
    # The stdio front claims a read (`read_tool`) and runs it (`read_json`) in a task of its own:
    # a listing refresh may land between the two. The read must then not go out as a read.
    async with proxied(config(tmp_path / "rec"), tmp_path / "state") as p:
        barrier = p.proxy.barrier
        tool = barrier.read_tool("toy__echo")
        assert tool is not None
        await p.client.call_tool("toy__rug_pull", {})
        for _ in range(200):
            if p.proxy.catalog.lookup("toy__echo").reason == "changed-definition":
                break
            await p.client.list_tools()
        assert barrier.read_tool("toy__echo") is None
        forwarded: list[str] = []
        fast = p.proxy.gate.read

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
            forwarded.append(tool.name)
            return await fast(session, tool, arguments, step, author, report, call, rule, principal=principal)

        p.proxy.gate.read = read  # type: ignore[method-assign]
        result = await barrier.read_json(barrier.new_session(), tool, {"text": "late"})
    assert forwarded == []
    assert result["isError"] is True and "changed" in result["content"][0]["text"]


# -- what a lean read leaves behind ------------------------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_a_lean_read_is_in_the_history_the_reviewer_of_a_later_write_sees(tmp_path: Path, mode: str) -> None:
    from mcp_spec_proxy.testing import Respond, ScriptedModelServer

    async with ScriptedModelServer(Respond(lambda request: verdict(0, "no"))) as model:
        cfg = config(tmp_path / "rec", review="strong")
        cfg["models"] = {"strong": {"base_url": model.base_url, "model": "strong-model", "max_retries": 0}}
        cfg["review"]["on_reject"] = "block"
        async with spawned(cfg, tmp_path, mode=mode) as client:
            echoed = await client.call_tool("toy__echo", {"text": "marker-7f3a"})
            written = await client.call_tool("toy__record", {"value": "v", "intent": "x"})
        asked = json.dumps(model.chat_requests[0].raw["messages"])
    assert text_of(echoed) == "marker-7f3a" and written.is_error
    assert "toy__echo" in asked and "marker-7f3a" in asked
    assert recorded(tmp_path / "rec") == []


# -- a hostile backend on the raw channel ------------------------------------------------------


def raw_config(record: Path) -> dict[str, Any]:
    server = {"command": sys.executable, "args": [str(RAW_SERVER)], "env": {"RAW_RECORD_FILE": str(record)}}
    return {"servers": {"raw": server}, "review": {"default": "deny"}}


async def test_numbers_json_cannot_carry_reach_the_client_as_null(tmp_path: Path) -> None:
    # Python's parser reads NaN, Infinity and 1e400 (as inf); written back they are no JSON at
    # all, and the client's parser would drop the whole answer. The SDK's path writes null.
    async with wired(raw_config(tmp_path / "rec"), tmp_path) as wire:
        answer = await wire.call(1, {"name": "raw__odd_numbers", "arguments": {}})
    assert answer["result"]["structuredContent"] == {"nan": None, "inf": None, "ninf": None, "big": None}


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
async def test_a_client_number_json_cannot_carry_is_refused_and_reaches_no_backend(tmp_path: Path, number: str) -> None:
    # The same numbers from the client (Python's parser reads them): what a reviewer, the audit and
    # the backend would see could not be one value (NaN passes any minimum; the wire says null), so
    # the call is refused on the lean path (a read) and the SDK's (a write) alike, and nothing runs.
    record = tmp_path / "rec"
    cfg = {**raw_config(record), "servers": {**raw_config(record)["servers"], "toy": toy(tmp_path / "toy")}}
    cfg["review"] = {"default": "allow"}
    async with wired(cfg, tmp_path) as wire:
        for request_id, tool in ((7, "raw__stray"), (8, "toy__record")):
            line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool}})
            await wire.send(line[:-2] + f',"arguments":{{"value":{number}}}}}}}')
            answer = await wire.answer(request_id)
            assert answer["result"]["isError"] is True, answer
            assert "a number JSON cannot carry (NaN or an infinity) at value" in answer["result"]["content"][0]["text"]
    assert recorded(record) == [] and recorded(tmp_path / "toy") == []


async def test_answers_to_ids_never_asked_are_dropped_and_the_channel_goes_on(tmp_path: Path) -> None:
    # `stray` answers the next `msp-` id and an integer id before its own: neither may reach a
    # later call (the next read is asked under that very id) nor the SDK client's requests.
    async with wired(raw_config(tmp_path / "rec"), tmp_path) as wire:
        first = await wire.call(1, {"name": "raw__stray", "arguments": {}})
        second = await wire.call(2, {"name": "raw__stray", "arguments": {}})
        await wire.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        listed = await wire.answer(3)
    assert first["result"]["content"] == [{"type": "text", "text": "real"}]
    assert second["result"]["content"] == [{"type": "text", "text": "real"}]
    names = {tool["name"] for tool in listed["result"]["tools"]}
    assert names == {"raw__odd_numbers", "raw__stray", "raw__smuggle", "raw__forged", "raw__shout"}


async def test_a_result_cannot_smuggle_a_message_into_the_clients_stream(tmp_path: Path) -> None:
    from tests.fixtures.raw_server import SMUGGLED

    async with wired(raw_config(tmp_path / "rec"), tmp_path) as wire:
        answer = await wire.call(2, {"name": "raw__smuggle", "arguments": {}})
        await wire.send({"jsonrpc": "2.0", "id": "after", "method": "ping"})
        nxt = await wire.line()  # the very next line is the ping's answer: nothing was smuggled in
    assert answer["result"]["content"] == [{"type": "text", "text": SMUGGLED}]
    assert nxt["id"] == "after" and nxt["result"] == {}


async def test_two_http_clients_reading_at_once_each_get_their_own_answers_and_history(tmp_path: Path) -> None:
    # Two sessions (handshake era: one per Mcp-Session-Id) share one backend and its raw channel:
    # each read's answer reaches the client that asked, and goes into that client's history only
    # (the reviewer of A's write sees A's reads, never B's).
    from mcp import Client

    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.fronts.http import serve_http
    from mcp_spec_proxy.fronts.mcp import McpFront
    from mcp_spec_proxy.proxy import StatePaths, running_proxy
    from mcp_spec_proxy.testing import Respond, ScriptedModelServer

    answers: dict[str, str] = {}
    async with ScriptedModelServer(Respond(lambda request: verdict(0, "no"))) as model:
        cfg = config(tmp_path / "rec", review="strong")
        cfg["models"] = {"strong": {"base_url": model.base_url, "model": "strong-model", "max_retries": 0}}
        cfg["review"]["on_reject"] = "block"
        with anyio.fail_after(60):
            async with (
                running_proxy(ProxyConfig.model_validate(cfg), StatePaths(tmp_path / "state")) as proxy,
                anyio.create_task_group() as tg,
            ):
                front = McpFront(proxy)
                port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
                url = f"http://127.0.0.1:{port}/mcp"
                async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:

                    async def echo(client: Client, text: str) -> None:
                        answers[text] = text_of(await client.call_tool("toy__echo", {"text": text}))

                    async with anyio.create_task_group() as readers:
                        for n in range(20):
                            readers.start_soon(echo, a, f"alpha-{n}")
                            readers.start_soon(echo, b, f"bravo-{n}")
                    written = await a.call_tool("toy__record", {"value": "v", "intent": "x"})
                tg.cancel_scope.cancel()
        asked = json.dumps(model.chat_requests[0].raw["messages"])
    assert answers == {text: text for text in answers} and len(answers) == 40
    assert written.is_error and recorded(tmp_path / "rec") == []
    assert all(f"alpha-{n}" in asked for n in range(20))
    assert not any(f"bravo-{n}" in asked for n in range(20))


async def test_a_late_tools_lean_read_meets_the_same_checks_on_the_stdio_front(tmp_path: Path) -> None:
    # The spawned proxy serves before `late` arrives. An earlier run pinned `late`'s first listing
    # with another `echo`: its `echo` is changed and its other tools are new, and none may be read
    # on the lean path once it arrives; until then a call is a clear error at once.
    import os

    from mcp_spec_proxy.tools.fingerprints import SERVERS

    fifo = tmp_path / "start"
    os.mkfifo(fifo)
    state = tmp_path / "state"
    state.mkdir()
    seen = {"accepted": "0" * 64, "latest": "0" * 64, "first_seen": 0}
    (state / "fingerprints.json").write_text(json.dumps({SERVERS: {"late": {"first_listing": 0}}, "late/echo": seen}))
    late = toy(tmp_path / "late-rec", "--start-after", str(fifo), startup_timeout=600)
    cfg = {"servers": {"late": late, "toy": toy(tmp_path / "rec")}, "review": {"default": "deny"}}
    async with wired(cfg, tmp_path) as wire:
        early = await wire.call("early", {"name": "late__echo", "arguments": {"text": "too soon"}})
        os.close(os.open(fifo, os.O_WRONLY))  # the late toy starts
        for n in range(400):
            await wire.send({"jsonrpc": "2.0", "id": f"list{n}", "method": "tools/list"})
            if any(tool["name"] == "late__echo" for tool in (await wire.answer(f"list{n}"))["result"]["tools"]):
                break
            await anyio.sleep(0.05)
        echo = await wire.call("echo", {"name": "late__echo", "arguments": {"text": "x", "intent": "x"}})
        pulled = await wire.call("rug", {"name": "late__was_cancelled", "arguments": {"intent": "x"}})
    assert "error" in early and "not in the catalog" in early["error"]["message"]
    assert echo["result"]["isError"] and "Blocked at the write barrier" in echo["result"]["content"][0]["text"]
    assert pulled["result"]["isError"]  # every `late` tool is new to a server first listed before
    reads = [e["tool"] for e in audit(state) if e["event"] == "read"]
    assert not any(tool.startswith("late__") for tool in reads)
