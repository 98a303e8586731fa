"""What a draining replica does with requests beyond tools/call: each is a new call, refused and on
the audit trail, or a new session, refused at the door so the client connects elsewhere.

Resources, prompts, completions and subscriptions reach a backend (a backend may do work to
render them), so during the drain they are counted in flight like a read and a new one is refused
with -32016 and audited `refused`. On the HTTP front an `initialize` is answered 503 (Retry-After,
-32016) while the sessions already open go on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.drain import SHUTTING_DOWN_REASON
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import SHUTTING_DOWN
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.fixtures import feature_server
from tests.harness import proxied

pytestmark = pytest.mark.anyio

CONFIG: dict[str, Any] = {"servers": {"feat": {"command": "unused"}}, "review": {"default": "allow"}}


async def test_resources_prompts_completions_and_subscriptions_are_new_calls_a_drain_refuses_on_the_trail(
    tmp_path: Path,
) -> None:
    prompt = types.PromptReference(type="ref/prompt", name="feat__greet")
    subscribe = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=feature_server.TODAY))
    async with proxied(CONFIG, tmp_path / "state", in_process={"feat": feature_server.build()}) as p:
        assert (await p.client.read_resource(feature_server.TODAY)).contents  # served before the drain
        await p.proxy.gate.drain.run(30)
        refusals = []
        for request in (
            lambda: p.client.read_resource(feature_server.TODAY),
            lambda: p.client.get_prompt("feat__greet", {"name": "ada"}),
            lambda: p.client.complete(prompt, {"name": "name", "value": "a"}),
            lambda: p.client.session.send_request(subscribe, types.EmptyResult),
        ):
            with pytest.raises(MCPError) as refused:
                await request()
            refusals.append((refused.value.error.code, "shutting down" in refused.value.error.message))
    assert refusals == [(SHUTTING_DOWN, True)] * 4
    lines = read_audit(tmp_path / "state" / "audit.jsonl")
    refused_lines = [line for line in lines if line["event"] == "refused"]
    assert [line["reason"] for line in refused_lines] == [SHUTTING_DOWN_REASON] * 4
    assert [line.get("uri") or line.get("prompt") or line.get("ref") for line in refused_lines] == [
        feature_server.TODAY,
        "greet",
        "greet",
        feature_server.TODAY,
    ]
    assert [line["event"] for line in lines].count("resource") == 1  # only the read before the drain reached it


async def test_a_draining_http_front_refuses_a_new_session_and_keeps_serving_the_open_one(tmp_path: Path) -> None:
    config = ProxyConfig.model_validate(CONFIG)
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "late", "version": "0"}}
    with anyio.fail_after(60):
        async with (
            running_proxy(config, StatePaths(tmp_path / "state"), in_process={"feat": feature_server.build()}) as proxy,
            anyio.create_task_group() as tg,
        ):
            port = await tg.start(
                lambda task_status: serve_http(McpFront(proxy), "127.0.0.1", 0, task_status=task_status)
            )
            url = f"http://127.0.0.1:{port}/mcp"
            async with (
                httpx2.AsyncClient(timeout=30) as http,
                Client(streamable_http_client(url, http_client=http)) as open_session,
            ):
                await proxy.gate.drain.run(30)
                async with httpx.AsyncClient(timeout=30) as raw:
                    late = await raw.post(
                        url,
                        json={"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": init},
                        headers={"accept": "application/json, text/event-stream"},
                    )
                assert late.status_code == 503, late.text
                assert late.headers["retry-after"] == "1"
                assert late.json()["id"] == 7 and late.json()["error"]["code"] == SHUTTING_DOWN
                assert "takes no new sessions" in late.json()["error"]["message"]
                assert (await open_session.list_tools()).tools  # the session already open goes on
            tg.cancel_scope.cancel()
