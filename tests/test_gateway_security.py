"""The gateway's edges, from outside over real HTTP: who may drive it, and what one bad request may break.

A web page in the user's browser must not be able to drive the gateway (token, Host, Origin and
Content-Type checks), and one request's failure answers that request alone: the next request,
from any client, is served as if nothing had happened.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import recorded, segment_length, toy, toy_twins, verdict

pytestmark = pytest.mark.anyio

TOKEN = "gw-s3cret"
WRITE = Reply(tool_calls=[ToolCall("toy__record", {"value": "v"})])


@dataclass
class Gw:
    url: str
    http: httpx.AsyncClient
    model: ScriptedModelServer
    record_file: Path

    async def chat(self, text: str, *, session: str, **headers: str) -> httpx.Response:
        body = {"model": "spec", "messages": [{"role": "user", "content": text}]}
        return await self.http.post(
            f"{self.url}/chat/completions", json=body, headers={"X-Session-Id": session, **headers}
        )


@asynccontextmanager
async def gateway(
    tmp_path: Path, weak: Callable[[ChatRequest], Reply | str], *, token: str | None = None
) -> AsyncIterator[Gw]:
    """The real gateway on port 0 over the toy backend (whose `record` writes we can count)."""

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return weak(request)
        return verdict(segment_length(request)) if "# Segment to verify" in json.dumps(request.messages) else "done"

    record_file = tmp_path / "rec"
    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        raw = {
            "servers": {"toy": toy(record_file)},
            "models": {
                "weak": {**endpoint, "model": "weak-model"},
                "strong": {**endpoint, "model": "strong-model"},
            },
            "review": {"default": "strong"},
        }
        config = ProxyConfig.model_validate(raw)
        twins = toy_twins(raw)  # the gateway is under test here, not the backend's process
        with anyio.fail_after(60):
            async with (
                running_proxy(config, StatePaths(tmp_path / "state"), in_process=twins) as proxy,
                anyio.create_task_group() as tg,
            ):
                front = Gateway(proxy)
                port = await tg.start(
                    lambda task_status: serve_gateway(front, "127.0.0.1", 0, token=token, task_status=task_status)
                )
                async with httpx.AsyncClient(timeout=30) as http:
                    yield Gw(f"http://127.0.0.1:{port}/v1", http, server, record_file)
                tg.cancel_scope.cancel()


def by_text(replies: dict[str, Reply | str]) -> Callable[[ChatRequest], Reply | str]:
    """The weak model's turn for the task in the first user message: its script, then "done"."""

    def weak(request: ChatRequest) -> Reply | str:
        task = next(str(m["content"]) for m in request.messages if m.get("role") == "user")
        if any(m.get("role") == "tool" for m in request.messages):
            return "done"
        return replies.get(task, "hello")

    return weak


def raw_tool_call(call: dict[str, Any]) -> Reply:
    """A chat completion with one tool call written verbatim (JSON the scripted model would not write)."""
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    body = {
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "created": 0,
        "model": "weak-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    return Reply(raw_body=json.dumps(body))


async def test_requests_without_the_token_are_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path, by_text({"write": WRITE}), token=TOKEN) as g:
        bare = await g.chat("write", session="a")
        wrong = await g.chat("write", session="b", Authorization="Bearer nope")
        models = await g.http.get(f"{g.url}/models")
        assert recorded(g.record_file) == [] and g.model.chat_requests == []
        right = await g.chat("write", session="c", Authorization=f"Bearer {TOKEN}")
    assert (bare.status_code, wrong.status_code, models.status_code) == (401, 401, 401)
    assert "Bearer" in bare.headers["www-authenticate"]
    assert right.status_code == 200 and right.json()["choices"][0]["message"]["content"] == "done"
    assert len(recorded(g.record_file)) == 1


async def test_foreign_host_is_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path, by_text({"write": WRITE})) as g:
        refused = await g.chat("write", session="a", Host="evil.example")
        refused_models = await g.http.get(f"{g.url}/models", headers={"Host": "evil.example"})
        assert recorded(g.record_file) == [] and g.model.chat_requests == []
        accepted = await g.chat("write", session="b", Host="localhost")
    assert refused.status_code in (403, 421) and refused_models.status_code in (403, 421)
    assert "evil.example" in refused.json()["error"]["message"]
    assert accepted.status_code == 200
    assert len(recorded(g.record_file)) == 1


