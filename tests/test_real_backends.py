"""The proxy in front of the real reference servers, driven over real stdio in both client eras.

Backends: the npm filesystem, memory and everything servers (handshake era only), the PyPI git
and time servers (2026-07-28 era), and mcp-server-sqlite on mcp 1.x (no annotations at all).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from mcp_spec_proxy.backends.relay import Relay
from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import RelayConfig
from tests import backends
from tests.harness import ERAS, spawned, stdio, text_of

pytestmark = pytest.mark.anyio


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Any]:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("first line\nsecond line\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README").write_text("hello\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    return {
        "root": root,
        "repo": repo,
        "backends": {
            "fs": backends.filesystem(root),
            "memory": backends.memory(tmp_path / "memory.jsonl"),
            "everything": backends.everything(),
            "git": backends.git(repo),
            "time": backends.time(),
            "sqlite": backends.sqlite(tmp_path / "db.sqlite"),
        },
    }


def proxy_config(world: dict[str, Any], review: str = "human") -> dict[str, Any]:
    return {"servers": {name: stdio(cmd) for name, cmd in world["backends"].items()}, "review": {"default": review}}


async def direct_tools(command: backends.BackendCommand) -> list[types.Tool]:
    params = StdioServerParameters(command=command.command, args=command.args, env=command.env or None)
    # A client with the capabilities the proxy declares to its backends (it relays what they ask):
    # the everything server lists its sampling, elicitation and roots tools only to such a client.
    declared = Relay("direct", RelayConfig().kinds()).callbacks()
    with anyio.fail_after(60):
        async with Client(params, mode="auto", **declared) as client:
            return (await client.list_tools()).tools


@pytest.mark.parametrize("mode", ERAS)
async def test_every_backend_tool_is_listed_with_its_definition_intact(
    tmp_path: Path, world: dict[str, Any], mode: str
) -> None:
    async with spawned(proxy_config(world), tmp_path, mode=mode) as client:
        proxied = {tool.name: tool for tool in (await client.list_tools()).tools}
    for server, command in world["backends"].items():
        originals = await direct_tools(command)
        assert originals, server
        for original in originals:
            tool = proxied[f"{server}__{original.name}"]
            assert tool.annotations == original.annotations, tool.name
            assert tool.title == original.title
            assert tool.description == original.description
            assert tool.output_schema == original.output_schema
            assert tool.meta == original.meta
            read = bool(original.annotations and original.annotations.read_only_hint)
            if read:
                assert tool.input_schema == original.input_schema
            else:
                assert "intent" in tool.input_schema["properties"]
                assert "intent" not in tool.input_schema.get("required", [])
    assert len(proxied) == sum([len(await direct_tools(c)) for c in world["backends"].values()])


@pytest.mark.parametrize("mode", ERAS)
async def test_reads_run_at_once_through_the_proxy(tmp_path: Path, world: dict[str, Any], mode: str) -> None:
    async def must_not_ask(context: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("a read was held")

    async with spawned(proxy_config(world), tmp_path, mode=mode, elicitation=must_not_ask) as client:
        text = await client.call_tool("fs__read_text_file", {"path": str(world["root"] / "notes.txt")})
        status = await client.call_tool("git__git_status", {"repo_path": str(world["repo"])})
        graph = await client.call_tool("memory__read_graph", {})
        now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
    assert text_of(text) == "first line\nsecond line\n"
    assert "On branch main" in text_of(status)
    assert not graph.is_error and '"entities"' in text_of(graph)
    assert '"timezone": "UTC"' in text_of(now)
    audit = read_audit(tmp_path / "state" / "audit.jsonl")
    assert [e["event"] for e in audit] == ["read"] * 4  # audited, none held for review


@pytest.mark.parametrize("mode", ERAS)
async def test_write_file_is_on_disk_only_after_an_accepting_verdict(
    tmp_path: Path, world: dict[str, Any], mode: str
) -> None:
    target = world["root"] / "new.txt"
    seen: list[bool] = []

    async def look_then_approve(context: Any, params: Any) -> types.ElicitResult:
        seen.append(target.exists())
        return types.ElicitResult(action="accept", content={"approve": True})

    async with spawned(proxy_config(world), tmp_path, mode=mode, elicitation=look_then_approve) as client:
        result = await client.call_tool(
            "fs__write_file", {"path": str(target), "content": "written", "intent": "the user asked for new.txt"}
        )
    assert not result.is_error, text_of(result)
    assert seen and seen[-1] is False  # asked while the file was not yet there
    assert target.read_text() == "written"
    events = [e["event"] for e in read_audit(tmp_path / "state" / "audit.jsonl")]
    assert events[-3:] == ["held", "verdict", "forwarded"]


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize(("review", "written"), [("allow", True), ("deny", False)])
async def test_write_file_after_allow_and_never_after_deny(
    tmp_path: Path, world: dict[str, Any], mode: str, review: str, written: bool
) -> None:
    target = world["root"] / "out.txt"
    async with spawned(proxy_config(world, review), tmp_path, mode=mode) as client:
        result = await client.call_tool("fs__write_file", {"path": str(target), "content": "x", "intent": "test"})
        listing = await client.call_tool("fs__list_directory", {"path": str(world["root"])})
    assert bool(result.is_error) is not written
    assert target.exists() is written
    assert ("out.txt" in text_of(listing)) is written


async def test_every_tool_of_the_unannotated_sqlite_server_is_held(tmp_path: Path, world: dict[str, Any]) -> None:
    async with spawned(proxy_config(world, "deny"), tmp_path) as client:
        tools = [t for t in (await client.list_tools()).tools if t.name.startswith("sqlite__")]
        assert len(tools) == 6
        assert all("intent" in t.input_schema["properties"] for t in tools)  # all writes
        blocked = await client.call_tool("sqlite__list_tables", {"intent": "look"})
    assert blocked.is_error and "Blocked at the write barrier" in text_of(blocked)


async def test_same_reads_give_the_same_results_direct_and_proxied(tmp_path: Path, world: dict[str, Any]) -> None:
    calls = [
        ("fs", "read_text_file", {"path": str(world["root"] / "notes.txt")}),
        ("fs", "list_directory", {"path": str(world["root"])}),
        ("fs", "get_file_info", {"path": str(world["root"] / "notes.txt")}),
        ("memory", "read_graph", {}),
        ("time", "convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
        ("git", "git_log", {"repo_path": str(world["repo"])}),
        ("everything", "echo", {"message": "parity"}),
    ]
    direct: list[Any] = []
    for server, tool, args in calls:
        command = world["backends"][server]
        params = StdioServerParameters(command=command.command, args=command.args, env=command.env or None)
        async with Client(params, mode="auto") as client:
            result = await client.call_tool(tool, args)
            direct.append((result.content, result.structured_content, result.is_error))
    proxied: list[Any] = []
    async with spawned(proxy_config(world), tmp_path) as client:
        for server, tool, args in calls:
            result = await client.call_tool(f"{server}__{tool}", args)
            proxied.append((result.content, result.structured_content, result.is_error))
    assert proxied == direct
