"""The lean HTTP lane serves clients that can be asked, and a backend's question mid-read reaches them.

A real asking server (tests/fixtures/asking_server.py) runs as a stdio process, one per client
session, behind a real HTTP front, once with the lean lane and once with every request on the SDK's
path. Clients declare roots (as most IDE clients do), sampling and elicitation; a spy on the lane
says which requests it answered itself. The questions must reach the client whose read asked and
no other, the reads complete with the client's answers, and a raw client's bytes are the SDK's.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from pydantic import FileUrl
from starlette.types import ASGIApp

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts import lean_http
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.harness import text_of
from tests.lean_spy import spied_install

pytestmark = pytest.mark.anyio

ASKING = Path(__file__).parent / "fixtures" / "asking_server.py"
HANDSHAKE = "2025-11-25"
BOTH = "application/json, text/event-stream"
CAPABILITIES = {"roots": {"listChanged": True}, "sampling": {}, "elicitation": {"form": {}}}


@dataclass
class Lane:
    took: list[bool] = field(default_factory=list)


@asynccontextmanager
async def front(
    tmp_path: Path, lean: bool, env: dict[str, str] | None = None, wrap: Callable[[ASGIApp], ASGIApp] | None = None
) -> AsyncIterator[tuple[str, Lane]]:
    """A real HTTP front before the asking server (`env`: its environment); `wrap`: around the session
    manager's request handling, the lane inside it."""
    backend = {"command": sys.executable, "args": [str(ASKING)], "isolation": "per_session", "env": env or {}}
    raw: dict[str, Any] = {"servers": {"ask": backend}, "review": {"default": "deny"}}
    lane = Lane()
    with anyio.fail_after(90), pytest.MonkeyPatch.context() as patch:
        patch.setattr(lean_http, "install", spied_install(lean, lane.took, wrap=wrap))
        async with (
            running_proxy(ProxyConfig.model_validate(raw), StatePaths(tmp_path / "state")) as proxy,
            anyio.create_task_group() as tg,
        ):
            mcp = McpFront(proxy)
            port = await tg.start(lambda task_status: serve_http(mcp, "127.0.0.1", 0, task_status=task_status))
            yield f"http://127.0.0.1:{port}/mcp", lane
            tg.cancel_scope.cancel()


