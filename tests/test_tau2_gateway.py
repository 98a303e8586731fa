"""bench/tau2_retail/gateway.yaml, as docs/BENCHMARKS.md runs it with tau2-bench's runner: every model its
`/v1/models` lists is served, `spec+leash` included, with scripted models in place of the two SGLang servers."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest

from bench.tau2_retail.db import REPO_ROOT
from mcp_spec_proxy.config.schema import parse_config_text
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer
from tests.harness import segment_length, verdict

CONFIG = REPO_ROOT / "bench" / "tau2_retail" / "gateway.yaml"
WEAK_URL, STRONG_URL = "http://127.0.0.1:30000/v1", "http://127.0.0.1:30001/v1"  # gpu-tau2.sh's servers
ANSWER = "Your order #W1 is on its way."
LOOKUP = {
    "type": "function",
    "function": {
        "name": "get_order_details",
        "description": "Get the status and details of an order.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}


def answer(request: ChatRequest) -> Reply:
    if request.json_schema is not None:  # the strong model verifies the drafted answer
        return Reply(content=verdict(segment_length(request), "the answer follows the policy"))
    return Reply(content=ANSWER)


@pytest.mark.anyio
async def test_the_documented_gateway_config_serves_spec_leash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the config's bank_dir is relative to where the gateway starts
    text = CONFIG.read_text(encoding="utf-8")
    assert WEAK_URL in text and STRONG_URL in text
    async with (
        ScriptedModelServer(Respond(answer), models=("Qwen/Qwen3-4B",)) as weak,
        ScriptedModelServer(Respond(answer), models=("Qwen/Qwen3-32B",)) as strong,
    ):
        config = parse_config_text(text.replace(WEAK_URL, weak.base_url).replace(STRONG_URL, strong.base_url), {})
        with anyio.fail_after(60):
            async with running_proxy(config, StatePaths(tmp_path / "state")) as proxy, anyio.create_task_group() as tg:
                front = Gateway(proxy)
                port = await tg.start(lambda task_status: serve_gateway(front, "127.0.0.1", 0, task_status=task_status))
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/v1") as client:
                    listed = [model["id"] for model in (await client.get("/models")).json()["data"]]
                    asked = {
                        "model": "spec+leash",
                        "messages": [{"role": "user", "content": "Where is my order #W1?"}],
                        "tools": [LOOKUP],
                    }
                    answered = await client.post("/chat/completions", json=asked)
                tg.cancel_scope.cancel()
        verified = [r for r in strong.chat_requests if r.json_schema is not None]

    assert "spec+leash" in listed
    assert answered.status_code == 200, answered.text
    assert answered.json()["choices"][0]["message"]["content"] == ANSWER
    assert weak.chat_requests and len(verified) == 1  # drafted by the weak model, verified by the strong one
