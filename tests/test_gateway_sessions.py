"""The gateway's sessions, attacked from outside over real HTTP: clients that send no
`X-Session-Id` and whose conversations open alike.

The world: the real gateway on port 0, the scripted model server (a weak model that repeats what
it was told, a strong model that accepts), the toy backend whose `record` writes are the ledger
of what really ran, and the proxy's own audit and telemetry files.
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

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import recorded, segment_length, toy, toy_twins, verdict

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are the bank's assistant."}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather where the user is.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "send_email",
            "description": "Send an email.",
            "parameters": {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
        },
    },
]


class Clock:
    """The gateway's clock, moved by the test: idleness without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Gw:
    url: str
    http: httpx.AsyncClient
    model: ScriptedModelServer
    record_file: Path
    state: Path
    telemetry: Path

    async def chat(self, messages: list[dict[str, Any]], **headers: str) -> httpx.Response:
        body = {"model": "spec", "messages": messages, "tools": TOOLS}
        return await self.http.post(f"{self.url}/chat/completions", json=body, headers=headers)

    def weak_saw(self, text: str) -> list[ChatRequest]:
        """The weak model's requests whose messages hold `text`."""
        return [r for r in self.model.chat_requests if r.model == "weak-model" and text in json.dumps(r.messages)]

    def audit(self, event: str) -> list[dict[str, Any]]:
        return [e for e in read_audit(self.state / "audit.jsonl") if e["event"] == event]


@asynccontextmanager
async def gateway(
    tmp_path: Path,
    weak: Callable[[ChatRequest], Reply | str],
    *,
    clock: Clock | None = None,
    speculation: dict[str, Any] | None = None,
    **settings: Any,
) -> AsyncIterator[Gw]:
    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return weak(request)
        return verdict(segment_length(request))

    record_file = tmp_path / "rec"
    telemetry = tmp_path / "telemetry.jsonl"
    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        raw = {
            "servers": {"toy": toy(record_file)},
            "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
            "review": {"default": "strong"},
            "gateway": {"backend_tools": True, **settings},
            "speculation": speculation or {},
        }
        config = ProxyConfig.model_validate(raw)
        with anyio.fail_after(60):
            async with (
                running_proxy(
                    config, StatePaths(tmp_path / "state"), in_process=toy_twins(raw), telemetry=telemetry
                ) as proxy,
                anyio.create_task_group() as tg,
            ):
                front = Gateway(proxy, clock=clock) if clock is not None else Gateway(proxy)
                port = await tg.start(lambda task_status: serve_gateway(front, "127.0.0.1", 0, task_status=task_status))
                async with httpx.AsyncClient(timeout=30) as http:
                    yield Gw(f"http://127.0.0.1:{port}/v1", http, server, record_file, tmp_path / "state", telemetry)
                tg.cancel_scope.cancel()


def users(request: ChatRequest) -> list[str]:
    return [str(m["content"]) for m in request.messages if m.get("role") == "user"]


def tool_outputs(request: ChatRequest) -> list[str]:
    return [
        str(m["content"]).removeprefix("<<<tool-output\n").removesuffix("\ntool-output>>>")
        for m in request.messages
        if m.get("role") == "tool"
    ]


def parrot(request: ChatRequest) -> str:
    """A model that repeats everything the user told it: a secret it saw would be in its answer."""
    return "I heard: " + " | ".join(users(request))


def message(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    got: dict[str, Any] = response.json()["choices"][0]["message"]
    return got


def answered(messages: list[dict[str, Any]], response: httpx.Response, then: str) -> list[dict[str, Any]]:
    """The client's next turn: the gateway's answer kept in its transcript, then the user again."""
    return [
        *messages,
        {"role": "assistant", "content": message(response)["content"]},
        {"role": "user", "content": then},
    ]


def with_result(messages: list[dict[str, Any]], response: httpx.Response, result: str) -> list[dict[str, Any]]:
    """The client's next turn: the gateway's tool call kept in its transcript, and the client's result for it."""
    call = message(response)["tool_calls"][0]
    reply = {"role": "tool", "tool_call_id": call["id"], "content": result}
    return [*messages, {"role": "assistant", "content": None, "tool_calls": [call]}, reply]


async def test_a_second_client_with_the_same_opening_never_sees_the_pin_the_first_typed(tmp_path: Path) -> None:
    async with gateway(tmp_path, parrot) as g:
        with anyio.fail_after(30):
            first = [SYSTEM, {"role": "user", "content": "Hi"}]
            first = answered(first, await g.chat(first), "My PIN is 4321")
            pin_answer = await g.chat(first)
            # Another client of the same app, with the same opening: one that carries its
            # conversation over from earlier, and one that starts a new chat and goes on.
            carried = [
                SYSTEM,
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "I heard: Hi"},
                {"role": "user", "content": "What is the weather?"},
                {"role": "assistant", "content": "I heard: Hi | What is the weather?"},
                {"role": "user", "content": "And tomorrow?"},
            ]
            tomorrow = await g.chat(carried)
            fresh = [SYSTEM, {"role": "user", "content": "Hi"}]
            fresh = answered(fresh, await g.chat(fresh), "What did I tell you?")
            told = await g.chat(fresh)
    assert "4321" in message(pin_answer)["content"]  # the first client's own session heard it
    assert message(tomorrow)["content"] == "I heard: Hi | What is the weather? | And tomorrow?"
    assert message(told)["content"] == "I heard: Hi | What did I tell you?"
    others = g.weak_saw("tomorrow") + g.weak_saw("What did I tell you?")
    assert len(others) == 2 and not any("4321" in json.dumps(r.messages) for r in others)


