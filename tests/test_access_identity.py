"""Identity and rules end to end: two principals through the HTTP front, their tokens minted by a
real authorization server (oauth2-mock-server, `tests/oauth.py`), see different tools (`access:`)
and meet different reviewers (`rules:`), and the audit names each. The backends are the toy's
ledgers (`record` appends to a file): what a ledger lacks did not run."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.lowlevel import Server

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.asgi import host_names
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.fronts.probes import Door
from mcp_spec_proxy.fronts.replays import KEY_META
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.fixtures import feature_server
from tests.harness import ERAS, call_error, recorded, request_meta, toy, toy_twins
from tests.oauth import AuthServer, authorization_server

pytestmark = pytest.mark.anyio

ACCESS = [{"when": '(server == "bank" || server == "feat") && !("finance" in principal.groups)', "hide": True}]
RULES = [
    {"name": "admins", "when": '"admins" in principal.groups', "review": "allow"},
    {"name": "others", "when": "true", "deny": "only admins change the ledgers"},
]


@dataclass
class Front:
    url: str
    tmp: Path
    auth: AuthServer

    async def token(self, sub: str, *groups: str) -> str:
        claims: dict[str, Any] = {"sub": sub, "client_id": f"cli-{sub}", "aud": self.url, "scope": "mcp"}
        claims["groups"] = list(groups)
        return await self.auth.mint(**claims)

    def audit(self, event: str) -> list[dict[str, Any]]:
        """The audit lines of `event` (read once the proxy has stopped)."""
        return [line for line in read_audit(self.tmp / "state" / "audit.jsonl") if line["event"] == event]


@asynccontextmanager
async def front(
    tmp_path: Path, models: dict[str, Any] | None = None, access: list[dict[str, Any]] = ACCESS
) -> AsyncIterator[Front]:
    """The HTTP front under `auth:`, `access:` and `rules:`, over two toys (`toy` and `bank`) and a
    server with instructions, prompts and resources (`feat`)."""
    async with authorization_server() as auth, anyio.create_task_group() as tg:
        with anyio.fail_after(60):
            door = Door(token=None, hosts=host_names("127.0.0.1"))
            port = await tg.start(door.serve, "127.0.0.1", 0)
            url = f"http://127.0.0.1:{port}/mcp"
            raw = {
                "servers": {"toy": toy(tmp_path / "toy"), "bank": toy(tmp_path / "bank"), "feat": {"command": "-"}},
                "review": {"default": "human", "intent": False},
                "auth": {"issuer": auth.issuer, "audience": url, "scopes": ["mcp"]},
                "access": access,
                "rules": RULES,
                "models": models or {},
            }
            config = ProxyConfig.model_validate(raw)
            async with running_proxy(config, StatePaths(tmp_path / "state"), in_process=servers(raw)) as proxy:
                mcp = McpFront(proxy)
                await tg.start(functools.partial(serve_http, mcp, "127.0.0.1", port, door=door))
                yield Front(url, tmp_path, auth)
                tg.cancel_scope.cancel()


def servers(raw: dict[str, Any]) -> dict[str, Server[Any]]:
    return {**toy_twins(raw), "feat": feature_server.build()}


@asynccontextmanager
async def client(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as session,
    ):
        yield session


@pytest.mark.parametrize("mode", ERAS)
async def test_two_principals_see_different_tools_meet_different_reviewers_and_are_named_in_the_audit(
    tmp_path: Path, mode: str
) -> None:
    async with front(tmp_path) as f:
        ann, bob = await f.token("ann", "finance", "admins"), await f.token("bob", "eng")
        async with client(f.url, ann, mode) as as_ann:
            ann_sees = {tool.name for tool in (await as_ann.list_tools()).tools}
            ann_pays = await as_ann.call_tool("bank__record", {"value": "ann pays"})
            ann_notes = await as_ann.call_tool("toy__record", {"value": "ann notes"})
        async with client(f.url, bob, mode) as as_bob:
            bob_sees = {tool.name for tool in (await as_bob.list_tools()).tools}
            bob_pays = await call_error(as_bob, "bank__record", {"value": "bob pays"})
            nothing = await call_error(as_bob, "nosuch__record", {"value": "bob pays"})
            bob_notes = await as_bob.call_tool("toy__record", {"value": "bob notes"})
            bob_reads = await call_error(as_bob, "bank__echo", {"text": "balance?"})

    # access: the bank is ann's (finance) alone; to bob it does not exist.
    assert {"bank__record", "bank__echo", "toy__record"} <= ann_sees
    assert "toy__record" in bob_sees and not any(name.startswith("bank__") for name in bob_sees)
    for refused, name in ((bob_pays, "bank__record"), (bob_reads, "bank__echo")):
        assert refused.code == nothing.code
        assert refused.message.replace(name, "X") == nothing.message.replace("nosuch__record", "X")
    # rules: ann (admins) is allowed; bob meets the deny rule; his call of the hidden tool never got that far.
    assert not ann_pays.is_error and not ann_notes.is_error and bob_notes.is_error
    assert "only admins change the ledgers" in str(bob_notes.content)
    assert recorded(tmp_path / "bank") == ['{"value": "ann pays"}']
    assert recorded(tmp_path / "toy") == ['{"value": "ann notes"}']
    verdicts = [(v["principal"]["sub"], v["tool"], v.get("rule"), v["accepted"]) for v in f.audit("verdict")]
    assert verdicts == [
        ("ann", "bank__record", "admins", True),
        ("ann", "toy__record", "admins", True),
        ("bob", "toy__record", "others", False),
    ]
    assert {line["principal"]["client_id"] for line in f.audit("held")} == {"cli-ann", "cli-bob"}
    assert not any(line["tool"].startswith("bank__") and line["principal"]["sub"] == "bob" for line in f.audit("held"))


async def test_delegate_runs_its_steps_as_its_caller_under_access_and_rules(tmp_path: Path) -> None:
    """The engine's steps are its caller's: they see the caller's tools, meet `rules:` as the
    caller's calls and their audit lines name the caller."""
    offered: dict[str, set[str]] = {}

    def answer(request: ChatRequest) -> Reply | str:
        task = str(request.messages[-1]["content"]) if request.messages[-1]["role"] == "user" else ""
        if not task:
            return "Done."
        who, tool = task.split()[0], task.split()[-1]
        offered[who] = {t["function"]["name"] for t in request.tools}
        return Reply(tool_calls=[ToolCall(tool, {"value": f"{who} via delegate"})])

    async with ScriptedModelServer(Respond(answer)) as model:
        strong = {"base_url": model.base_url, "max_retries": 0, "model": "strong-model"}
        async with front(tmp_path, {"strong": strong}) as f:
            ann, bob = await f.token("ann", "finance", "admins"), await f.token("bob", "eng")
            for name, token, tool in (("ann", ann, "bank__record"), ("bob", bob, "toy__record")):
                async with client(f.url, token, "legacy") as session:
                    await session.call_tool("delegate", {"task": f"{name} asks: call {tool}"})
    assert "bank__record" in offered["ann"] and not any(n.startswith("bank__") for n in offered["bob"])
    assert recorded(tmp_path / "bank") == ['{"value": "ann via delegate"}'] and recorded(tmp_path / "toy") == []
    verdicts = [(v["principal"]["sub"], v["tool"], v.get("rule"), v["accepted"]) for v in f.audit("verdict")]
    assert verdicts == [("ann", "bank__record", "admins", True), ("bob", "toy__record", "others", False)]


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # auto: the 2026-07-28 era, discovered
async def test_a_hidden_servers_instructions_prompts_and_resources_are_its_principals_alone(
    tmp_path: Path, mode: str
) -> None:
    async with front(tmp_path) as f:
        seen: dict[str, tuple[bool, list[str], int]] = {}
        for name, token in (("ann", await f.token("ann", "finance")), ("bob", await f.token("bob", "eng"))):
            async with client(f.url, token, mode) as session:
                told = feature_server.INSTRUCTIONS in (session.instructions or "")
                prompts = [prompt.name for prompt in (await session.list_prompts()).prompts]
                seen[name] = (told, prompts, len((await session.list_resources()).resources))
    assert seen["ann"][0] and "feat__greet" in seen["ann"][1] and seen["ann"][2] > 0
    assert seen["bob"] == (False, [], 0)


