"""The stream a lean handshake-era read opens for its backend's question, at its edges.

A real asking server (tests/fixtures/asking_server.py) runs as a stdio process per client session
behind a real HTTP front with the lean lane; a raw client reads the read's SSE stream as sent. The
server notes each cancel it is told of in a file of its own, so the tests learn from the backend
itself that the cancel reached it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sse_starlette import EventSourceResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.fronts import lean_asks
from tests.test_lean_http_asks import BOTH, CAPABILITIES, HANDSHAKE, _answer, _normal, front

pytestmark = pytest.mark.anyio


class HeldStream:
    """An ASGI server whose `send` waits, as uvicorn's does while the client's socket is full: once
    armed, the next SSE response's head goes out, and that `send` returns only at `release`."""

    def __init__(self) -> None:
        self.armed = False
        self.held = anyio.Event()
        self.release = anyio.Event()

    def wrap(self, app: ASGIApp) -> ASGIApp:
        async def held(scope: Scope, receive: Receive, send: Send) -> None:
            async def sending(message: Message) -> None:
                await send(message)
                if self.armed and message["type"] == "http.response.start" and _is_sse(message):
                    self.armed = False
                    self.held.set()
                    await self.release.wait()

            await app(scope, receive, sending)

        return held


def _is_sse(message: Message) -> bool:
    return any(name == b"content-type" and value.startswith(b"text/event-stream") for name, value in message["headers"])


@asynccontextmanager
async def session(url: str) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, str]]]:
    """A raw handshake-era client that declared roots, sampling and elicitation, its session's first
    call made (which takes the SDK's path): its headers for the next requests."""
    async with httpx.AsyncClient(timeout=30) as http:
        base = {"accept": BOTH, "content-type": "application/json"}
        init = {
            "protocolVersion": HANDSHAKE,
            "capabilities": CAPABILITIES,
            "clientInfo": {"name": "raw", "version": "1"},
        }
        opened = await http.post(
            url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}, headers=base
        )
        ours = {**base, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": HANDSHAKE}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=ours)
        await answered(http, url, ours, _call(1, "ask__ask_roots"))
        yield http, ours


async def answered(http: httpx.AsyncClient, url: str, headers: dict[str, str], call: dict[str, Any]) -> str:
    """A read's SSE answer, each question on it answered as it comes."""
    text, asked = "", set()
    async with http.stream("POST", url, json=call, headers=headers) as response:
        async for chunk in response.aiter_text():
            text += chunk
            for question in _events(text[: text.rfind("\n") + 1]):
                if "method" in question and question["id"] not in asked:
                    asked.add(question["id"])
                    await http.post(url, json=_answer(call["id"], question), headers=headers)
    return text


def _call(request_id: int, tool: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def _noted(path: Path, line: str) -> None:
    """Until the backend has written `line` to its note file."""
    while not path.exists() or line not in path.read_text().splitlines():  # noqa: ASYNC110 (another process's file)
        await anyio.sleep(0.05)


async def test_a_read_cancelled_while_its_stream_opens_ends_with_32800_and_its_backend_is_told(
    tmp_path: Path,
) -> None:
    cancels = tmp_path / "cancels"
    hold = HeldStream()
    env = {"ASKING_CANCELS": str(cancels)}
    async with front(tmp_path, lean=True, env=env, wrap=hold.wrap) as (url, lane), session(url) as (http, ours):
        hold.armed = True
        async with http.stream("POST", url, json=_call(2, "ask__ask_user"), headers=ours) as response:
            # The backend asked; the lane is opening the read's stream (its head is out, the rest waits).
            with anyio.fail_after(20):
                await hold.held.wait()
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}}
            assert (await http.post(url, json=cancel, headers=ours)).status_code == 202
            with anyio.fail_after(20):
                await _noted(cancels, "ask_user")  # the backend was told, and the read has ended
            hold.release.set()
            body = (await response.aread()).decode()
        after = await answered(http, url, ours, _call(3, "ask__ask_roots"))
    assert lane.took.count(True) == 2, lane.took  # both reads after the first went the lean way
    events = _events(body)
    assert events[-1] == {"jsonrpc": "2.0", "id": 2, "error": {"code": -32800, "message": "Request cancelled"}}
    assert all(event.get("id") != 2 or "error" in event for event in events)  # no result for the cancelled read
    assert "roots: file:///raw" in after  # the session goes on


PING = re.compile(r": ping - \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\+00:00\r\n\r\n")


async def _answered_after_a_ping(url: str) -> str:
    """A read's stream as sent, whose question the client answers only once a keep-alive comment came after it."""
    call = _call(2, "ask__ask_user")
    async with session(url) as (http, ours), http.stream("POST", url, json=call, headers=ours) as response:
        raw, question, since = "", None, 0  # `since`: where the stream stood when the question came
        async for chunk in response.aiter_raw():
            raw += chunk.decode()
            if question is None:
                asked = [event for event in _events(raw[: raw.rfind("\n") + 1]) if "method" in event]
                question, since = (asked[0], len(raw)) if asked else (None, 0)
            elif since >= 0 and PING.search(raw, since):
                await http.post(url, json=_answer(2, question), headers=ours)
                since = -1  # answered
        return raw


async def test_a_lean_stream_sends_the_sdk_s_keep_alive_comment_while_its_question_waits(tmp_path: Path) -> None:
    """The interval shortened for the lane and for the SDK's own streams alike: the same comment on both."""
    assert lean_asks.PING_S == EventSourceResponse.DEFAULT_PING_INTERVAL  # the lane's is the SDK's
    bodies: dict[bool, str] = {}
    for lean in (False, True):
        with pytest.MonkeyPatch.context() as patch, anyio.fail_after(60):
            patch.setattr(lean_asks, "PING_S", 0.2)
            patch.setattr(EventSourceResponse, "DEFAULT_PING_INTERVAL", 0.2)
            async with front(tmp_path / str(lean), lean=lean) as (url, lane):
                bodies[lean] = await _answered_after_a_ping(url)
            assert lane.took.count(True) == (1 if lean else 0), lane.took
    for body in bodies.values():
        question = body.index('"method":"elicitation/create"')
        assert PING.search(body, question), body  # a keep-alive comment while the question waited
        assert 'content={\\"username\\": \\"raw\\"}' in body  # then the read's answer
    assert [_normal(PING.sub("", body)) for body in bodies.values()] == [_normal(PING.sub("", bodies[True]))] * 2