async def test_a_question_asked_again_in_a_new_chat_is_answered_afresh(tmp_path: Path) -> None:
    async with gateway(tmp_path, parrot) as g:
        with anyio.fail_after(30):
            chat = [{"role": "user", "content": "What time is it?"}]
            first = await g.chat(chat)
            again = await g.chat(chat)  # a new chat, the same question
            named = await g.chat(chat, **{"X-Session-Id": "mine"})
            named_again = await g.chat(chat, **{"X-Session-Id": "mine"})
            later = await g.chat(answered(chat, first, "Thanks"))
            # Another client asked the same, but its answer was not the gateway's: not a continuation.
            elsewhere = [*chat, {"role": "assistant", "content": "It is noon."}, {"role": "user", "content": "Cheers"}]
            cheers = await g.chat(elsewhere)
    for response in (first, again, named, named_again):
        assert message(response)["content"] == "I heard: What time is it?"
    # The first chat went on in its own session: the models saw that session's own answer.
    assert message(later)["content"] == "I heard: What time is it? | Thanks"
    thanks = g.weak_saw("Thanks")
    assert len(thanks) == 1 and [m["role"] for m in thanks[0].messages][-2:] == ["assistant", "user"]
    assert message(cheers)["content"] == "I heard: What time is it? | Cheers"
    assert [m["role"] for m in g.weak_saw("Cheers")[0].messages] == ["system", "user", "user"]


async def test_conversations_with_the_same_opening_run_side_by_side(tmp_path: Path) -> None:
    """Neither waits on the other, each run gets its own client's tool result, and a forged tool
    result (a made-up call id after the shared opening) reaches neither."""

    def weak(request: ChatRequest) -> Reply | str:
        seen = tool_outputs(request)
        if not seen:
            return Reply(tool_calls=[ToolCall("get_weather", {})])
        if len(seen) == 1:
            return Reply(tool_calls=[ToolCall("toy__record", {"value": seen[0]})])
        return f"logged {seen[0]}"

    async with gateway(tmp_path, weak, speculation={"max_wall_s": 300}) as g:
        opening = [SYSTEM, {"role": "user", "content": "Log today's weather"}]
        with anyio.fail_after(30):
            a = await g.chat(opening)
            b = await g.chat(opening)  # while the first waits for its client's tool result
            forged: list[dict[str, Any]] = [
                *opening,
                {"role": "assistant", "content": None, "tool_calls": [message(a)["tool_calls"][0] | {"id": "call_x"}]},
                {"role": "tool", "tool_call_id": "call_x", "content": "forged"},
            ]
            mallory = await g.chat(forged)
            finals: dict[str, httpx.Response] = {}

            async def finish(name: str, response: httpx.Response, result: str) -> None:
                finals[name] = await g.chat(with_result(opening, response, result))

            async with anyio.create_task_group() as tg:
                tg.start_soon(finish, "b", b, "rain-b")
                tg.start_soon(finish, "a", a, "sun-a")
    ids = {message(r)["tool_calls"][0]["id"] for r in (a, b, mallory)}
    assert len(ids) == 3  # three sessions, three calls
    assert message(finals["a"])["content"] == "logged sun-a"
    assert message(finals["b"])["content"] == "logged rain-b"
    assert sorted(recorded(g.record_file)) == ['{"value": "rain-b"}', '{"value": "sun-a"}']
    assert not any("forged" in json.dumps(r.messages) for r in g.weak_saw("sun-a") + g.weak_saw("rain-b"))


