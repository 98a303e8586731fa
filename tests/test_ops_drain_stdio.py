"""SIGTERM on a real `mcp-spec-proxy` serving stdio, with writes held for a person (the console).

The client is raw JSON lines on the process's pipes, so what reaches it is exactly what the process
wrote before it exited. A write approved during the drain runs (the backend's ledger) and its
result reaches the client; a write the client sent before the signal, queued behind another of its
session, is in flight and not refused; a call sent after the signal is refused with -32016 and
audited `refused`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
import yaml

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.errors import SHUTTING_DOWN
from tests.harness import PROXY_COMMAND, recorded
from tests.ops_world import until
from tests.test_ops_drain import approve, console_link, held_on_console, world

pytestmark = pytest.mark.anyio


@dataclass
class StdioProxy:
    process: anyio.abc.Process
    answers: dict[Any, dict[str, Any]] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send((json.dumps(message) + "\n").encode())

    async def call(self, request_id: int, tool: str, arguments: dict[str, Any]) -> None:
        params = {"name": tool, "arguments": arguments}
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})

    async def logged(self, pattern: str) -> None:
        await until(lambda: any(re.search(pattern, line) for line in self.log))

    async def exited(self) -> int:
        await until(lambda: self.process.returncode is not None)
        return int(self.process.returncode or 0)


async def _lines(stream: anyio.abc.ByteReceiveStream | None, each: Any) -> None:
    assert stream is not None
    buffered = b""
    async for chunk in stream:
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            each(line.decode(errors="replace"))


@asynccontextmanager
async def stdio_proxy(config: dict[str, Any], tmp: Path) -> AsyncIterator[StdioProxy]:
    (tmp / "servers.yaml").write_text(yaml.safe_dump(config))
    argv = [PROXY_COMMAND, "--config", str(tmp / "servers.yaml"), "--state-dir", str(tmp / "state")]
    # Telemetry: the decision's line is written after the forward and before the answer, as operators run it.
    argv += ["--telemetry", str(tmp / "telemetry.jsonl")]
    process = await anyio.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proxy = StdioProxy(process)

    def answered(line: str) -> None:
        message = json.loads(line)
        if "id" in message:
            proxy.answers[message["id"]] = message

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_lines, process.stdout, answered)
            tg.start_soon(_lines, process.stderr, proxy.log.append)
            init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
            await proxy.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
            await until(lambda: 1 in proxy.answers)
            await proxy.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            yield proxy
            await proxy.exited()
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.move_on_after(10, shield=True):
            await process.wait()


def _result(answer: dict[str, Any]) -> str:
    assert "result" in answer, answer
    return " ".join(block["text"] for block in answer["result"]["content"])


async def _approve_next(tmp: Path, seen: set[str]) -> None:
    """Approve the console's next held item that was not approved before."""
    link, origin = console_link(tmp)
    async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as console:
        assert (await console.get(link)).status_code == 200
        item = await _held_but(console, seen)
        seen.add(item)
        await approve(console, origin, item)


async def _held_but(console: httpx.AsyncClient, seen: set[str]) -> str:
    async with console.stream("GET", "/events") as events:
        async for line in events.aiter_lines():
            if line.startswith("data:") and (
                fresh := [str(i) for i in json.loads(line[5:])["ids"] if str(i) not in seen]
            ):
                return fresh[0]
    raise AssertionError("the console's events ended")


async def test_a_write_approved_during_the_drain_on_stdio_runs_and_its_result_reaches_the_client(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    with anyio.fail_after(90):
        async with stdio_proxy(world(ledger, 60), tmp_path) as proxy:
            await proxy.call(2, "toy__record", {"value": "held"})
            await until(lambda: (tmp_path / "state" / "console-url").exists())
            link, origin = console_link(tmp_path)
            async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as console:
                assert (await console.get(link)).status_code == 200
                item = await held_on_console(console)
                proxy.process.send_signal(signal.SIGTERM)
                await proxy.logged(r"draining: 1 call\(s\) in flight, 1 held")
                await approve(console, origin, item)
            code = await proxy.exited()
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["held"]
    assert _result(proxy.answers[2]) == "recorded held", "".join(proxy.log)
    assert code == 0
    events = [line["event"] for line in read_audit(tmp_path / "state" / "audit.jsonl") if line["event"] != "read"]
    assert events == ["held", "verdict", "forwarded"]


async def test_a_write_queued_behind_a_held_one_before_sigterm_is_in_flight_and_a_later_one_is_refused_on_the_trail(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    approved: set[str] = set()
    with anyio.fail_after(90):
        async with stdio_proxy(world(ledger, 60), tmp_path) as proxy:
            await proxy.call(2, "toy__record", {"value": "first"})
            await proxy.call(3, "toy__record", {"value": "queued"})  # waits for the first's verdict
            await until(lambda: (tmp_path / "state" / "console-url").exists())
            link, origin = console_link(tmp_path)
            async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as console:
                assert (await console.get(link)).status_code == 200
                await held_on_console(console)
            proxy.process.send_signal(signal.SIGTERM)
            await proxy.logged(r"draining: 2 call\(s\) in flight, 1 held")
            await proxy.call(4, "toy__record", {"value": "late"})  # sent after the signal: a new call
            await until(lambda: 4 in proxy.answers)
            await _approve_next(tmp_path, approved)
            await _approve_next(tmp_path, approved)  # the queued one, held once the first settled
            code = await proxy.exited()
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["first", "queued"]
    assert _result(proxy.answers[2]) == "recorded first"
    assert _result(proxy.answers[3]) == "recorded queued", "".join(proxy.log)
    assert proxy.answers[4]["error"]["code"] == SHUTTING_DOWN
    assert code == 0
    lines = read_audit(tmp_path / "state" / "audit.jsonl")
    refused = [line for line in lines if line["event"] == "refused"]
    assert [(line["tool"], line["reason"]) for line in refused] == [("toy__record", "the replica is shutting down")]
    assert [line["event"] for line in lines].count("forwarded") == 2
