"""The OpenAI-compatible gateway, driven by the real `openai` client over real HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionFunctionToolParam, ChatCompletionMessageFunctionToolCall

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests import backends
from tests.harness import segment_length, stdio, verdict

pytestmark = pytest.mark.anyio

CLIENT_TOOLS: list[ChatCompletionFunctionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send an email.",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                "required": ["to", "body"],
            },
        },
    },
]


def first_call(response: ChatCompletion) -> ChatCompletionMessageFunctionToolCall:
    """The response's first tool call: a function call (the gateway relays no other kind)."""
    calls = response.choices[0].message.tool_calls
    assert calls, response
    assert isinstance(calls[0], ChatCompletionMessageFunctionToolCall), calls[0]
    return calls[0]


@dataclass
class Gw:
    url: str
    client: openai.AsyncOpenAI
    model: ScriptedModelServer
    root: Path

    def requests(self, model: str) -> list[ChatRequest]:
        return [r for r in self.model.chat_requests if r.model == model]


@asynccontextmanager
async def gateway(
    tmp_path: Path, weak: Callable[[ChatRequest], Reply | str], strong: Callable[[ChatRequest], Reply | str]
) -> AsyncIterator[Gw]:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("meeting at noon\n")

    def answer(request: ChatRequest) -> Reply | str:
        return weak(request) if request.model == "weak-model" else strong(request)

    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        config = ProxyConfig.model_validate(
            {
                "servers": {"fs": stdio(backends.filesystem(root))},
                "models": {
                    "weak": {**endpoint, "model": "weak-model"},
                    "strong": {**endpoint, "model": "strong-model"},
                },
            }
        )
        with anyio.fail_after(60):
            async with running_proxy(config, StatePaths(tmp_path / "state")) as proxy, anyio.create_task_group() as tg:
                front = Gateway(proxy)
                port = await tg.start(lambda task_status: serve_gateway(front, "127.0.0.1", 0, task_status=task_status))
                url = f"http://127.0.0.1:{port}/v1"
                async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
                    yield Gw(url, client, server, root)
                tg.cancel_scope.cancel()


def weak_script(replies: list[Reply | str]) -> Callable[[ChatRequest], Reply | str]:
    queue = iter(replies)
    return lambda request: next(queue)


async def test_multi_turn_conversation_with_client_side_tools(tmp_path: Path) -> None:
    weak = weak_script(
        [
            Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
            Reply(tool_calls=[ToolCall("send_email", {"to": "ana@example.com", "body": "Sunny in Paris"})]),
            "I told Ana it is sunny.",
            "You're welcome.",
        ]
    )
    async with gateway(tmp_path, weak, lambda r: verdict(segment_length(r))) as g:
        messages: list[Any] = [{"role": "user", "content": "Tell Ana the weather in Paris."}]
        first = await g.client.chat.completions.create(model="spec", messages=messages, tools=CLIENT_TOOLS)
        call = first_call(first)
        assert first.choices[0].finish_reason == "tool_calls"
        assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 C"},
        ]

        second = await g.client.chat.completions.create(model="spec", messages=messages, tools=CLIENT_TOOLS)
        email = first_call(second)
        assert email.function.name == "send_email"  # a write: verified before it reached the client
        assert len(g.requests("strong-model")) == 1
        assert "Sunny, 24 C" in json.dumps(g.requests("strong-model")[0].messages)
        messages += [
            second.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": email.id, "content": "sent"},
        ]

        third = await g.client.chat.completions.create(model="spec", messages=messages, tools=CLIENT_TOOLS)
        assert third.choices[0].message.content == "I told Ana it is sunny."
        assert third.usage is not None and third.usage.completion_tokens > 0
        messages += [
            {"role": "assistant", "content": third.choices[0].message.content},
            {"role": "user", "content": "Thanks!"},
        ]

        fourth = await g.client.chat.completions.create(model="spec", messages=messages, tools=CLIENT_TOOLS)
        assert fourth.choices[0].message.content == "You're welcome."
        # The second turn's drafting saw the first turn's steps and answer.
        last_draft = json.dumps(g.requests("weak-model")[-1].messages)
        assert "Sunny, 24 C" in last_draft and "I told Ana it is sunny." in last_draft


async def test_rejected_client_step_is_gone_from_what_the_models_see(tmp_path: Path) -> None:
    weak = weak_script(
        [
            Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
            Reply(tool_calls=[ToolCall("send_email", {"to": "ana@example.com", "body": "Paris: rain"})]),
            Reply(tool_calls=[ToolCall("send_email", {"to": "ana@example.com", "body": "London: fog"})]),
            "Done.",
        ]
    )
    strong_replies: Iterator[Callable[[ChatRequest], str]] = iter(
        [
            lambda r: verdict(0, "Ana lives in London", {"tool": "get_weather", "arguments": {"city": "London"}}),
            lambda r: verdict(segment_length(r)),
        ]
    )
    async with gateway(tmp_path, weak, lambda r: next(strong_replies)(r)) as g:
        messages: list[Any] = [{"role": "user", "content": "Tell Ana the weather where she lives."}]
        results = {"Paris": "rain", "London": "fog"}
        for _ in range(4):
            response = await g.client.chat.completions.create(model="spec", messages=messages, tools=CLIENT_TOOLS)
            message = response.choices[0].message
            if not message.tool_calls:
                break
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                assert isinstance(call, ChatCompletionMessageFunctionToolCall), call
                args = json.loads(call.function.arguments)
                content = results.get(args.get("city", ""), "sent")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        assert message.content == "Done."
        called = [json.loads(m["tool_calls"][0]["function"]["arguments"]) for m in messages if m.get("tool_calls")]
    assert called == [{"city": "Paris"}, {"city": "London"}, {"to": "ana@example.com", "body": "London: fog"}]
    # The client's transcript holds the Paris step; the models never see it again.
    later = g.requests("weak-model")[2:]
    assert later and all("Paris" not in json.dumps(r.messages) for r in later)