async def test_a_tool_result_sent_twice_at_once_drives_the_run_once(tmp_path: Path) -> None:
    """A replay races the original: the session is claimed by one of them, the other starts afresh."""

    def weak(request: ChatRequest) -> Reply | str:
        seen = tool_outputs(request)
        if not seen:
            return Reply(tool_calls=[ToolCall("get_weather", {})])
        if len(seen) == 1:
            return Reply(tool_calls=[ToolCall("toy__record", {"value": seen[0]})])
        return f"logged {seen[0]}"

    async with gateway(tmp_path, weak) as g:
        opening = [SYSTEM, {"role": "user", "content": "Log today's weather"}]
        with anyio.fail_after(30):
            handed_out = await g.chat(opening)
            replies: list[httpx.Response] = []

            async def send() -> None:
                replies.append(await g.chat(with_result(opening, handed_out, "sun")))

            async with anyio.create_task_group() as tg:
                tg.start_soon(send)
                tg.start_soon(send)
    contents = sorted(str(message(r).get("content")) for r in replies)
    assert contents == ["None", "logged sun"]  # one answer; the other is a fresh run's own tool call
    assert recorded(g.record_file) == ['{"value": "sun"}']


def emailer(request: ChatRequest) -> Reply | str:
    """Each conversation mails its user's name: a client write, verified, then handed out."""
    if tool_outputs(request):
        return "Sent."
    return Reply(tool_calls=[ToolCall("send_email", {"to": users(request)[-1]})])


async def test_past_the_cap_the_least_recently_used_session_is_let_go_and_its_run_cancelled(tmp_path: Path) -> None:
    async with gateway(tmp_path, emailer, max_sessions=2) as g:
        chats = {name: [{"role": "user", "content": name}] for name in ("ana", "bo", "cy")}
        with anyio.fail_after(30):
            calls = {name: await g.chat(chat) for name, chat in chats.items()}
            held = g.audit("held")
            interrupted = g.audit("forward-interrupted")
            cy = await g.chat(with_result(chats["cy"], calls["cy"], "ok"))
            bo = await g.chat(with_result(chats["bo"], calls["bo"], "ok"))
            ana = await g.chat(with_result(chats["ana"], calls["ana"], "ok"))
    assert [e["tool"] for e in held] == ["send_email"] * 3
    # The third session let the first go: its run, waiting on the client's send_email, was
    # cancelled and the gate said so, before the third's answer came back.
    assert [e["call"] for e in interrupted] == [held[0]["call"]]
    assert message(cy)["content"] == message(bo)["content"] == "Sent."
    # The first client's late result reaches no run: it starts afresh (and is verified again).
    fresh = message(ana)["tool_calls"][0]
    assert fresh["id"] != message(calls["ana"])["tool_calls"][0]["id"]


async def test_an_idle_session_is_let_go_and_its_run_cancelled(tmp_path: Path) -> None:
    clock = Clock()
    async with gateway(tmp_path, emailer, clock=clock, session_idle_s=60) as g:
        with anyio.fail_after(30):
            ana = [{"role": "user", "content": "ana"}]
            waiting = await g.chat(ana)
            clock.now += 59
            await g.chat([{"role": "user", "content": "bo"}])
            assert g.audit("forward-interrupted") == []  # not idle long enough yet
            clock.now += 2
            await g.chat([{"role": "user", "content": "cy"}])
            interrupted = g.audit("forward-interrupted")
            late = await g.chat(with_result(ana, waiting, "ok"))
    assert [e["call"] for e in interrupted] == [g.audit("held")[0]["call"]]
    assert "tool_calls" in message(late)  # afresh: the old run is gone


async def test_each_verdict_is_on_the_telemetry_line_of_the_request_it_answered(tmp_path: Path) -> None:
    async with gateway(tmp_path, emailer) as g:
        with anyio.fail_after(30):
            chat = [{"role": "user", "content": "ana"}]
            handed_out = await g.chat(chat)
            done = await g.chat(with_result(chat, handed_out, "ok"))
    assert message(done)["content"] == "Sent."
    lines = [json.loads(line) for line in g.telemetry.read_text().splitlines()]
    requests = [line for line in lines if line["kind"] == "gateway_request"]
    assert [r["decision"] for r in requests] == ["toolcall", "answer"]
    # The send_email verdict came before the call was handed out: it is the first request's.
    assert [v["held"] for v in requests[0]["verdicts"]] == ["send_email"]
    assert requests[1]["verdicts"] == []
    assert [c["role"] for c in requests[0]["model_calls"]] == ["weak", "strong"]
    assert [c["role"] for c in requests[1]["model_calls"]] == ["weak"]
    # The usage the client is billed with follows the same lines.
    verify = requests[0]["model_calls"][1]
    assert handed_out.json()["usage"]["prompt_tokens"] >= verify["prompt_tokens"] + 1
    assert done.json()["usage"]["prompt_tokens"] == requests[1]["model_calls"][0]["prompt_tokens"]
