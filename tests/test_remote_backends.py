"""Backends reached over the network (streamable HTTP and SSE), and backends' prompts and resources."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests import backends
from tests.harness import proxied, stdio, text_of, toy

pytestmark = pytest.mark.anyio


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def everything_over(transport: str) -> AsyncIterator[str]:
    """server-everything listening on a free port; yields its URL once it says it listens."""
    port = free_port()
    command = backends.everything()
    args = [arg if arg != "stdio" else transport for arg in command.args]
    process = await anyio.open_process([command.command, *args], env={**os.environ, "PORT": str(port)})
    async with process:
        assert process.stderr is not None
        with anyio.fail_after(30):
            seen = b""
            async for chunk in process.stderr:
                seen += chunk
                if b"listening on port" in seen.lower() or b"running on" in seen.lower():
                    break
        try:
            yield f"http://127.0.0.1:{port}/" + ("sse" if transport == "sse" else "mcp")
        finally:
            process.terminate()


@pytest.mark.parametrize("transport", ["streamableHttp", "sse"])
async def test_remote_backend_is_proxied(tmp_path: Path, transport: str) -> None:
    async with everything_over(transport) as url, proxied({"servers": {"remote": {"url": url}}}, tmp_path) as p:
        assert p.proxy.backends.get("remote").config.transport == ("sse" if transport == "sse" else "http")
        names = [tool.name for tool in (await p.client.list_tools()).tools]
        echoed = await p.client.call_tool("remote__echo", {"message": "far away"})
    assert "remote__get-sum" in names
    assert "far away" in text_of(echoed)


async def test_a_proxy_can_wrap_another_proxy_over_http(tmp_path: Path) -> None:
    inner = ProxyConfig.model_validate({"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "allow"}})
    async with (
        running_proxy(inner, StatePaths(tmp_path / "inner")) as proxy,
        anyio.create_task_group() as tg,
    ):
        front = McpFront(proxy)
        port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
        outer = {"servers": {"inner": {"url": f"http://127.0.0.1:{port}/mcp"}}, "review": {"default": "deny"}}
        async with proxied(outer, tmp_path / "outer") as p:
            echoed = await p.client.call_tool("inner__toy__echo", {"text": "twice"})
            # The outer proxy holds the write (deny), whatever the inner one would do.
            blocked = await p.client.call_tool("inner__toy__record", {"value": "v", "intent": "x"})
        tg.cancel_scope.cancel()
    assert text_of(echoed) == "twice"
    assert blocked.is_error
    assert not (tmp_path / "rec").exists()


async def test_prompts_and_resources_pass_through_namespaced(tmp_path: Path) -> None:
    async with proxied({"servers": {"ev": stdio(backends.everything())}}, tmp_path / "state") as p:
        prompts = [prompt.name for prompt in (await p.client.list_prompts()).prompts]
        prompt = await p.client.get_prompt("ev__simple-prompt")
        resources = (await p.client.list_resources()).resources
        templates = (await p.client.list_resource_templates()).resource_templates
        static = await p.client.read_resource(str(resources[0].uri))
        dynamic = await p.client.read_resource("demo://resource/dynamic/text/7")
    assert "ev__simple-prompt" in prompts and "ev__args-prompt" in prompts
    assert prompt.messages
    assert all(resource.name.startswith("ev__") for resource in resources)
    assert str(resources[0].uri).startswith("demo://resource/static/")
    assert [t.uri_template for t in templates] == [
        "demo://resource/dynamic/text/{resourceId}",
        "demo://resource/dynamic/blob/{resourceId}",
    ]
    assert static.contents and dynamic.contents
