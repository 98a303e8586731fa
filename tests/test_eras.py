"""The era follows the client: a backend that speaks both eras is reached in each client's own,
and each client sees what its era's leg lists (the conformance suite's reference server lists
some tools on its 2026-07-28 path only).

The backend is an in-process server that lists `both` on every era and `modern_only` on the
2026-07-28 era alone, and whose ledger records the era each call arrived in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.server import Server, ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.harness import ERAS, call_error, proxied, text_of, toy

pytestmark = pytest.mark.anyio

OBJECT: dict[str, Any] = {"type": "object"}
READ = types.ToolAnnotations(read_only_hint=True)


def split_server(ledger: list[str]) -> Server[Any]:
    def era(ctx: ServerRequestContext[Any, Any]) -> str:
        return "modern" if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else "handshake"

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [types.Tool(name="both", input_schema=OBJECT, annotations=READ)]
        if era(ctx) == "modern":
            tools.append(types.Tool(name="modern_only", input_schema=OBJECT, annotations=READ))
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        ledger.append(f"{params.name}@{era(ctx)}")
        return types.CallToolResult(content=[types.TextContent(type="text", text=era(ctx))])

    return Server("split", on_list_tools=list_tools, on_call_tool=call_tool)


CONFIG: dict[str, Any] = {"servers": {"split": {"command": "unused"}}, "review": {"default": "deny"}}


@pytest.mark.parametrize("mode", ERAS)
async def test_each_client_reaches_the_backend_in_its_own_era_and_sees_its_eras_listing(
    tmp_path: Path, mode: str
) -> None:
    ledger: list[str] = []
    async with proxied(CONFIG, tmp_path, mode=mode, in_process={"split": split_server(ledger)}) as p:
        modern = mode != "legacy"
        names = sorted(tool.name for tool in (await p.client.list_tools()).tools)
        expected = ["split__both", "split__modern_only"] if modern else ["split__both"]
        assert names == expected
        result = await p.client.call_tool("split__both", {})
        era = "modern" if modern else "handshake"
        assert text_of(result) == era
        if modern:
            assert text_of(await p.client.call_tool("split__modern_only", {})) == "modern"
        else:
            error = await call_error(p.client, "split__modern_only", {})
            assert "unknown tool" in error.message
    assert ledger == ([f"both@{era}", "modern_only@modern"] if modern else ["both@handshake"])


async def test_the_proxys_own_agent_sees_every_eras_tools_and_reaches_each_where_it_is_listed(tmp_path: Path) -> None:
    ledger: list[str] = []
    async with proxied(CONFIG, tmp_path, in_process={"split": split_server(ledger)}) as p:
        catalog = p.proxy.catalog
        assert sorted(t.name for t in catalog.tools()) == ["split__both", "split__modern_only"]
        backend = p.proxy.backends.get("split")
        await backend.call_tool("modern_only", {})
        await backend.call_tool("both", {})
    assert ledger == ["modern_only@modern", "both@handshake"]


def caps_server() -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="caps", input_schema=OBJECT, annotations=READ)])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        declared = ctx.session.client_capabilities
        kinds = [k for k in ("sampling", "elicitation", "roots") if declared and getattr(declared, k) is not None]
        return types.CallToolResult(content=[types.TextContent(type="text", text=",".join(kinds) or "none")])

    return Server("caps", on_list_tools=list_tools, on_call_tool=call_tool)


async def _elicit(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="decline")


@pytest.mark.parametrize("asks", [False, True])
async def test_a_modern_backend_is_told_only_the_capabilities_the_calling_client_declared(
    tmp_path: Path, asks: bool
) -> None:
    config = ProxyConfig.model_validate({"servers": {"caps": {"command": "unused"}}, "review": {"default": "deny"}})
    elicitation = _elicit if asks else None
    with anyio.fail_after(30):
        async with running_proxy(config, StatePaths(tmp_path), in_process={"caps": caps_server()}) as proxy:
            front = McpFront(proxy)
            # Hosting suspended calls, as a serving front does: what a backend asks reaches the client.
            async with (
                front.suspensions.hosting(),
                Client(front.server, mode="2026-07-28", elicitation_callback=elicitation) as client,
            ):
                told = text_of(await client.call_tool("caps__caps", {}))
    assert told == ("elicitation" if asks else "none")


async def test_a_list_change_the_backend_announces_reaches_the_client_though_nothing_changed(tmp_path: Path) -> None:
    heard: list[str] = []

    async def messages(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.append(message.method)

    config = {"servers": {"toy": toy(tmp_path / "rec", "--legacy-only")}, "review": {"default": "deny"}}
    async with proxied(config, tmp_path / "state", messages=messages) as p:
        with anyio.fail_after(30):
            assert text_of(await p.client.call_tool("toy__flood", {"count": 1})) == "flooded"
            while not heard:  # noqa: ASYNC110 (the client's message handler records what it heard)
                await anyio.sleep(0.05)
    assert heard[0] == "notifications/tools/list_changed"  # directly, the client would hear it too
