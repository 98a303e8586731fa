"""Provider profiles: the request bodies each server gets, JSON actions, and hidden states for LEASH."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcp_spec_proxy.engine import Engine
from mcp_spec_proxy.leash.encoders import EncoderError, HiddenStateEncoder, StepView
from mcp_spec_proxy.models import ChatModel, ModelConfig, action_format
from mcp_spec_proxy.testing import (
    ChatRequest,
    Reply,
    Respond,
    Scripted,
    ScriptedModelServer,
    ToolCall,
    embed_text,
)
from mcp_spec_proxy.trajectory import Step
from tests import backends
from tests.harness import proxied, stdio

pytestmark = pytest.mark.anyio

READ_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "fs__read",
        "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
WRITE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "fs__write",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
ASK: list[dict[str, Any]] = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Read a.txt"}]


def model(server: ScriptedModelServer, **config: Any) -> ChatModel:
    return ChatModel("weak", ModelConfig(base_url=server.base_url, model="m", max_retries=0, **config))


def action(tool: str, **arguments: Any) -> Reply:
    return Reply(content=json.dumps({"tool": tool, "arguments": arguments}))


# -- profiles ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("https://api.openai.com/v1", "openai"),
        ("http://localhost:11434/v1", "ollama"),
        ("http://127.0.0.1:30000/v1", "vllm"),  # SGLang's port is not distinctive: never guessed
        ("http://127.0.0.1:8080/v1", "vllm"),  # nor llama.cpp's
        ("https://api.example.com/v1", "vllm"),
    ],
)
def test_auto_provider_is_detected_only_where_the_url_is_certain(base_url: str, expected: str) -> None:
    assert ModelConfig(base_url=base_url, model="m").provider == expected
    # "auto" is accepted as input (servers.yaml's), never kept
    assert ModelConfig.model_validate({"base_url": base_url, "model": "m", "provider": "auto"}).provider == expected


def test_profile_defaults_follow_the_provider_and_explicit_settings_win() -> None:
    openai_ = ModelConfig(base_url="https://api.openai.com/v1", model="gpt")
    assert (openai_.thinking_off, openai_.thinking_on, openai_.actions, openai_.hidden_states) == (
        {},
        {},
        "tools",
        "none",
    )
    llama = ModelConfig(base_url="http://h:8080/v1", model="m", provider="llamacpp")
    assert (llama.actions, llama.hidden_states) == ("json", "none")
    sglang = ModelConfig(base_url="http://h:30000/v1", model="m", provider="sglang")
    assert (sglang.actions, sglang.hidden_states) == ("tools", "native")
    own = ModelConfig(
        base_url="http://h/v1", model="m", provider="ollama", actions="tools", thinking_off={"reasoning_effort": "low"}
    )
    assert (own.actions, own.thinking_off) == ("tools", {"reasoning_effort": "low"})
    with pytest.raises(ValueError, match="provider"):
        ModelConfig.model_validate({"base_url": "http://h/v1", "model": "m", "provider": "tgi"})


THINKING = {
    "openai": ({}, {}),
    "vllm": ({"chat_template_kwargs": {"enable_thinking": False}}, {"chat_template_kwargs": {"enable_thinking": True}}),
    "sglang": (
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": True}},
    ),
    "llamacpp": (
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": True}},
    ),
    "ollama": ({"reasoning_effort": "none"}, {}),
}


@pytest.mark.parametrize("provider", sorted(THINKING))
async def test_each_provider_switches_thinking_with_its_own_request_field(provider: str) -> None:
    async with ScriptedModelServer(Scripted(["a", "b"])) as server:
        chat = model(server, provider=provider)
        await chat.complete(ASK, purpose="verify", thinking=False)
        await chat.complete(ASK, purpose="repair", thinking=True)
        await chat.aclose()
    off, on = (r.raw for r in server.chat_requests)
    known = ("chat_template_kwargs", "reasoning_effort")
    assert {k: off[k] for k in known if k in off} == THINKING[provider][0]
    assert {k: on[k] for k in known if k in on} == THINKING[provider][1]
    assert "return_hidden_states" not in off and "return_hidden_states" not in on


@pytest.mark.parametrize(
    ("provider", "sends"),
    [("openai", "tools"), ("vllm", "tools"), ("sglang", "tools"), ("llamacpp", "json"), ("ollama", "json")],
)
async def test_drafting_sends_native_tools_or_a_json_action_schema_by_provider(provider: str, sends: str) -> None:
    reply = (
        Reply(tool_calls=[ToolCall("fs__read", {"path": "a.txt"})])
        if sends == "tools"
        else action("fs__read", path="a.txt")
    )
    async with ScriptedModelServer(Scripted([reply])) as server:
        chat = model(server, provider=provider)
        completion = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL, WRITE_TOOL])
        await chat.aclose()
    body = server.chat_requests[0].raw
    assert [(c.name, json.loads(c.arguments)) for c in completion.tool_calls] == [("fs__read", {"path": "a.txt"})]
    if sends == "tools":
        assert [t["function"]["name"] for t in body["tools"]] == ["fs__read", "fs__write"]
        assert "response_format" not in body
    else:
        assert "tools" not in body and "tool_choice" not in body
        assert body["response_format"] == action_format([READ_TOOL, WRITE_TOOL])
        system = body["messages"][0]
        assert system["role"] == "system" and system["content"].startswith("You help.")
        assert "fs__read: Read a file." in system["content"] and '"answer"' in system["content"]


# -- JSON actions ------------------------------------------------------------------------------


def test_json_action_schema_is_the_union_of_each_tools_call_and_the_answer() -> None:
    schema = action_format([READ_TOOL, WRITE_TOOL])["json_schema"]["schema"]
    branches = schema["anyOf"]
    assert [b["properties"].get("tool") for b in branches] == [{"const": "fs__read"}, {"const": "fs__write"}, None]
    assert branches[0]["properties"]["arguments"] == READ_TOOL["function"]["parameters"]
    assert branches[0]["required"] == ["tool", "arguments"] and branches[0]["additionalProperties"] is False
    assert branches[2] == {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    # tool_choice "required" (the repair turn): a call, never a bare answer.
    required = action_format([READ_TOOL], answers=False)["json_schema"]["schema"]["anyOf"]
    assert [b["properties"]["tool"]["const"] for b in required] == ["fs__read"]


async def test_a_json_answer_comes_back_as_content_and_required_calls_drop_the_answer_branch() -> None:
    async with ScriptedModelServer(
        Scripted([Reply(content='{"answer": "done"}'), action("fs__read", path="b")])
    ) as server:
        chat = model(server, provider="llamacpp")
        answered = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL])
        repaired = await chat.complete(ASK, purpose="repair", thinking=True, tools=[READ_TOOL], tool_choice="required")
        await chat.aclose()
    assert (answered.content, answered.tool_calls, answered.action_error) == ("done", (), None)
    assert repaired.tool_calls[0].name == "fs__read"
    second = server.chat_requests[1].raw
    assert len(second["response_format"]["json_schema"]["schema"]["anyOf"]) == 1
    assert '"answer"' not in second["messages"][0]["content"]


async def test_json_actions_show_earlier_calls_as_json_and_results_as_user_turns() -> None:
    history: list[dict[str, Any]] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "fs__read", "arguments": '{"path": "a"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "hello"},
    ]
    async with ScriptedModelServer(Scripted([Reply(content='{"answer": "hello"}')])) as server:
        chat = model(server, provider="ollama")
        await chat.complete(history, purpose="draft", thinking=False, tools=[READ_TOOL])
        await chat.aclose()
    sent = server.chat_requests[0].raw["messages"]
    assert sent[2] == {"role": "assistant", "content": '{"tool": "fs__read", "arguments": {"path": "a"}}'}
    assert sent[3] == {"role": "user", "content": "Result of fs__read:\nhello"}
    assert all("tool_calls" not in m and m["role"] != "tool" for m in sent)
    assert ASK[0]["content"] == "You help."  # the caller's messages are not changed


async def test_a_json_action_cut_off_at_the_token_limit_is_a_failed_action_not_a_crash() -> None:
    cut = Reply(content='{"tool": "fs__read", "argum', finish_reason="length")
    async with ScriptedModelServer(Scripted([cut])) as server:
        chat = model(server, provider="llamacpp")
        completion = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL])
        await chat.aclose()
    assert completion.tool_calls == () and completion.action_error is not None
    assert "cut off at the token limit" in completion.action_error and "max_tokens" in completion.action_error


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("I will read the file now.", "not a JSON action"),
        ('{"tool": "fs__read", "arguments": "a.txt"}', "not a JSON object"),
        ('{"path": "a.txt"}', "neither"),
        ("[1, 2]", "neither"),
    ],
)
async def test_an_unparsable_json_action_is_reported_not_raised(content: str, problem: str) -> None:
    async with ScriptedModelServer(Scripted([Reply(content=content)])) as server:
        chat = model(server, provider="llamacpp")
        completion = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL])
        await chat.aclose()
    assert completion.tool_calls == () and completion.content == content
    assert completion.action_error is not None and problem in completion.action_error


# -- hidden states -----------------------------------------------------------------------------


async def test_sglang_drafting_asks_for_hidden_states_and_gives_one_vector_per_call() -> None:
    state = [float(i) for i in range(8)]
    two = Reply(
        tool_calls=[ToolCall("fs__read", {"path": "a"}), ToolCall("fs__read", {"path": "b"})], hidden_states=state
    )
    unscripted = Reply(tool_calls=[ToolCall("fs__read", {"path": "c"})])
    async with ScriptedModelServer(Scripted([two, "plain", unscripted]), hidden_size=8) as server:
        chat = model(server, provider="sglang")
        asked = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL], hidden_states=True)
        unasked = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL])
        derived = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL], hidden_states=True)
        await chat.aclose()
    assert chat.config.hidden_state_source == "m (return_hidden_states)"
    assert np.allclose(derived.hidden_states[0], embed_text('{"tool": "fs__read", "arguments": {"path": "c"}}', 8))
    assert derived.state_kinds == ("call",)
    first, second, _ = (r.raw for r in server.chat_requests)
    assert first["return_hidden_states"] is True and "return_hidden_states" not in second
    # SGLang's chat API: the turn's last token, the last call's own state, standing in for the first.
    assert asked.hidden_states == (state, state) and asked.state_kinds == ("turn", "call")
    assert unasked.hidden_states == ()
    assert server.embedding_requests == []  # no extra pass


async def test_a_server_that_tells_a_turns_calls_apart_gives_each_call_its_own_state() -> None:
    calls = [ToolCall("fs__read", {"path": "a"}), ToolCall("fs__write", {"path": "b", "content": "x"})]
    async with ScriptedModelServer(Scripted([Reply(tool_calls=calls)]), hidden_size=8, per_call_states=True) as server:
        chat = model(server, provider="sglang")
        completion = await chat.complete(
            ASK, purpose="draft", thinking=False, tools=[READ_TOOL, WRITE_TOOL], hidden_states=True
        )
        await chat.aclose()
    first = '{"tool": "fs__read", "arguments": {"path": "a"}}'
    both = first + '\n{"tool": "fs__write", "arguments": {"path": "b", "content": "x"}}'
    assert completion.state_kinds == ("call", "call")
    assert np.allclose(completion.hidden_states[0], embed_text(first, 8))
    assert np.allclose(completion.hidden_states[1], embed_text(both, 8))


async def test_servers_without_hidden_states_make_no_extra_request_for_them() -> None:
    drafted = Reply(
        tool_calls=[ToolCall("fs__read", {"path": "a"}), ToolCall("fs__write", {"path": "b", "content": "x"})]
    )
    for provider in ("vllm", "llamacpp", "ollama"):
        reply = drafted if provider == "vllm" else action("fs__read", path="a")
        async with ScriptedModelServer(Scripted([reply]), embedding_dim=16) as server:
            chat = model(server, provider=provider)
            completion = await chat.complete(
                ASK, purpose="draft", thinking=False, tools=[READ_TOOL, WRITE_TOOL], hidden_states=True
            )
            await chat.aclose()
        assert "return_hidden_states" not in server.chat_requests[0].raw
        # No /v1/embeddings on the weak model's server: it was a second forward pass that, on
        # llama.cpp, evicted the draft's prefix cache. LEASH's fallback encoder stands in instead.
        assert server.embedding_requests == [] and len(server.requests) == 1
        assert completion.hidden_states == () and completion.tool_calls
        assert chat.config.hidden_state_source == "m (none)"


def test_the_removed_embeddings_source_is_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"leash\.embedding"):
        ModelConfig.model_validate(
            {"base_url": "http://h/v1", "model": "m", "provider": "llamacpp", "hidden_states": "embeddings"}
        )


async def test_openai_has_no_hidden_states_and_asks_for_none() -> None:
    async with ScriptedModelServer(Scripted(["ok"]), hidden_size=4) as server:
        chat = ChatModel("weak", ModelConfig(base_url=server.base_url, model="m", provider="openai"))
        completion = await chat.complete(ASK, purpose="draft", thinking=False, tools=[READ_TOOL], hidden_states=True)
        await chat.aclose()
    assert completion.hidden_states == () and server.embedding_requests == []
    assert "return_hidden_states" not in server.chat_requests[0].raw


async def test_the_hidden_encoder_remembers_drafted_states_so_their_steps_can_be_labelled() -> None:
    encoder = HiddenStateEncoder("m", 3)
    drafted = StepView("fs__read", {"path": "a"})
    vector = encoder.from_hidden([3.0, 0.0, 4.0], step=drafted)
    assert np.allclose(vector, [0.6, 0.0, 0.8])
    # Labelled later, with its observation: the same tool and arguments find the drafted state.
    rows = await encoder.encode_steps([StepView("fs__read", {"path": "a"}, observation="hello")])
    assert rows.shape == (1, 3) and np.allclose(rows[0], vector)
    with pytest.raises(EncoderError, match="no drafted state for fs__write"):
        await encoder.encode_steps([drafted, StepView("fs__write", {"path": "a"})])
    small = HiddenStateEncoder("m", 2, memory=1)
    small.from_hidden([1.0, 0.0], step=StepView("a"))
    small.from_hidden([0.0, 1.0], step=StepView("b"))
    assert small.recall(StepView("a")) is None and small.recall(StepView("b")) is not None


# -- the engine --------------------------------------------------------------------------------


@dataclass
class HiddenWatch:
    """A LEASH twin whose encoder reads hidden states; it records what each drafted read carried."""

    wants_hidden: bool = True
    seen: list[tuple[str, Any]] = field(default_factory=list)

    async def route(self, task: str) -> bool:
        return False

    async def drafted(self, step: Step, hidden: Any) -> bool:
        self.seen.append((step.tool, hidden))
        return False

    async def unreviewed(self, step: Step, hidden: Any) -> bool:
        return False

    async def verdict(self, steps: tuple[Step, ...], accepted_steps: int) -> None:
        return None

    async def finished(self, task_id: str, task: str, steps: list[Step]) -> None:
        return None


@dataclass
class World:
    engine: Engine
    server: ScriptedModelServer
    root: Path

    def weak(self) -> list[ChatRequest]:
        return [r for r in self.server.chat_requests if r.model == "weak-model"]


@asynccontextmanager
async def world(
    tmp_path: Path, weak: list[Reply | str], weak_config: dict[str, Any], **server: Any
) -> AsyncIterator[World]:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("buy milk\n")
    drafts = iter(weak)

    def answer(request: ChatRequest) -> Reply | str:
        return next(drafts) if request.model == "weak-model" else "unused"  # no write is drafted here

    async with ScriptedModelServer(Respond(answer), **server) as model_server:
        endpoint = {"base_url": model_server.base_url, "max_retries": 0}
        config = {
            "servers": {"fs": stdio(backends.filesystem(root))},
            "models": {
                "weak": {**endpoint, "model": "weak-model", **weak_config},
                "strong": {**endpoint, "model": "strong-model"},
            },
            "review": {"default": "strong"},
        }
        async with proxied(config, tmp_path / "state") as p:
            assert p.proxy.engine is not None
            yield World(p.proxy.engine, model_server, root)


async def test_a_json_action_run_reads_and_answers_through_the_engine(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [action("fs__read_text_file", path=notes), Reply(content='{"answer": "buy milk"}')]
    async with world(tmp_path, weak, {"provider": "llamacpp"}) as w:
        result = await w.engine.run("What is in my notes?")
        requests = w.weak()
    assert result.status == "answered" and result.answer == "buy milk"
    assert [s.tool for s in result.steps] == ["fs__read_text_file"]
    assert all("tools" not in r.raw and r.json_schema is not None for r in requests)
    assert requests[1].raw["messages"][-1]["content"].startswith("Result of fs__read_text_file:")
    assert "buy milk" in requests[1].raw["messages"][-1]["content"]


async def test_an_unparsable_json_action_is_a_failed_step_the_model_sees(tmp_path: Path) -> None:
    weak: list[Reply | str] = [Reply(content="Let me think about this."), Reply(content='{"answer": "sorry"}')]
    async with world(tmp_path, weak, {"provider": "ollama"}) as w:
        result = await w.engine.run("What is in my notes?")
        requests = w.weak()
    assert result.status == "answered" and result.answer == "sorry"
    [failed] = result.steps
    assert failed.tool == "invalid_action" and failed.is_error
    assert "not a JSON action" in (failed.observation or "")
    assert failed.arguments == {"raw": "Let me think about this."}
    assert "not a JSON action" in requests[1].raw["messages"][-1]["content"]


async def test_spec_leash_gives_each_drafted_read_its_sglang_hidden_state(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    state = [0.5, -0.5, 1.0, 0.0]
    weak: list[Reply | str] = [
        Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": notes})], hidden_states=state),
        "buy milk",
    ]
    async with world(tmp_path, weak, {"provider": "sglang"}, hidden_size=4) as w:
        watch = HiddenWatch()
        w.engine.watch = watch
        result = await w.engine.run("What is in my notes?", mode="spec+leash")
        requests = w.weak()
    assert result.status == "answered"
    assert watch.seen == [("fs__read_text_file", state)]
    assert all(r.raw.get("return_hidden_states") is True for r in requests)


async def test_spec_leash_asks_a_server_without_hidden_states_for_nothing_more(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": notes})]), "buy milk"]
    async with world(tmp_path, weak, {"provider": "vllm"}, embedding_dim=8) as w:
        watch = HiddenWatch()
        w.engine.watch = watch
        result = await w.engine.run("What is in my notes?", mode="spec+leash")
        embedded = list(w.server.embedding_requests)
    assert watch.seen == [("fs__read_text_file", None)]
    assert embedded == [] and [c.purpose for c in result.calls] == ["draft", "draft"]


async def test_a_watch_that_does_not_read_hidden_states_costs_nothing_extra(tmp_path: Path) -> None:
    notes = str(tmp_path / "files" / "notes.txt")
    weak: list[Reply | str] = [Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": notes})]), "buy milk"]
    async with world(tmp_path, weak, {"provider": "sglang"}, hidden_size=4) as w:
        watch = HiddenWatch(wants_hidden=False)
        w.engine.watch = watch
        await w.engine.run("What is in my notes?", mode="spec+leash")
        requests = w.weak()
    assert watch.seen == [("fs__read_text_file", None)]
    assert all("return_hidden_states" not in r.raw for r in requests) and w.server.embedding_requests == []