async def test_foreign_origin_is_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path, by_text({"write": WRITE})) as g:
        refused = await g.chat("write", session="a", Origin="http://evil.example")
        null = await g.chat("write", session="b", Origin="null")
        assert recorded(g.record_file) == [] and g.model.chat_requests == []
        local = await g.chat("write", session="c", Origin="http://localhost:3000")
    assert (refused.status_code, null.status_code) == (403, 403)
    assert "evil.example" in refused.json()["error"]["message"]
    assert local.status_code == 200
    assert not any(h.startswith("access-control-") for r in (refused, local) for h in r.headers)


async def test_text_plain_post_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    body = json.dumps({"model": "spec", "messages": [{"role": "user", "content": "write"}]})
    async with gateway(tmp_path, by_text({"write": WRITE})) as g:
        refused = await g.http.post(
            f"{g.url}/chat/completions", content=body, headers={"Content-Type": "text/plain;charset=UTF-8"}
        )
        missing = await g.http.post(f"{g.url}/chat/completions", content=body)
        assert recorded(g.record_file) == [] and g.model.chat_requests == []
    assert (refused.status_code, missing.status_code) == (415, 415)
    assert "application/json" in refused.json()["error"]["message"]
    assert not any(h.startswith("access-control-") for h in refused.headers)


async def test_tool_call_with_null_function_fails_only_that_request(tmp_path: Path) -> None:
    broken = raw_tool_call({"id": "call_1", "type": "function", "function": None})
    async with gateway(tmp_path, by_text({"break": broken})) as g:
        with anyio.fail_after(30):
            failed = await g.chat("break", session="first")
            later = await g.chat("write", session="second")
    # A failed turn is that request's error (424: not retried blindly by SDKs), never the process's.
    assert failed.status_code >= 424 and failed.json()["error"]["message"]
    assert later.status_code == 200 and later.json()["choices"][0]["message"]["content"] == "hello"


async def test_write_with_a_lone_surrogate_fails_only_that_request(tmp_path: Path) -> None:
    # The arguments' JSON text escapes a lone surrogate: valid JSON, but no valid Unicode string.
    lone = raw_tool_call(
        {"id": "call_1", "type": "function", "function": {"name": "toy__record", "arguments": '{"value": "\\ud800"}'}}
    )
    async with gateway(tmp_path, by_text({"surrogate": lone, "write": WRITE})) as g:
        with anyio.fail_after(30):
            failed = await g.chat("surrogate", session="first")
            later = await g.chat("write", session="second")
    assert failed.status_code >= 400 and failed.json()["error"]["message"]
    assert later.status_code == 200 and later.json()["choices"][0]["message"]["content"] == "done"
    assert recorded(g.record_file) == ['{"value": "v"}']  # the surrogate write never ran


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
async def test_answer_with_a_lone_surrogate_is_still_valid_json(tmp_path: Path, stream: bool) -> None:
    # The model's own text holds a lone surrogate: it cannot be UTF-8, so it goes out JSON-escaped.
    body = {
        "id": "chatcmpl-raw",
        "object": "chat.completion",
        "created": 0,
        "model": "weak-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "odd \ud800"}, "finish_reason": "stop"}],
    }
    odd = Reply(raw_body=json.dumps(body))
    async with gateway(tmp_path, by_text({"odd": odd})) as g:
        with anyio.fail_after(30):
            request = {"model": "spec", "stream": stream, "messages": [{"role": "user", "content": "odd"}]}
            answered = await g.http.post(f"{g.url}/chat/completions", json=request, headers={"X-Session-Id": "a"})
            later = await g.chat("hi", session="b")
    assert answered.status_code == 200
    if stream:
        chunks = [json.loads(line[6:]) for line in answered.text.splitlines() if line.startswith("data: {")]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    else:
        text = answered.json()["choices"][0]["message"]["content"]
    assert text == "odd \ud800"
    assert later.status_code == 200 and later.json()["choices"][0]["message"]["content"] == "hello"
