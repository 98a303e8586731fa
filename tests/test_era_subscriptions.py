"""Resource subscriptions follow the client's era, as the conformance suite's reference server needs.

That server offers subscriptions on the handshake era only: its `server/discover` declares
`resources: {}` and it answers `resources/subscribe` -32601 on 2026-07-28, where the method is gone.
Under `protocol: auto` the proxy's first session to it speaks 2026-07-28, and every subscription used
to go down that session: a handshake-era client was refused ("does not support subscriptions") where,
directly, it subscribes. Now its subscription goes down the backend's handshake-era session, and each
client is told `resources.subscribe` as its era's session offers it. The backend here is such a server,
in process; its ledger records each subscription with the era it arrived in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import IncomingMessage
from mcp.server import Server, ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tests.harness import proxied

pytestmark = pytest.mark.anyio

NOTE = "note://today"
READ = types.ToolAnnotations(read_only_hint=True)


def handshake_subscriptions(ledger: list[str]) -> Server[Any]:
    """Resources on both eras, subscriptions on the handshake era alone (no listen stream), and a
    tool `touch` that announces an update of `NOTE` to a session that subscribed to it."""
    subscribed: set[str] = set()

    def era(ctx: ServerRequestContext[Any, Any]) -> str:
        return "modern" if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else "handshake"

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        touch = types.Tool(name="touch", input_schema={"type": "object"}, annotations=READ)
        return types.ListToolsResult(tools=[touch])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if NOTE in subscribed:
            await ctx.session.send_resource_updated(NOTE)
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"touched@{era(ctx)}")])

    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri=NOTE, name="today")])

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="notes")])

    async def subscribe(ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams) -> types.EmptyResult:
        subscribed.add(params.uri)
        ledger.append(f"subscribe@{era(ctx)}")
        return types.EmptyResult()

    async def unsubscribe(
        ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        subscribed.discard(params.uri)
        ledger.append(f"unsubscribe@{era(ctx)}")
        return types.EmptyResult()

    return Server(
        "notes",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
    )


CONFIG: dict[str, Any] = {
    "servers": {"notes": {"command": "unused", "protocol": "auto"}},  # its first session: 2026-07-28
    "review": {"default": "deny"},
}


async def test_a_handshake_era_client_subscribes_on_the_backends_handshake_era_session_and_hears_updates(
    tmp_path: Path,
) -> None:
    ledger: list[str] = []
    updates: list[str] = []
    heard = anyio.Event()

    async def messages(message: IncomingMessage) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            updates.append(message.params.uri)
            heard.set()

    in_process = {"notes": handshake_subscriptions(ledger)}
    async with proxied(CONFIG, tmp_path / "state", in_process=in_process, messages=messages) as p:
        first = p.proxy.backends.get("notes").client
        assert first.protocol_version in MODERN_PROTOCOL_VERSIONS  # the case at hand: the first session is 2026-07-28
        caps = p.client.server_capabilities
        assert caps.resources is not None and caps.resources.subscribe  # as the server tells this era directly
        with anyio.fail_after(30):
            subscribe = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=NOTE))
            await p.client.session.send_request(subscribe, types.EmptyResult)
            touched = await p.client.call_tool("notes__touch", {})
            await heard.wait()
            unsubscribe = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=NOTE))
            await p.client.session.send_request(unsubscribe, types.EmptyResult)
    assert ledger == ["subscribe@handshake", "unsubscribe@handshake"]
    assert touched.content[-1] == types.TextContent(type="text", text="touched@handshake")
    assert updates == [NOTE]


async def test_a_2026_07_28_client_is_told_no_subscriptions_as_that_era_offers_none(tmp_path: Path) -> None:
    in_process = {"notes": handshake_subscriptions([])}
    async with proxied(CONFIG, tmp_path / "state", mode="auto", in_process=in_process) as p:  # auto: it discovers
        assert p.client.protocol_version in MODERN_PROTOCOL_VERSIONS
        caps = p.client.server_capabilities
    assert caps.resources is not None and not caps.resources.subscribe