@pytest.mark.parametrize("mode", ERAS)
async def test_access_hides_the_proxys_own_tools_as_tools_of_the_server_mcp_spec_proxy(
    tmp_path: Path, mode: str
) -> None:
    """`delegate` is a tool of `mcp-spec-proxy` to `access:`: hidden from bob, it is not listed to him
    and his call of it is the call of a tool that does not exist; no model is asked for him."""
    asked: list[str] = []

    def answer(request: ChatRequest) -> Reply | str:
        asked.append(str(request.messages[-1]["content"]))
        return "Done."

    own = [{"when": 'server == "mcp-spec-proxy" && !("admins" in principal.groups)', "hide": True}, *ACCESS]
    async with ScriptedModelServer(Respond(answer)) as model:
        strong = {"base_url": model.base_url, "max_retries": 0, "model": "strong-model"}
        async with front(tmp_path, {"strong": strong}, own) as f:
            ann, bob = await f.token("ann", "admins"), await f.token("bob", "eng")
            async with client(f.url, ann, mode) as as_ann:
                ann_sees = {tool.name for tool in (await as_ann.list_tools()).tools}
                ran = await as_ann.call_tool("delegate", {"task": "ann asks for nothing"})
            async with client(f.url, bob, mode) as as_bob:
                bob_sees = {tool.name for tool in (await as_bob.list_tools()).tools}
                refused = await call_error(as_bob, "delegate", {"task": "bob asks for nothing"})
                unknown = await call_error(as_bob, "nosuch", {"task": "bob asks for nothing"})
    assert "delegate" in ann_sees and not ran.is_error
    assert "delegate" not in bob_sees and "toy__echo" in bob_sees
    assert (refused.code, refused.message.replace("delegate", "X")) == (
        unknown.code,
        unknown.message.replace("nosuch", "X"),
    )
    assert asked == ["ann asks for nothing"]


