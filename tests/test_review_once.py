"""Each executed step is reviewed once, labelled once and committed once, from outside.

Two writes a client sends at once in one session, and a replacement the engine runs after a
verdict that accepted a prefix: the scripted model server records every review prompt (what the
reviewer was shown, read back with `prompts.review_steps`), the toy backend's ledger and the
filesystem are what really ran, and the LEASH bank counts the labels.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.prompts import review_steps
from mcp_spec_proxy.testing import ChatRequest, Respond, ScriptedModelServer
from tests.harness import proxied, recorded, segment_length, text_of, toy, verdict

pytestmark = pytest.mark.anyio


def held_value(request: ChatRequest) -> str:
    """The `value` of the held `toy__record` call a verifier prompt ends with."""
    _, numbered = review_steps(request.messages)
    return str(numbered[-1].arguments["value"])


def reads_shown(request: ChatRequest, text: str) -> int:
    """How many times a prompt shows the read `toy__echo {text}`, committed or numbered."""
    committed, numbered = review_steps(request.messages)
    return sum(1 for s in [*committed, *numbered] if s.tool == "toy__echo" and s.arguments == {"text": text})


async def test_two_writes_sent_at_once_after_a_read_show_and_commit_the_read_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    prompts: list[ChatRequest] = []
    second_arrived = anyio.Event()

    async def answer(request: ChatRequest) -> str:
        prompts.append(request)
        if len(prompts) == 1:
            # The first verdict waits until the second write is at the proxy and it has gone as far as
            # it can: held beside the first (the hole), or waiting for the first's verdict.
            await second_arrived.wait()
            await anyio.wait_all_tasks_blocked()
        if held_value(request) == "v2":
            return verdict(segment_length(request) - 1, "v2 is not what the user asked for")
        return verdict(segment_length(request))

    async with ScriptedModelServer(Respond(answer)) as server:
        config = {
            "servers": {"toy": toy(ledger)},
            "models": {"strong": {"base_url": server.base_url, "model": "strong-model", "max_retries": 0}},
            "review": {"default": "strong"},
        }
        async with proxied(config, tmp_path / "state", twins=True) as p:
            barrier = p.proxy.barrier
            enter = barrier.call

            async def counted(session: Any, name: str, arguments: dict[str, Any], *rest: Any) -> types.CallToolResult:
                if arguments.get("value") == "v2":
                    second_arrived.set()
                return await enter(session, name, arguments, *rest)

            barrier.call = counted  # type: ignore[method-assign]  # the front's one door into the barrier
            results: dict[str, types.CallToolResult] = {}

            async def write(value: str) -> None:
                results[value] = await p.client.call_tool("toy__record", {"value": value, "intent": "as asked"})

            with anyio.fail_after(30):
                await p.client.call_tool("toy__echo", {"text": "the read"})
                async with anyio.create_task_group() as tg:
                    tg.start_soon(write, "v1")
                    await anyio.wait_all_tasks_blocked()  # v1 is held before v2 is sent
                    tg.start_soon(write, "v2")
                await write("v3")  # its prompt shows the committed history both verdicts left

    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["v1", "v3"]  # each per its verdict, once
    assert not results["v1"].is_error and not results["v3"].is_error
    assert results["v2"].is_error and "v2 is not what the user asked for" in text_of(results["v2"])
    by_value = {held_value(r): r for r in prompts}
    assert sorted(by_value) == ["v1", "v2", "v3"] and len(prompts) == 3  # one review each
    for value in ("v1", "v2", "v3"):
        assert reads_shown(by_value[value], "the read") == 1, f"the {value} review shows the read once"
    # The second write's reviewer knew the first had run: it is committed history there, not a sibling.
    committed_v2, numbered_v2 = review_steps(by_value["v2"].messages)
    assert [s.arguments.get("value") for s in committed_v2 if s.tool == "toy__record"] == ["v1"]
    assert [s.tool for s in numbered_v2] == ["toy__record"]
    committed_v3, _ = review_steps(by_value["v3"].messages)
    assert [(s.tool, s.arguments.get("value", s.arguments.get("text"))) for s in committed_v3] == [
        ("toy__echo", "the read"),
        ("toy__record", "v1"),
    ]