async def test_backend_tools_run_inside_the_gateway(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak = weak_script([Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": notes})]), "At noon."])
    async with gateway(tmp_path, weak, lambda r: verdict(0)) as g:
        response = await g.client.chat.completions.create(
            model="spec", messages=[{"role": "user", "content": "When is the meeting?"}]
        )
    assert response.choices[0].message.content == "At noon."
    assert "meeting at noon" in json.dumps(g.requests("weak-model")[1].messages)


async def test_concurrent_sessions_do_not_share_state(tmp_path: Path) -> None:
    def weak(request: ChatRequest) -> Reply | str:
        who = request.last_user_text.split()[-1]
        seen = [m for m in request.messages if m.get("role") == "tool"]
        if not seen:
            return Reply(tool_calls=[ToolCall("get_weather", {"city": who})])
        observed = seen[-1]["content"].removeprefix("<<<tool-output\n").removesuffix("\ntool-output>>>")
        return f"{who}: {observed}"

    async with gateway(tmp_path, weak, lambda r: verdict(0)) as g:
        answers: dict[str, str] = {}

        async def converse(city: str) -> None:
            headers = {"X-Session-Id": f"session-{city}"}
            messages: list[Any] = [{"role": "user", "content": f"Weather in {city}"}]
            first = await g.client.chat.completions.create(
                model="spec", messages=messages, tools=CLIENT_TOOLS, extra_headers=headers
            )
            call = first_call(first)
            assert json.loads(call.function.arguments) == {"city": city}
            messages += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": f"{city}-weather"},
            ]
            final = await g.client.chat.completions.create(
                model="spec", messages=messages, tools=CLIENT_TOOLS, extra_headers=headers
            )
            answers[city] = final.choices[0].message.content or ""

        async with anyio.create_task_group() as tg:
            for city in ("Oslo", "Lima", "Rome"):
                tg.start_soon(converse, city)
    assert answers == {"Oslo": "Oslo: Oslo-weather", "Lima": "Lima: Lima-weather", "Rome": "Rome: Rome-weather"}


async def test_streaming_responses_are_valid_chunks(tmp_path: Path) -> None:
    weak = weak_script([Reply(tool_calls=[ToolCall("get_weather", {"city": "Kyiv"})]), "Cold in Kyiv, take a coat."])
    async with gateway(tmp_path, weak, lambda r: verdict(0)) as g:
        messages: list[Any] = [{"role": "user", "content": "Do I need a coat in Kyiv?"}]
        stream = await g.client.chat.completions.create(
            model="spec", messages=messages, tools=CLIENT_TOOLS, stream=True, stream_options={"include_usage": True}
        )
        name, arguments, call_id, finish, usage = "", "", "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for delta in choice.delta.tool_calls or []:
                    call_id = delta.id or call_id
                    name += (delta.function.name or "") if delta.function else ""
                    arguments += (delta.function.arguments or "") if delta.function else ""
        assert (name, json.loads(arguments), finish) == ("get_weather", {"city": "Kyiv"}, "tool_calls")
        assert usage is not None and usage.total_tokens > 0
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
            },
            {"role": "tool", "tool_call_id": call_id, "content": "-5 C"},
        ]
        text_stream = await g.client.chat.completions.create(
            model="spec", messages=messages, tools=CLIENT_TOOLS, stream=True
        )
        text = "".join([choice.delta.content or "" async for chunk in text_stream for choice in chunk.choices])
    assert text == "Cold in Kyiv, take a coat."


async def test_malformed_requests_get_openai_style_errors(tmp_path: Path) -> None:
    async with gateway(tmp_path, weak_script([]), lambda r: verdict(0)) as g, httpx.AsyncClient() as http:
        not_json = await http.post(
            f"{g.url}/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
        )
        no_messages = await http.post(f"{g.url}/chat/completions", json={"model": "spec"})
        bad_tools = await http.post(
            f"{g.url}/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "tools": [1]}
        )
        models = await http.get(f"{g.url}/models")
        with pytest.raises(openai.NotFoundError) as missing:
            await g.client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    for response in (not_json, no_messages, bad_tools):
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert "not valid JSON" in not_json.json()["error"]["message"]
    assert missing.value.code == "model_not_found"
    # What can run with a weak and a strong model and no `leash:` section: not spec+leash.
    assert [m["id"] for m in models.json()["data"]] == ["mcp-spec-proxy", "spec", "weak-only", "strong-only"]
