"""A throughput level of bench/front_load.py driven by npm autocannon instead of SDK clients.

    .venv/bin/python -m bench.front_load --driver autocannon ...      (autocannon: scripts/install-test-backends.sh)

An SDK `Client` read costs the client more CPU than a lean proxy spends serving it, so on a small
machine the SDK-driven figure is mostly the client's: the ratio between two targets tends to the
ratio of their whole read's CPU, the client's share included. autocannon (Node, the HTTP load
generator) replays one read as the SDK sent it, so a level measures the targets, not the client:

1. the SDK opens the level's sessions (handshake era: one a connection, each initialized by the
   SDK and its read recorded for its `Mcp-Session-Id`; 2026-07-28: one client, since no session
   exists) and makes one read on each, recording the exact request it sent;
2. autocannon (bench/cannon.cjs) sends that request, headers and body as the SDK sent them, the
   JSON-RPC id made unique each time, over one keep-alive connection a session, until the level's
   reads are done, and checks every answer: a 2xx carrying a finished tools/call result (content,
   no `isError`, no `resultType` but "complete"), as JSON or as the last event of an SSE body. One
   answer that is not is a failed level, never a figure.

The SDK sessions stay open, idle, while autocannon reads on them: `open_level` opens them and
`fire` reads, so a caller measuring the level leaves the sessions' opening and closing out of it.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bench import peers
from bench.overhead import declaring

SCRIPT = Path(__file__).resolve().parent / "cannon.cjs"
LEVEL_S = 600.0
DROPPED = ("host", "content-length", "connection", "mcp-session-id")  # autocannon sets these per connection


class Recorded:
    """The tools/call requests one SDK client sent: their headers and JSON bodies."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, str], dict[str, Any]]] = []

    async def hook(self, request: httpx2.Request) -> None:
        if request.method != "POST":
            return
        try:
            body = json.loads(request.content)
        except ValueError:
            return
        if isinstance(body, dict) and body.get("method") == "tools/call":
            self.calls.append((dict(request.headers), body))


async def _recorded_read(stack: AsyncExitStack, order: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """An SDK session (or 2026-07-28 client) opened on the target, one read made, and what it sent."""
    recorded = Recorded()
    http = await stack.enter_async_context(httpx2.AsyncClient(event_hooks={"request": [recorded.hook]}))
    transport = streamable_http_client(order["url"], http_client=http)
    client = await stack.enter_async_context(Client(transport, mode=order["era"], **declaring(order["roots"])))
    result = await client.call_tool(order["tool"], order["arguments"])
    if result.is_error or not recorded.calls:
        raise SystemExit(f"{order['tool']} failed before the level began: {result.content}")
    return recorded.calls[-1]


async def open_level(stack: AsyncExitStack, order: dict[str, Any], sessions: int) -> dict[str, Any]:
    """The level's sessions opened by the SDK, one read made on each, and autocannon's plan for `fire`.
    The sessions stay open until `stack` closes, so a caller measuring the level leaves their handshakes,
    first reads and closing out of it, as the SDK driver's pool opens its sessions before its start."""
    opened = sessions if order["era"] == "legacy" else 1
    reads = [await _recorded_read(stack, order) for _ in range(opened)]
    headers, body = reads[0]
    ids = [sent.get("mcp-session-id") for sent, _ in reads] if order["era"] == "legacy" else None
    if ids is not None and not all(ids):
        raise SystemExit(f"{order['url']}: a handshake-era session sent its read without an Mcp-Session-Id")
    return {
        "autocannon": str(peers.autocannon_dir()),
        "url": order["url"],
        "headers": {name: value for name, value in headers.items() if name not in DROPPED},
        "body": json.dumps({**body, "id": "[<id>]"}, separators=(",", ":")),
        "sessions": ids,
        "connections": sessions,
        "amount": sessions * order["reads"],
    }


async def fire(plan: dict[str, Any]) -> dict[str, Any]:
    """autocannon reading as `plan` says; its report (reads, seconds, its own CPU seconds, latency
    p50/p99), or one line saying why the level gives no figure."""
    with tempfile.TemporaryDirectory() as folder:
        order_file = Path(folder) / "order.json"
        order_file.write_text(json.dumps(plan))
        with anyio.fail_after(LEVEL_S):
            done = await anyio.run_process([peers.node(), str(SCRIPT), str(order_file)], check=False)
    report = _report(done)
    if report["bad"] or report["errors"] or report["non2xx"] or report["reads"] != plan["amount"]:
        raise SystemExit(
            f"{plan['url']}: {report['bad']} answers without a result, {report['errors']} connection errors,"
            f" {report['non2xx']} answers not 2xx, {report['reads']} of {plan['amount']} reads answered:"
            " no figure from this level"
        )
    return report


def _report(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    try:
        report: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        report = {"error": done.stderr.decode(errors="replace").strip().splitlines()[-1:] or "no output"}
    if done.returncode != 0 or "error" in report:
        raise SystemExit(f"autocannon failed (exit {done.returncode}): {report.get('error')}")
    return report
