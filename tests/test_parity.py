"""Direct-vs-proxied parity: the same tool calls, against a backend and through the proxy, give the
same content, structured content and error flag, in both client eras.

One test body per backend runs its calls twice — once straight at the backend, once through the
proxy (`review: allow`, so writes are forwarded too) — each against a fresh backend, and compares
what came back and what the writes left behind. The toy runs as its in-process twin (its ledger
is the write's trace); the reference servers run as real stdio processes, because they are what
users wrap: the npm filesystem and everything servers (handshake era only, so the direct side
speaks the legacy era to them) and the Python time server (both eras).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.server import Server

from tests import backends
from tests.fixtures import toy_server
from tests.harness import ERAS, proxied, recorded, stdio, toy

pytestmark = pytest.mark.anyio

CallFn = Callable[[str, dict[str, Any]], Awaitable[types.CallToolResult]]
Outcome = tuple[list[Any], Any, bool]


@asynccontextmanager
async def direct(target: Server[Any] | backends.BackendCommand, mode: str) -> AsyncIterator[CallFn]:
    server: Any = target
    if isinstance(target, backends.BackendCommand):
        server = StdioServerParameters(command=target.command, args=target.args, env=target.env or None)
    with anyio.fail_after(60):
        async with Client(server, mode=mode) as client:

            async def call(tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
                return await client.call_tool(tool, arguments)

            yield call


@asynccontextmanager
async def through_proxy(
    name: str, entry: dict[str, Any], state: Path, mode: str, twin: Server[Any] | None = None
) -> AsyncIterator[CallFn]:
    config = {"servers": {name: entry}, "review": {"default": "allow"}}
    async with proxied(config, state, mode=mode, in_process={name: twin} if twin else None) as p:
        writes = {
            tool.name
            for tool in (await p.client.list_tools()).tools
            if "intent" in tool.input_schema.get("properties", {})
        }

        async def call(tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
            qualified = f"{name}__{tool}"
            if qualified in writes:
                arguments = {**arguments, "intent": "parity test: the user asked for this write"}
            return await p.client.call_tool(qualified, arguments)

        yield call


async def run(call: CallFn, calls: list[tuple[str, dict[str, Any]]]) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for tool, arguments in calls:
        result = await call(tool, arguments)
        outcomes.append((result.content, result.structured_content, bool(result.is_error)))
    return outcomes


TOY_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("echo", {"text": "parity"}),
    ("big", {"size": 2048}),
    ("record", {"value": "first"}),
    ("record", {"value": "second"}),
    ("progress", {}),
]


@pytest.mark.parametrize("mode", ERAS)
async def test_toy_calls_and_writes_match_direct_and_proxied(tmp_path: Path, mode: str) -> None:
    direct_ledger, proxied_ledger = tmp_path / "direct.rec", tmp_path / "proxied.rec"
    async with direct(toy_server.build(direct_ledger), mode) as call:
        straight = await run(call, TOY_CALLS)
    twin = toy_server.build(proxied_ledger)
    async with through_proxy("toy", toy(proxied_ledger), tmp_path / "state", mode, twin) as call:
        via_proxy = await run(call, TOY_CALLS)
    assert via_proxy == straight
    assert [error for _, _, error in straight] == [False] * len(straight)
    assert recorded(proxied_ledger) == recorded(direct_ledger) == ['{"value": "first"}', '{"value": "second"}']


@pytest.mark.parametrize("mode", ERAS)
async def test_filesystem_reads_and_writes_match_direct_and_proxied(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("first line\nsecond line\n")
    target = root / "new.txt"
    calls: list[tuple[str, dict[str, Any]]] = [
        ("read_text_file", {"path": str(root / "notes.txt")}),
        ("list_directory", {"path": str(root)}),
        ("write_file", {"path": str(target), "content": "written\n"}),
        ("edit_file", {"path": str(target), "edits": [{"oldText": "written", "newText": "edited"}]}),
        ("read_text_file", {"path": str(target)}),
        ("read_text_file", {"path": str(tmp_path / "outside.txt")}),  # outside the root: an error either way
    ]
    server = backends.filesystem(root)
    async with direct(server, "legacy") as call:  # it speaks only the handshake era
        straight = await run(call, calls)
    after_direct = target.read_text()
    target.unlink()
    async with through_proxy("fs", stdio(server), tmp_path / "state", mode) as call:
        via_proxy = await run(call, calls)
    assert via_proxy == straight
    assert target.read_text() == after_direct == "edited\n"
    assert [error for _, _, error in straight] == [False] * 5 + [True]


@pytest.mark.parametrize("mode", ERAS)
async def test_everything_server_content_kinds_match_direct_and_proxied(tmp_path: Path, mode: str) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("echo", {"message": "parity"}),
        ("get-sum", {"a": 2, "b": 40}),
        ("get-structured-content", {"location": "New York"}),
        ("get-tiny-image", {}),
        ("get-annotated-message", {"messageType": "error", "includeImage": True}),
        ("get-resource-links", {"count": 2}),
    ]
    server = backends.everything()
    async with direct(server, "legacy") as call:  # it speaks only the handshake era
        straight = await run(call, calls)
    async with through_proxy("everything", stdio(server), tmp_path / "state", mode) as call:
        via_proxy = await run(call, calls)
    assert via_proxy == straight
    assert straight[2][1] is not None  # structured content really was compared
    assert any(isinstance(block, types.ImageContent) for block in straight[3][0])


@pytest.mark.parametrize("mode", ERAS)
async def test_time_server_matches_direct_and_proxied_in_its_own_era(tmp_path: Path, mode: str) -> None:
    calls = [
        ("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
        ("convert_time", {"source_timezone": "Europe/Paris", "time": "08:30", "target_timezone": "America/New_York"}),
        ("convert_time", {"source_timezone": "Nowhere/Atlantis", "time": "12:00", "target_timezone": "UTC"}),
    ]
    server = backends.time()
    async with direct(server, mode) as call:  # it speaks both eras: the direct side uses the same one
        straight = await run(call, calls)
    async with through_proxy("time", stdio(server), tmp_path / "state", mode) as call:
        via_proxy = await run(call, calls)
    assert via_proxy == straight
    assert straight[0][1] is not None and straight[2][2]  # structured content compared; the bad zone errs


@pytest.mark.parametrize(("protocol", "spoken"), [("auto", "2026-07-28"), ("legacy", "2025-11-25")])
async def test_backend_protocol_picks_the_era_the_proxy_speaks_to_it(
    tmp_path: Path, protocol: str, spoken: str
) -> None:
    config = {"servers": {"toy": toy(tmp_path / "calls.jsonl", protocol=protocol)}, "review": {"default": "deny"}}
    async with proxied(config, tmp_path / "state") as p:
        assert p.proxy.backends.get("toy").client.protocol_version == spoken
        result = await p.client.call_tool("toy__echo", {"text": "hi"})
    assert not result.is_error
