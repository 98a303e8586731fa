"""SIGTERM on a real `mcp-spec-proxy --http` replica with a write held for a person (the console).

The drain takes no new call, tells the load balancer (`/readyz`), lets the held write be decided
within `drain_s` — approved, it runs, as the backend's ledger shows — and exits 0. When the grace
runs out first, the held write never runs and the audit trail says why: the replica shut down,
not that its client left.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.provenance import own_blocks
from mcp_spec_proxy.errors import SHUTTING_DOWN
from mcp_spec_proxy.fronts.console import CONSOLE_URL_FILE
from tests.harness import recorded, text_of, toy
from tests.ops_world import SERVING, Running, serving

pytestmark = pytest.mark.anyio

DRAINING = re.compile(r"draining: 1 call\(s\) in flight, 1 held")


def world(ledger: Path, drain_s: float) -> dict[str, Any]:
    return {"servers": {"toy": toy(ledger)}, "review": {"default": "console", "intent": False}, "drain_s": drain_s}


async def held_on_console(console: httpx.AsyncClient) -> str:
    """The held call's item on the console, once it shows there."""
    async with console.stream("GET", "/events") as events:
        async for line in events.aiter_lines():
            if line.startswith("data:") and (ids := json.loads(line[5:])["ids"]):
                return str(ids[0])
    raise AssertionError("the console's events ended")


async def approve(console: httpx.AsyncClient, origin: str, item: str) -> None:
    card = (await console.get(f"/pending/{item}")).text
    decision = card.split('data-id="', 1)[1].split('"', 1)[0]
    digest = card.split('data-digest="', 1)[1].split('"', 1)[0]
    answer = await console.post(
        f"/decide/{decision}",
        content=json.dumps({"action": "approve", "digest": digest}),
        headers={"origin": origin, "content-type": "application/json"},
    )
    assert answer.status_code == 200, answer.text


async def call(url: str, tool: str, arguments: dict[str, Any], out: list[str]) -> None:
    try:
        async with (
            httpx2.AsyncClient(timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            await client.list_tools()  # as a client does first: its call's result is then checked without asking again
            try:
                result = await client.call_tool(tool, arguments)
            except MCPError as exc:
                out.append(f"error {exc.error.code}: {exc.error.message}")
                return
            # The backend's words: the proxy's own leading notice (this client names no session) aside.
            theirs = result.model_copy(update={"content": result.content[own_blocks(result) :]})
            out.append(("error: " if result.is_error else "") + text_of(theirs))
    except (httpx2.HTTPError, ExceptionGroup) as exc:  # a replica that stops at once closes its connections
        out.append(f"disconnected: {type(exc).__name__}")


def console_link(tmp: Path) -> tuple[str, str]:
    url = (tmp / "state" / CONSOLE_URL_FILE).read_text().strip()
    return url, url.split("/?", 1)[0]


async def hold_then_terminate(proxy: Running, tmp: Path, tg: anyio.abc.TaskGroup, out: list[str]) -> tuple[str, str]:
    """A write held on the console, then SIGTERM: the MCP URL and the console's origin, once draining."""
    url = (await proxy.line(SERVING)).group(1)
    tg.start_soon(call, url, "toy__record", {"value": "held"}, out)
    link, origin = console_link(tmp)
    async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as console:
        assert (await console.get(link)).status_code == 200
        await held_on_console(console)
    proxy.terminate()
    await proxy.line(DRAINING)
    return url, link


async def test_a_held_write_approved_during_the_drain_runs_and_the_replica_exits_0(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    out: list[str] = []
    late: list[str] = []
    async with serving(world(ledger, 120), tmp_path, "--console", "127.0.0.1:0") as proxy:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                url, link = await hold_then_terminate(proxy, tmp_path, tg, out)
                ready = await proxy.get("/readyz")
                assert ready.json().get("reasons") == ["draining: the replica is shutting down"], proxy.log()
                await call(url, "toy__record", {"value": "new"}, late)  # a new call, from another client
                assert late and late[0].startswith(f"error {SHUTTING_DOWN}:"), late
                assert "takes no new calls" in late[0]
                await call(url, "toy__echo", {"text": "a read"}, late)  # reads too: it takes no new call
                assert late[1].startswith(f"error {SHUTTING_DOWN}:"), late
                origin = link.split("/?", 1)[0]
                async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as console:
                    assert (await console.get(link)).status_code == 200
                    await approve(console, origin, await held_on_console(console))
            code = await proxy.wait()  # the drain is over once the held call settled: it exits by itself
    assert out == ["recorded held"], (out, proxy.log())  # its result reached the client: not an error, not a drop
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["held"]  # it ran; the refused one did not
    assert code == 0, proxy.log()
    events = [line["event"] for line in read_audit(tmp_path / "state" / "audit.jsonl")]
    assert "forwarded" in events and "abandoned" not in events


async def test_a_held_write_left_when_the_grace_runs_out_is_abandoned_because_the_replica_shut_down(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    out: list[str] = []
    async with serving(world(ledger, 1), tmp_path, "--console", "127.0.0.1:0") as proxy:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                await hold_then_terminate(proxy, tmp_path, tg, out)
            code = await proxy.wait()
    assert out and out[0].startswith(f"error {SHUTTING_DOWN}:") and "the replica shut down" in out[0], out
    assert recorded(ledger) == []  # never forwarded
    assert code == 0, proxy.log()
    lines = read_audit(tmp_path / "state" / "audit.jsonl")
    abandoned = [line for line in lines if line["event"] == "abandoned"]
    assert [line["reason"] for line in abandoned] == ["the replica shut down"], lines
    assert abandoned[0]["tool"] == "toy__record"


async def test_a_second_sigterm_stops_at_once_and_the_held_write_is_abandoned_because_the_replica_shut_down(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    out: list[str] = []
    async with serving(world(ledger, 120), tmp_path, "--console", "127.0.0.1:0") as proxy:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                await hold_then_terminate(proxy, tmp_path, tg, out)
                proxy.terminate()  # the operator does not wait for the grace
                code = await proxy.wait()
    assert recorded(ledger) == []
    assert code == 0, proxy.log()
    abandoned = [line for line in read_audit(tmp_path / "state" / "audit.jsonl") if line["event"] == "abandoned"]
    assert [line["reason"] for line in abandoned] == ["the replica shut down"], abandoned


async def test_a_third_signal_while_the_replica_stops_is_ignored_and_it_exits_0_without_a_traceback(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    out: list[str] = []
    async with serving(world(ledger, 120), tmp_path, "--console", "127.0.0.1:0") as proxy:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                await hold_then_terminate(proxy, tmp_path, tg, out)
                proxy.terminate()  # the second: stop at once
                await proxy.line(re.compile(r"stopping: closing backends"))
                proxy.proc.send_signal(signal.SIGINT)  # an impatient operator's Ctrl-C while it stops
                await proxy.line(re.compile(r"SIGINT while stopping: ignored"))
                code = await proxy.wait()
    assert code == 0, proxy.log()
    assert "Traceback" not in proxy.log()
    assert recorded(ledger) == []
    abandoned = [line for line in read_audit(tmp_path / "state" / "audit.jsonl") if line["event"] == "abandoned"]
    assert [line["reason"] for line in abandoned] == ["the replica shut down"], abandoned