class Person:
    """A client's side: what it was asked, and its own answers (its name is in each)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.asked: list[str] = []

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(f"file:///home/{self.name}"), name="home")])

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(f"elicitation: {params.message}")
        return types.ElicitResult(action="accept", content={"username": self.name})

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.asked.append("sampling")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"{self.name} says hi"), model="m"
        )

    def client(self, url: str, mode: str = "legacy") -> Client:
        return Client(
            url,
            mode=mode,
            list_roots_callback=self.roots,
            elicitation_callback=self.elicitation,
            sampling_callback=self.sampling,
        )


async def test_a_client_that_declares_roots_gets_the_lane_and_its_backend_s_questions(tmp_path: Path) -> None:
    results: dict[bool, tuple[list[str], list[str], list[str]]] = {}
    for lean in (False, True):
        person = Person("ada")
        async with front(tmp_path / str(lean), lean) as (url, lane), person.client(url) as client:
            got = [
                text_of(await client.call_tool("ask__ask_roots", {})),  # the session's first call: the SDK's path
                text_of(await client.call_tool("ask__ask_roots", {})),
                text_of(await client.call_tool("ask__ask_user", {})),
                text_of(await client.call_tool("ask__ask_model", {"prompt": "hello"})),
            ]
        relayed = [
            row["method"]
            for row in read_audit(tmp_path / str(lean) / "state" / "audit.jsonl")
            if row["event"] == "relayed"
        ]
        results[lean] = (got, person.asked, relayed)
        if lean:
            assert lane.took.count(True) == 3, lane.took  # every read after the first went the lean way
    assert results[True] == results[False]
    got, asked, relayed = results[True]
    assert got[1] == "roots: file:///home/ada"
    assert got[2] == 'user: action=accept content={"username": "ada"}'
    assert got[3] == "model m said: ada says hi"
    assert asked == ["roots", "roots", "elicitation: ask_user: who are you?", "sampling"]
    assert relayed == ["roots/list", "roots/list", "elicitation/create", "sampling/createMessage"]  # each audited


async def test_a_backend_s_question_reaches_only_the_client_whose_read_asked(tmp_path: Path) -> None:
    ada, bob = Person("ada"), Person("bob")
    got: dict[str, list[str]] = {"ada": [], "bob": []}
    async with front(tmp_path, lean=True) as (url, lane), ada.client(url) as a, bob.client(url) as b:
        await a.call_tool("ask__ask_roots", {})  # each session's first call makes its state
        await b.call_tool("ask__ask_roots", {})
        ada.asked.clear()
        bob.asked.clear()

        async def reads(name: str, client: Client) -> None:
            for tool in ("ask__ask_roots", "ask__ask_user", "ask__ask_roots"):
                got[name].append(text_of(await client.call_tool(tool, {})))

        async with anyio.create_task_group() as tg:  # both clients' reads in flight together
            tg.start_soon(reads, "ada", a)
            tg.start_soon(reads, "bob", b)
    assert lane.took.count(True) == 6, lane.took
    for person in (ada, bob):
        user = f'user: action=accept content={{"username": "{person.name}"}}'
        assert got[person.name] == [f"roots: file:///home/{person.name}", user, f"roots: file:///home/{person.name}"]
        assert person.asked == ["roots", "elicitation: ask_user: who are you?", "roots"]


def _normal(text: str) -> str:
    text = re.sub(r"(?m)^id: [^\r\n]*", "id: EVENT", text)
    return re.sub(rf'"{re.escape(CALL_META)}":"[0-9a-f]+"', f'"{CALL_META}":"CALL"', text)


Respond = Callable[[int, dict[str, Any]], dict[str, Any]]


async def _raw_reads(
    url: str,
    tools: tuple[str, ...] = ("ask__ask_roots", "ask__ask_roots", "ask__ask_user"),
    respond: Respond | None = None,
) -> tuple[list[str], list[dict[str, str]]]:
    """A raw client that declares roots: each read's SSE answer as sent, what it posts on a question
    mid-stream `respond(read id, question)` (by default its answer)."""
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
        bodies, heads = [], []
        for n, tool in enumerate(tools, start=1):
            call = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
            async with http.stream("POST", url, json=call, headers=ours) as response:
                text, answered = "", set()
                async for chunk in response.aiter_text():
                    text += chunk
                    for line in text.split("\n")[:-1]:  # whole lines only
                        message = json.loads(line[6:]) if line.startswith("data: {") else {}
                        if "method" in message and message["id"] not in answered:
                            answered.add(message["id"])
                            await http.post(url, json=(respond or _answer)(n, message), headers=ours)
            bodies.append(_normal(text))
            heads.append({name: response.headers[name] for name in ("content-type", "cache-control")})
        return bodies, heads


def _answer(read: int, question: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = (
        {"roots": [{"uri": "file:///raw", "name": "raw"}]}
        if question["method"] == "roots/list"
        else {"action": "accept", "content": {"username": "raw"}}
    )
    return {"jsonrpc": "2.0", "id": question["id"], "result": result}


async def test_a_raw_client_s_answers_with_a_question_mid_read_are_the_sdk_s_bytes(tmp_path: Path) -> None:
    async with front(tmp_path / "full", lean=False) as (url, lane):
        full = await _raw_reads(url)
    async with front(tmp_path / "lean", lean=True) as (url, lane):
        lean = await _raw_reads(url)
    assert lane.took.count(True) == 2, lane.took
    assert lean == full
    bodies = lean[0]
    assert '"method":"roots/list"' in bodies[1] and "roots: file:///raw" in bodies[1]
    assert '"method":"elicitation/create"' in bodies[2] and 'content={\\"username\\": \\"raw\\"}' in bodies[2]


def _cancel(read: int, question: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": read}}


def _cancel_the_second(read: int, question: dict[str, Any]) -> dict[str, Any]:
    return _cancel(read, question) if read == 2 else _answer(read, question)


async def test_a_lean_read_cancelled_while_its_question_waits_ends_as_on_the_sdk_s_path(tmp_path: Path) -> None:
    tools = ("ask__ask_roots", "ask__ask_user", "ask__ask_roots")  # the read asked, then cancelled; then one more
    answers: dict[bool, list[str]] = {}
    for lean in (False, True):
        async with front(tmp_path / str(lean), lean=lean) as (url, lane):
            answers[lean] = (await _raw_reads(url, tools, _cancel_the_second))[0]
        if lean:
            assert lane.took.count(True) == 2, lane.took
    assert answers[True] == answers[False]
    cancelled = answers[True][1]
    assert '"method":"elicitation/create"' in cancelled and '"code":-32800' in cancelled
    assert "roots: file:///raw" in answers[True][2]  # the session goes on
