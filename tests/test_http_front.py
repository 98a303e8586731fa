"""The streamable HTTP front: both client eras, the bearer token, DNS-rebinding protection."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts import http as http_front
from mcp_spec_proxy.fronts.http import ResumableEvents, serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.harness import ERAS, recorded, text_of, toy, toy_twins

pytestmark = pytest.mark.anyio

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
RESUMABLE = "2025-11-25"  # the first version whose SSE streams are primed with an event id
INITIALIZE_RESUMABLE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": RESUMABLE, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@asynccontextmanager
async def http_proxy(tmp_path: Path, token: str | None = None, review: str = "allow") -> AsyncIterator[str]:
    raw = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": review}}
    config = ProxyConfig.model_validate(raw)
    twins = toy_twins(raw)  # the HTTP front is under test here, not the backend's process
    with anyio.fail_after(60):
        async with (
            running_proxy(config, StatePaths(tmp_path / "state"), in_process=twins) as proxy,
            anyio.create_task_group() as tg,
        ):
            front = McpFront(proxy)
            port = await tg.start(
                lambda task_status: serve_http(front, "127.0.0.1", 0, token=token, task_status=task_status)
            )
            yield f"http://127.0.0.1:{port}/mcp"
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("mode", ERAS)
async def test_both_eras_list_and_call_over_http(tmp_path: Path, mode: str) -> None:
    async with http_proxy(tmp_path) as url, Client(url, mode=mode) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        echoed = await client.call_tool("toy__echo", {"text": "over http"})
        written = await client.call_tool("toy__record", {"value": "v", "intent": "x"})
    assert "toy__echo" in names and "toy__record" in names
    assert text_of(echoed) == "over http"
    assert not written.is_error
    assert len(recorded(tmp_path / "rec")) == 1


async def test_requests_without_the_token_are_refused(tmp_path: Path) -> None:
    async with http_proxy(tmp_path, token="s3cret") as url:
        async with httpx.AsyncClient() as http:
            bare = await http.post(url, json=INITIALIZE, headers=HEADERS)
            wrong = await http.post(url, json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer nope"})
            right = await http.post(url, json=INITIALIZE, headers={**HEADERS, "Authorization": "Bearer s3cret"})
        assert bare.status_code == 401 and "Bearer" in bare.headers["www-authenticate"]
        assert wrong.status_code == 401
        assert right.status_code == 200
        async with (
            httpx2.AsyncClient(headers={"Authorization": "Bearer s3cret"}) as authed,
            Client(streamable_http_client(url, http_client=authed), mode="legacy") as client,
        ):
            assert text_of(await client.call_tool("toy__echo", {"text": "ok"})) == "ok"


@pytest.mark.parametrize(
    "headers",
    [{"Host": "evil.example.com"}, {"Origin": "http://evil.example.com"}],
    ids=["foreign-host", "foreign-origin"],
)
async def test_foreign_host_or_origin_is_refused(tmp_path: Path, headers: dict[str, str]) -> None:
    async with http_proxy(tmp_path) as url, httpx.AsyncClient() as http:
        refused = await http.post(url, json=INITIALIZE, headers={**HEADERS, **headers})
        accepted = await http.post(url, json=INITIALIZE, headers=HEADERS)
    assert refused.status_code in (403, 421)
    assert accepted.status_code == 200


def test_http_address_defaults_to_loopback() -> None:
    from mcp_spec_proxy.cli import _parse_http

    assert _parse_http(":8765") == ("127.0.0.1", 8765)
    assert _parse_http("0.0.0.0:9000") == ("0.0.0.0", 9000)
    assert _parse_http("[::1]:9000") == ("::1", 9000)


async def test_sse_events_resume_within_their_own_stream_unguessably_and_within_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dropped stream resumes from its client's Last-Event-ID; an id names one stream of one
    session only and cannot be guessed from another's; the store forgets past its bounds."""
    store = ResumableEvents()
    session, other = store.session(), store.session()

    def note(n: int) -> types.JSONRPCMessage:
        return types.JSONRPCNotification(jsonrpc="2.0", method="notifications/message", params={"n": n})

    mine = [await session.store_event("1", None)] + [await session.store_event("1", note(n)) for n in range(3)]
    theirs = await session.store_event("theirs", note(99))
    same_id = await other.store_event("1", note(77))  # another session's stream of the same request id
    replayed: list[Any] = []

    async def send(event: Any) -> None:
        replayed.append((event.event_id, event.message.params["n"]))

    assert await session.replay_events_after(mine[0], send) == "1"
    assert replayed == [(mine[1], 0), (mine[2], 1), (mine[3], 2)]  # the stream's own, in order; never "theirs"
    assert theirs not in mine and len({*mine, theirs}) == 5 and all(len(i) >= 20 for i in mine)
    assert await session.replay_events_after("1", send) is None  # a counter's guess names nothing
    assert await other.replay_events_after(mine[0], send) is None  # another session's id names nothing here
    assert await session.replay_events_after(same_id, send) is None
    assert len(replayed) == 3

    monkeypatch.setattr(http_front, "MAX_EVENTS", 3)
    await session.store_event("1", note(4))
    assert await session.replay_events_after(mine[0], send) is None  # the oldest were forgotten


async def open_session(http: httpx.AsyncClient, url: str) -> dict[str, str]:
    """A new handshake-era session over raw HTTP: the headers its later requests carry."""
    opened = await http.post(url, json=INITIALIZE_RESUMABLE, headers=HEADERS)
    assert opened.status_code == 200, opened.text
    headers = {**HEADERS, "Mcp-Session-Id": opened.headers["mcp-session-id"], "Mcp-Protocol-Version": RESUMABLE}
    ready = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert ready.status_code == 202
    return headers


async def resumed(http: httpx.AsyncClient, url: str, headers: dict[str, str], last: str, secret: str) -> str:
    """What a GET resuming from event `last` reads: up to `secret`, or all of it where the stream ends."""
    read = ""
    resume = {**headers, "Accept": "text/event-stream", "Last-Event-ID": last}
    async with http.stream("GET", url, headers=resume) as response:
        async for line in response.aiter_lines():
            read += line + "\n"
            if secret in line:
                break  # a resumed stream stays open for what comes next: the test has seen enough
    return read


async def test_a_session_cannot_resume_another_sessions_stream_by_its_event_id(tmp_path: Path) -> None:
    """Session A's result goes out on an SSE stream with event ids; B, a session of its own that
    learns A's first event id, resumes from it and reads nothing, while A resumes and reads it."""
    secret = "the result of session A"
    echo = {"name": "toy__echo", "arguments": {"text": secret}}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": echo}
    async with http_proxy(tmp_path) as url, httpx.AsyncClient(timeout=10) as http:
        with anyio.fail_after(30):
            a = await open_session(http, url)
            answered = await http.post(url, json=call, headers=a)
            first = re.findall(r"^id: ?(\S+)", answered.text, re.MULTILINE)[0]  # the priming event's id
            b = await open_session(http, url)
            stolen = await resumed(http, url, b, first, secret)
            own = await resumed(http, url, a, first, secret)
    assert secret in answered.text and b["Mcp-Session-Id"] != a["Mcp-Session-Id"]
    assert secret not in stolen
    assert secret in own
