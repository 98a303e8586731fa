"""Dropped backend connections: an HTTP backend that loses one connection under load, a stdio
backend that dies; the toy's ledger is the ground truth of what really ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError

from mcp_spec_proxy.backends.http import LOST_KEY, GuardedClient
from mcp_spec_proxy.errors import BACKEND_CLOSED, BACKEND_UNAVAILABLE
from tests.dropping import Cut, Cutter, toy_over_http
from tests.harness import call_error, proxied, recorded, text_of, toy
from tests.test_resilience import ToolChanges, wait_for_tool

pytestmark = pytest.mark.anyio


class Heard:
    """The list changes the client heard."""

    def __init__(self) -> None:
        self.tools = 0

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.tools += 1


@pytest.mark.parametrize("json_response", [True, False], ids=["json", "sse"])
@pytest.mark.parametrize("cut", ["before", "after-headers", "mid-answer"])
async def test_one_dropped_http_connection_fails_only_its_call_and_says_it_may_have_run(
    tmp_path: Path, json_response: bool, cut: Cut
) -> None:
    record = tmp_path / "rec"
    heard = Heard()
    async with toy_over_http(record, json_response=json_response) as port, anyio.create_task_group() as tg:
        cutter = Cutter(port, b"drop-me", cut=cut)
        relay = await tg.start(cutter.serve)
        cfg = {"servers": {"toy": {"url": f"http://127.0.0.1:{relay}/mcp"}}, "review": {"default": "allow"}}
        async with proxied(cfg, tmp_path / "state", messages=heard) as p:
            answers: dict[str, str | types.ErrorData] = {}

            async def write(value: str) -> None:
                try:
                    answers[value] = text_of(await p.client.call_tool("toy__record", {"value": value, "intent": "x"}))
                except MCPError as exc:
                    answers[value] = exc.error

            values = [f"v{i}" for i in range(19)] + ["drop-me"]
            with anyio.fail_after(30):
                async with anyio.create_task_group() as calls:
                    for value in values:
                        calls.start_soon(write, value)
                # Right after the drop: the tools are still there and a call goes through.
                names = [tool.name for tool in (await p.client.list_tools()).tools]
                after = text_of(await p.client.call_tool("toy__echo", {"text": "still here"}))
            restarts = p.proxy.backends.get("toy").restarts
        tg.cancel_scope.cancel()
    assert cutter.cuts == 1
    dropped = answers.pop("drop-me")
    assert isinstance(dropped, types.ErrorData), dropped
    assert dropped.code == BACKEND_CLOSED
    assert "may have run" in dropped.message and "did not send it again" in dropped.message
    assert "restart" not in dropped.message
    assert answers == {f"v{i}": f"recorded v{i}" for i in range(19)}  # the other 19 answered, as they ran
    ledger = sorted(recorded(record))
    assert ledger == sorted(f'{{"value": "{value}"}}' for value in values)  # each ran once, none again
    assert "toy__record" in names and after == "still here"
    assert heard.tools == 0 and restarts == 0  # the session held: no reconnect, no list change


async def test_a_call_to_an_http_backend_that_cannot_be_reached_is_not_sent_and_it_comes_back(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    changes = ToolChanges()
    async with toy_over_http(record, json_response=True) as port, anyio.create_task_group() as tg:
        up = anyio.CancelScope()

        async def first_relay(task_status: anyio.abc.TaskStatus[int]) -> None:
            with up:
                await Cutter(port).serve(task_status=task_status)

        address = await tg.start(first_relay)
        cfg = {"servers": {"toy": {"url": f"http://127.0.0.1:{address}/mcp"}}, "review": {"default": "allow"}}
        async with proxied(cfg, tmp_path / "state", messages=changes) as p:
            with anyio.fail_after(30):
                up.cancel()  # the relay stops listening: connections are refused
                unsent = await call_error(p.client, "toy__record", {"value": "never", "intent": "x"})
                await tg.start(Cutter(port, port=address).serve)  # back on the same port
                await wait_for_tool(p.client, changes, "toy__record")
                written = text_of(await p.client.call_tool("toy__record", {"value": "later", "intent": "x"}))
        tg.cancel_scope.cancel()
    assert unsent.code == BACKEND_UNAVAILABLE
    assert "could not be reached" in unsent.message and "tools/call record was not sent" in unsent.message
    assert written == "recorded later"
    assert recorded(record) == ['{"value": "later"}']  # the refused write never reached it


async def test_a_call_arriving_while_a_dead_stdio_backend_restarts_waits_for_it(tmp_path: Path) -> None:
    heard = Heard()
    cfg = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "allow"}}
    async with proxied(cfg, tmp_path / "state", messages=heard) as p:
        with anyio.fail_after(30):
            try:
                await p.client.call_tool("toy__crash", {})
            except MCPError as exc:
                crashed = exc.error
            # The process is gone and not yet back: the tool is still listed, and the call waits.
            names = [tool.name for tool in (await p.client.list_tools()).tools]
            echoed = text_of(await p.client.call_tool("toy__echo", {"text": "back"}))
        restarts = p.proxy.backends.get("toy").restarts
    assert crashed.code == BACKEND_CLOSED
    assert crashed.message == (
        "backend 'toy' closed its connection during tools/call crash, before answering,"
        " so it may have run; the proxy restarts it"
    )
    assert "toy__echo" in names and echoed == "back"
    assert restarts == 1 and heard.tools == 0


async def test_a_backend_cannot_forge_the_mark_of_a_lost_connection() -> None:
    # A backend's error that carries the mark's key with a value of its own stays the backend's.
    async with GuardedClient(limit=1024) as http:
        assert http.claim({LOST_KEY: "0" * 32}) is None
        assert http.claim({LOST_KEY: {"kind": "dropped"}}) is None