async def test_every_audit_line_a_principal_caused_names_it(tmp_path: Path) -> None:
    """Log levels, subscriptions, resources, a keyed write (its claim, its verdict, its forward) and
    its replay: each line names ann, so `audit --principal ann` finds the whole story."""
    key = request_meta({KEY_META: "pay-once"})
    async with front(tmp_path) as f:
        ann = await f.token("ann", "finance", "admins")
        async with client(f.url, ann, "legacy") as session:
            await session.session.send_request(
                types.SetLevelRequest(params=types.SetLevelRequestParams(level="warning")), types.EmptyResult
            )
            subscription = types.SubscribeRequestParams(uri=feature_server.TODAY)
            await session.session.send_request(types.SubscribeRequest(params=subscription), types.EmptyResult)
            unsubscription = types.UnsubscribeRequestParams(uri=feature_server.TODAY)
            await session.session.send_request(types.UnsubscribeRequest(params=unsubscription), types.EmptyResult)
            await session.read_resource(feature_server.TODAY)
            await session.call_tool("bank__record", {"value": "ann pays"}, meta=key)
            await session.call_tool("bank__record", {"value": "ann pays"}, meta=key)  # a replay: not run again
            await session.call_tool("toy__echo", {"text": "done?"})
    assert recorded(tmp_path / "bank") == ['{"value": "ann pays"}']
    lines = [line for line in read_audit(tmp_path / "state" / "audit.jsonl") if "session" in line]
    events = {line["event"] for line in lines}
    expected = {"log-level", "subscribe", "unsubscribe", "resource", "claimed", "held", "verdict", "forwarded"}
    assert expected | {"replayed", "read"} <= events, events
    unnamed = [line for line in lines if line.get("principal") != {"sub": "ann", "client_id": "cli-ann"}]
    assert unnamed == []
