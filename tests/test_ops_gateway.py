"""The gateway's probes and drain over real HTTP: the same door as the MCP front's.

The probes answer a kubelet (no token, the pod's address as Host); `/metrics` wants the token;
once the replica drains, `/readyz` says so and a new chat completion is refused with 503 before
any model or backend is asked.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from mcp_spec_proxy.config import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import Respond, ScriptedModelServer
from tests.harness import toy, toy_twins

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
