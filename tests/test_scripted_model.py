"""The scripted model server, driven over real HTTP by the official `openai.AsyncOpenAI` client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from mcp_spec_proxy.testing import (
    ChatRequest,
    Reply,
    Respond,
    Scripted,
    ScriptedModelServer,
    ToolCall,
)

pytestmark = pytest.mark.anyio

MODEL = "scripted-model"
WAIT_S = 10

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@asynccontextmanager
async def client_for(server: ScriptedModelServer, **options: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    # No retries: a retried request would silently consume another scripted reply.
    options.setdefault("max_retries", 0)
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", **options) as client:
        yield client


def user(text: str) -> Any:
    return {"role": "user", "content": text}


async def test_models_endpoint_lists_configured_model_ids() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), models=["a", "b"]) as server, client_for(server) as client:
            page = await client.models.list()
    assert [m.id for m in page.data] == ["a", "b"]
    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1/models")]


async def test_plain_completion_returns_scripted_content_and_usage() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted(["Hello, world!"])) as server, client_for(server) as client:
            completion = await client.chat.completions.create(model=MODEL, messages=[user("hi")])
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.message.content == "Hello, world!"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == 4  # Hello , world !
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert server.requests[0].path == "/v1/chat/completions"
    assert server.requests[0].body["messages"] == [user("hi")]


async def test_tool_calls_round_trip_through_the_client() -> None:
    reply = Reply(
        tool_calls=[ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Oslo"}, id="c2")]
    )
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([reply])) as server, client_for(server) as client:
            completion = await client.chat.completions.create(
                model=MODEL, messages=[user("weather?")], tools=[WEATHER_TOOL]
            )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None
    assert [c.type for c in calls] == ["function", "function"]
    assert isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id.startswith("call_")
    assert calls[1].id == "c2"
    assert server.chat_requests[0].tools == [WEATHER_TOOL]


async def test_reasoning_comes_back_as_reasoning_content() -> None:
    with anyio.fail_after(WAIT_S):
        async with (
            ScriptedModelServer(Scripted([Reply(content="4", reasoning="2 + 2 is 4")])) as server,
            client_for(server) as client,
        ):
            completion = await client.chat.completions.create(model=MODEL, messages=[user("2 + 2?")])
    message = completion.choices[0].message
    assert message.content == "4"
    assert message.model_extra == {"reasoning_content": "2 + 2 is 4"}
    assert completion.usage is not None
    assert completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 5


async def test_json_schema_response_format_is_recorded_not_enforced() -> None:
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
    }
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted(["definitely not JSON"])) as server, client_for(server) as client:
            completion = await client.chat.completions.create(
                model=MODEL, messages=[user("judge")], response_format=response_format
            )
    assert completion.choices[0].message.content == "definitely not JSON"
    assert server.requests[0].body["response_format"] == response_format
    assert server.chat_requests[0].json_schema == response_format["json_schema"]


async def test_policy_sees_typed_request_and_set_policy_swaps_it() -> None:
    seen: list[ChatRequest] = []

    def sync_policy(request: ChatRequest) -> str:
        seen.append(request)
        return f"sync saw {request.last_user_text}"

    async def async_policy(request: ChatRequest) -> Reply:
        seen.append(request)
        return Reply(content=f"async saw {request.last_user_text}")

    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Respond(sync_policy)) as server, client_for(server) as client:
            first = await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "system", "content": "be brief"}, user("one")],
                reasoning_effort="low",
                temperature=0,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}},
            )
            server.set_policy(Respond(async_policy))
            second = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "two"}]}]
            )
    assert first.choices[0].message.content == "sync saw one"
    assert second.choices[0].message.content == "async saw two"
    assert seen[0].chat_template_kwargs == {"enable_thinking": False}
    assert seen[0].reasoning_effort == "low"
    assert seen[0].extra == {"temperature": 0}
    assert seen[0].raw["model"] == MODEL
    assert seen[1].chat_template_kwargs == {}
    assert seen[1].reasoning_effort is None


async def test_streamed_text_rejoins_to_the_reply_and_ends_with_usage_chunk() -> None:
    text = "The quick brown fox,  jumps.\n"
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([text])) as server, client_for(server) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[user("go")], stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) > 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 7  # The quick brown fox , jumps .
    assert all(c.usage is None for c in chunks[:-1])


async def test_streamed_tool_calls_accumulate_from_argument_deltas() -> None:
    arguments = {"city": "Paris", "units": "metric"}
    reply = Reply(content="Checking.", tool_calls=[ToolCall("get_weather", arguments), ToolCall("get_time")])
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([reply, reply])) as server, client_for(server) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[user("go")], tools=[WEATHER_TOOL], stream=True
            )
            calls: dict[int, dict[str, str]] = {}
            argument_deltas = 0
            async for chunk in stream:
                assert chunk.usage is None
                for delta in chunk.choices[0].delta.tool_calls or []:
                    call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] += delta.id or ""
                    if delta.function is not None:
                        call["name"] += delta.function.name or ""
                        call["arguments"] += delta.function.arguments or ""
                        argument_deltas += bool(delta.function.arguments)
            # The client's own accumulation must agree.
            async with client.chat.completions.stream(
                model=MODEL, messages=[user("go")], tools=[WEATHER_TOOL], stream_options={"include_usage": True}
            ) as helper:
                final = await helper.get_final_completion()
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == arguments
    assert json.loads(calls[1]["arguments"]) == {}
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert argument_deltas > 2  # arguments really were split over chunks
    message = final.choices[0].message
    assert message.content == "Checking."
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", arguments),
        ("get_time", {}),
    ]
    assert final.usage is not None
    assert final.usage.completion_tokens > 0


async def test_cached_tokens_grow_with_a_shared_prefix_and_are_zero_for_an_unrelated_prompt() -> None:
    system = {"role": "system", "content": "You review tool calls. " * 20}
    turn_1 = [system, user("first question")]
    turn_2 = [*turn_1, {"role": "assistant", "content": "first answer"}, user("second question")]
    turn_3 = [*turn_2, {"role": "assistant", "content": "second answer"}, user("third question")]
    other_system = [{"role": "system", "content": "Something else entirely. " * 20}, user("hello")]

    async def cached_tokens(client: openai.AsyncOpenAI, messages: Any, tools: Any, model: str = MODEL) -> int:
        completion = await client.chat.completions.create(model=model, messages=messages, tools=tools)
        assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
        cached = completion.usage.prompt_tokens_details.cached_tokens
        assert cached is not None
        assert cached <= completion.usage.prompt_tokens
        return cached

    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Respond(lambda _: "ok")) as server, client_for(server) as client:
            first = await cached_tokens(client, turn_1, [WEATHER_TOOL])
            second = await cached_tokens(client, turn_2, [WEATHER_TOOL])
            third = await cached_tokens(client, turn_3, [WEATHER_TOOL])
            unrelated = await cached_tokens(client, other_system, openai.omit)
            # Tools render first, as chat templates put them in the system preamble: they stay a cached prefix.
            same_tools_other_system = await cached_tokens(client, other_system, [WEATHER_TOOL])
            other_model = await cached_tokens(client, turn_3, [WEATHER_TOOL], model="other")
    assert first == 0
    assert 0 < second < third
    assert unrelated == 0
    assert 0 < same_tools_other_system < second
    assert other_model == 0  # the cache is per model


async def test_exact_prefix_cache_with_block_of_one() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Respond(lambda _: "ok"), cache_block=1) as server, client_for(server) as client:
            first = await client.chat.completions.create(model=MODEL, messages=[user("a b c")])
            again = await client.chat.completions.create(model=MODEL, messages=[user("a b c")])
            longer = await client.chat.completions.create(model=MODEL, messages=[user("a b c d")])
    assert first.usage is not None and again.usage is not None and longer.usage is not None
    assert again.usage.prompt_tokens_details is not None and longer.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens
    # `[{"role":"user","content":"a b c` is shared; the closing `"}]` is not.
    assert longer.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 3


async def test_delay_past_client_timeout_raises_api_timeout_error_without_holding_up_shutdown() -> None:
    # The bound is well under the 5 s delay: leaving the server must cut the delay short.
    with anyio.fail_after(3):
        async with (
            ScriptedModelServer(Scripted([Reply(content="late", delay_s=5)])) as server,
            client_for(server, timeout=0.3) as client,
        ):
            with pytest.raises(openai.APITimeoutError):
                await client.chat.completions.create(model=MODEL, messages=[user("hurry")])
    assert len(server.requests) == 1


async def test_http_500_reply_surfaces_as_internal_server_error() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([Reply(status=500)])) as server, client_for(server) as client:
            with pytest.raises(openai.InternalServerError) as raised:
                await client.chat.completions.create(model=MODEL, messages=[user("hi")])
    assert raised.value.status_code == 500
    assert raised.value.body == {"message": "scripted HTTP 500", "type": "server_error", "param": None, "code": None}


async def test_error_body_is_returned_verbatim_with_its_status() -> None:
    body = {"error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "rate_limited"}}
    with anyio.fail_after(WAIT_S):
        async with (
            ScriptedModelServer(Scripted([Reply(status=429, error_body=body)])) as server,
            client_for(server) as client,
        ):
            with pytest.raises(openai.RateLimitError) as raised:
                await client.chat.completions.create(model=MODEL, messages=[user("hi")])
    assert raised.value.code == "rate_limited"
    assert raised.value.message == "Error code: 429 - slow down"


async def test_raw_non_json_body_surfaces_as_json_decode_error_not_an_openai_error() -> None:
    # The client parses an `application/json` body with no wrapping: the error is json's own.
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([Reply(raw_body="not json")])) as server, client_for(server) as client:
            with pytest.raises(json.JSONDecodeError):
                await client.chat.completions.create(model=MODEL, messages=[user("hi")])


async def test_raw_non_sse_stream_body_yields_an_empty_stream_without_error() -> None:
    # Lines that are not SSE fields are skipped, and a stream without [DONE] just ends.
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([Reply(raw_body="not json")])) as server, client_for(server) as client:
            stream = await client.chat.completions.create(model=MODEL, messages=[user("hi")], stream=True)
            assert [chunk async for chunk in stream] == []


async def test_exhausted_script_answers_500_naming_the_script() -> None:
    with anyio.fail_after(WAIT_S):
        async with (
            ScriptedModelServer(Scripted(["only one"], name="reviewer-script")) as server,
            client_for(server) as client,
        ):
            await client.chat.completions.create(model=MODEL, messages=[user("one")])
            with pytest.raises(openai.InternalServerError) as raised:
                await client.chat.completions.create(model=MODEL, messages=[user("two")])
    assert "script 'reviewer-script' is exhausted" in raised.value.message
    assert "'two'" in raised.value.message
    assert raised.value.code == "script_exhausted"


async def test_policy_exception_answers_500_naming_the_policy() -> None:
    def broken(request: ChatRequest) -> str:
        raise KeyError("missing")

    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Respond(broken)) as server, client_for(server) as client:
            with pytest.raises(openai.InternalServerError) as raised:
                await client.chat.completions.create(model=MODEL, messages=[user("hi")])
    assert "broken" in raised.value.message
    assert "KeyError" in raised.value.message


async def test_malformed_json_body_is_answered_400_in_openai_shape() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([])) as server, httpx.AsyncClient(base_url=server.base_url) as http:
            malformed = await http.post(
                "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
            )
            no_messages = await http.post("/chat/completions", json={"model": MODEL})
    assert malformed.status_code == 400
    error = malformed.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "not valid JSON" in error["message"]
    assert no_messages.status_code == 400
    assert no_messages.json()["error"]["message"] == "'messages' must be a list of objects"
    assert [r.body for r in server.requests] == [None, {"model": MODEL}]
    assert server.chat_requests == []


async def test_base_url_without_v1_gets_a_404_that_says_so() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([])) as server:
            base_url = server.base_url.removesuffix("/v1")
            async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                with pytest.raises(openai.NotFoundError) as raised:
                    await client.chat.completions.create(model=MODEL, messages=[user("hi")])
    assert "does the client's base_url end in /v1?" in raised.value.message
    assert server.requests[0].path == "/chat/completions"
