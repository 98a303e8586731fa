"""The gateway's probes and drain over real HTTP: the same door as the MCP front's.

The probes answer a kubelet (no token, the pod's address as Host); `/metrics` wants the token;
once the replica drains, `/readyz` says so and a new chat completion is refused with 503 before
any model or backend is asked, while a turn waiting for the client's own tool goes on: the request
that brings the tool's result is admitted, and the drain waits for that turn to answer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import segment_length, toy, toy_twins, verdict
from tests.ops_world import until
from tests.test_gateway import CLIENT_TOOLS

pytestmark = pytest.mark.anyio

POD = {"Host": "10.1.2.3:18081"}
CHAT = {"model": "strong-only", "messages": [{"role": "user", "content": "hello"}]}


async def test_gateway_probes_answer_without_the_token_and_a_draining_gateway_refuses_new_chats(
    tmp_path: Path,
) -> None:
    async with ScriptedModelServer(Respond(lambda request: "hi")) as model:
        raw = {
            "servers": {"toy": toy(tmp_path / "rec")},
            "models": {"strong": {"base_url": model.base_url, "model": "strong-model", "max_retries": 0}},
        }
        config = ProxyConfig.model_validate(raw)
        with anyio.fail_after(60):
            async with (
                running_proxy(config, StatePaths(tmp_path / "state"), in_process=toy_twins(raw)) as proxy,
                anyio.create_task_group() as tg,
            ):
                front = Gateway(proxy)
                port = await tg.start(
                    lambda task_status: serve_gateway(front, "127.0.0.1", 0, token="s3cret", task_status=task_status)
                )
                auth = {"Authorization": "Bearer s3cret"}
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                    assert (await http.get("/healthz", headers=POD)).json() == {"status": "ok"}
                    assert (await http.get("/readyz", headers=POD)).json() == {"status": "ready"}
                    assert (await http.get("/metrics", headers=POD)).status_code == 401
                    assert (await http.get("/metrics", headers=auth)).status_code == 200
                    assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 401
                    answered = await http.post("/v1/chat/completions", json=CHAT, headers=auth)
                    assert answered.status_code == 200, answered.text
                    asked = len(model.chat_requests)

                    await proxy.gate.drain.run(30)  # SIGTERM's drain, with nothing in flight: at once
                    ready = await http.get("/readyz", headers=POD)
                    assert ready.status_code == 503
                    assert ready.json()["reasons"] == ["draining: the replica is shutting down"]
                    refused = await http.post("/v1/chat/completions", json=CHAT, headers=auth)
                    assert refused.status_code == 503, refused.text
                    assert refused.json()["error"]["code"] == "shutting_down"
                    assert "takes no new calls" in refused.json()["error"]["message"]
                    assert len(model.chat_requests) == asked  # no model was asked for the refused one
                tg.cancel_scope.cancel()
    refusals = [row for row in read_audit(tmp_path / "state" / "audit.jsonl") if row["event"] == "refused"]
    assert [row["tool"] for row in refusals] == ["this chat completion"]  # on the trail, as every refusal is


async def test_a_draining_gateway_finishes_a_turn_waiting_for_the_clients_tool_and_refuses_new_turns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    drafts: Iterator[Reply | str] = iter(
        [Reply(tool_calls=[ToolCall("send_email", {"to": "a@b.c", "body": "hi"})]), "Sent."]
    )

    def answer(request: ChatRequest) -> Reply | str:
        return next(drafts) if request.model == "weak-model" else verdict(segment_length(request))

    ran: list[dict[str, str]] = []  # the client's ledger: the tool calls it really ran
    async with ScriptedModelServer(Respond(answer)) as model:
        endpoint = {"base_url": model.base_url, "max_retries": 0}
        raw = {
            "servers": {"toy": toy(tmp_path / "rec")},
            "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
        }
        config = ProxyConfig.model_validate(raw)
        with anyio.fail_after(60):
            async with (
                running_proxy(config, StatePaths(tmp_path / "state"), in_process=toy_twins(raw)) as proxy,
                anyio.create_task_group() as tg,
            ):
                port = await tg.start(
                    lambda task_status: serve_gateway(Gateway(proxy), "127.0.0.1", 0, task_status=task_status)
                )
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1", timeout=30) as http:
                    messages: list[dict[str, object]] = [{"role": "user", "content": "Email a@b.c hi"}]
                    first = await http.post(
                        "/chat/completions", json={"model": "spec", "messages": messages, "tools": CLIENT_TOOLS}
                    )
                    assert first.status_code == 200, first.text
                    handed = first.json()["choices"][0]["message"]
                    [tool_call] = handed["tool_calls"]
                    assert tool_call["function"]["name"] == "send_email"
                    async with anyio.create_task_group() as sigterm:
                        sigterm.start_soon(proxy.gate.drain.run, 30.0)
                        with caplog.at_level(logging.WARNING, logger="mcp_spec_proxy.calls.drain"):
                            await until(lambda: proxy.gate.drain.draining)
                        # The stop says what it waits for: the client's result of the tool it was handed.
                        [said] = [r.getMessage() for r in caplog.records if r.name == "mcp_spec_proxy.calls.drain"]
                        assert "1 waiting for the client to send back a tool result the gateway handed out" in said
                        assert "(send_email (session gw-" in said and "waiting up to 30s for them" in said
                        new = {"model": "spec", "messages": [{"role": "user", "content": "another task"}]}
                        refused = await http.post("/chat/completions", json=new)
                        assert refused.status_code == 503, refused.text
                        ran.append(tool_call["function"])  # the client runs its tool, then sends the result
                        messages += [handed, {"role": "tool", "tool_call_id": tool_call["id"], "content": "sent"}]
                        body = {"model": "spec", "messages": messages, "tools": CLIENT_TOOLS}
                        done = await http.post("/chat/completions", json=body)
                        assert done.status_code == 200, done.text
                        assert done.json()["choices"][0]["message"]["content"] == "Sent."
                    assert not proxy.gate.drain.expired  # the drain ended when the turn answered, not at its grace
                tg.cancel_scope.cancel()
    assert [call["name"] for call in ran] == ["send_email"]
    events = [(line["event"], line.get("tool", "")) for line in read_audit(tmp_path / "state" / "audit.jsonl")]
    assert [event for event, tool in events if tool == "send_email"] == ["held", "verdict"]
    assert [event for event, _ in events].count("forwarded") == 1
