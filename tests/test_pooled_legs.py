"""A 2026-07-28 request that names no session, behind a URL backend that speaks only the handshake era:
it is lent a warm backend session from a pool (per principal and declared capabilities) instead of
opening one of its own per request (`backends/session_legs.py`).

The backends are real servers over streamable HTTP on port 0, behind `HandshakeOnly`, which refuses
the 2026-07-28 era as the npm reference servers do and counts what it hears: the toy (its `record`
made a read here, so its ledger is the ground truth of each read that ran), the toy behind its own
authorization server (which records the bearer of every call), and the asking server (its tools ask
the client something during the call).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.auth import OAuthToken
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.backends.era import speaking
from mcp_spec_proxy.backends.session_legs import SessionRef, serving
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.asgi import serve_asgi
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import Proxy, StatePaths, running_proxy
from mcp_spec_proxy.store.tokens import TokenFile
from tests.fixtures import asking_server, toy_server
from tests.harness import recorded, text_of
from tests.oauth import authorization_server
from tests.test_backend_login_flow import _free_port
from tests.test_identity import client_with, protected
from tests.test_principal_logins import Heard, browse

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
LOGIN_URL = re.compile(r"needs your own login: open (\S+) in a browser")
AS_READ = {"tools": {"overrides": {"record": {"read_only": True}}}}


class HandshakeOnly:
    """An ASGI server that answers only the initialize handshake's era, as the npm servers do, and
    counts the `initialize` requests (backend sessions opened) and keeps the `tools/call`s it passes on."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        self.initialized = 0
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        sent = json.loads(body) if body.startswith(b"{") else {}
        version = dict(scope["headers"]).get(b"mcp-protocol-version", b"").decode()
        if sent.get("method") == "server/discover" or version == MODERN:
            refusal = {"jsonrpc": "2.0", "id": sent.get("id"), "error": {"code": -32601, "message": "Method not found"}}
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 400, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps(refusal).encode()})
            return
        if sent.get("method") == "initialize":
            self.initialized += 1
        elif sent.get("method") == "tools/call":
            self.calls.append(sent)
        replayed = False

        async def again() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.inner(scope, again, send)


@asynccontextmanager
async def over_http(app: ASGIApp) -> AsyncIterator[str]:
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(app, "127.0.0.1", 0, task_status=task_status))
        yield f"http://127.0.0.1:{port}/mcp"
        tg.cancel_scope.cancel()


@asynccontextmanager
async def front_over(servers: dict[str, Any], tmp_path: Path) -> AsyncIterator[tuple[Proxy, str]]:
    config = ProxyConfig.model_validate({"servers": servers, "review": {"default": "deny"}})
    async with running_proxy(config, StatePaths(tmp_path / "state")) as proxy, anyio.create_task_group() as tg:
        front = McpFront(proxy)
        port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
        yield proxy, f"http://127.0.0.1:{port}/mcp"
        tg.cancel_scope.cancel()


async def test_reads_that_name_no_session_share_one_warm_backend_session_and_each_runs_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    backend = HandshakeOnly(toy_server.build(ledger).streamable_http_app(host="127.0.0.1"))
    with anyio.fail_after(90):
        async with (
            over_http(backend) as url,
            front_over({"far": {"url": url, **AS_READ}}, tmp_path) as (proxy, front),
            Client(front, mode=MODERN) as client,
        ):
            legs = proxy.backends.get("far").sessions
            assert legs is not None
            before = backend.initialized  # the proxy's own first session
            for n in range(5):
                result = await client.call_tool("far__record", {"value": f"read-{n}"})
                assert not result.is_error, text_of(result)
            sequential = backend.initialized - before
            async with anyio.create_task_group() as tg:
                for n in range(5, 8):
                    tg.start_soon(client.call_tool, "far__record", {"value": f"read-{n}"})
    # Each read ran once at the backend (review: deny, so none went as a write); five in a row opened
    # one backend session, where each request named no session of its own.
    assert sorted(json.loads(line)["value"] for line in recorded(ledger)) == [f"read-{n}" for n in range(8)]
    assert sorted(call["params"]["arguments"]["value"] for call in backend.calls) == [f"read-{n}" for n in range(8)]
    assert sequential == 1, sequential


async def modern_served(url: str, token: str, value: str) -> str:
    """Call `far__record` as the token's principal with a 2026-07-28 client that names no session,
    logging in through the URL a refusal names; the result's text."""
    async with client_with(url, token, MODERN) as client:
        with anyio.fail_after(90):
            for _ in range(10):
                try:
                    result = await client.call_tool("far__record", {"value": value})
                    text = text_of(result)
                    if not result.is_error:
                        return text
                except MCPError as exc:
                    text = str(exc)
                found = LOGIN_URL.search(text)
                if found is None:
                    return text
                await browse(found.group(1))
    return "never served"


async def test_a_principals_pooled_session_never_serves_another_principal(tmp_path: Path) -> None:
    """alice and bob each log in to the backend for themselves; then their reads, interleaved and
    naming no session, each reach the backend with their own token, never the other's."""
    tracker = Heard(tmp_path / "remote-ledger")
    tracker.issued["operator-token"] = "read write"  # the operator's login: the shared session's
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        url = f"{tracker.base}/mcp"
        await TokenFile.of(tmp_path / "state", "far", url).set_tokens(OAuthToken(access_token="operator-token"))
        servers = {"far": {"url": url, "auth": {"callback_port": _free_port()}, **AS_READ}}  # no shared default port
        async with authorization_server() as auth, protected(tmp_path, auth.issuer, servers=servers) as front:
            tokens = {
                who: await auth.mint(sub=who, client_id=f"cli-{who}", aud=front.url, scope="mcp")
                for who in ("alice", "bob")
            }
            for who in ("alice", "bob"):  # each logs in once, then is served
                said = await modern_served(front.url, tokens[who], f"{who}-0")
                assert said == f"recorded {who}-0", said
            served = len(tracker.calls)
            for n in range(1, 4):
                for who in ("alice", "bob"):
                    await modern_served(front.url, tokens[who], f"{who}-{n}")
        tg.cancel_scope.cancel()
    later = tracker.calls[served:]
    bearers = {who: {bearer for bearer, value in tracker.calls if value.startswith(who)} for who in ("alice", "bob")}
    assert sorted(value for _, value in later) == sorted(f"{who}-{n}" for who in ("alice", "bob") for n in range(1, 4))
    assert bearers["alice"] and bearers["bob"] and not bearers["alice"] & bearers["bob"], bearers
    assert "operator-token" not in bearers["alice"] | bearers["bob"]
    assert sorted(json.loads(line)["value"] for line in recorded(tracker.ledger)) == sorted(
        f"{who}-{n}" for who in ("alice", "bob") for n in range(4)
    )


def answering(username: str) -> Any:
    async def elicitation(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"username": username})

    return elicitation


async def test_a_read_that_asks_its_client_reaches_its_own_client_on_a_pooled_session(tmp_path: Path) -> None:
    """Two 2026-07-28 clients that can be asked (elicitation, no roots), naming no session, call a
    read that asks the user during the call, at once and again: each hears only its own answer."""
    backend = HandshakeOnly(asking_server.build(None).streamable_http_app(host="127.0.0.1"))
    with anyio.fail_after(90):
        async with (
            over_http(backend) as url,
            front_over({"ask": {"url": url}}, tmp_path) as (_, front),
            Client(front, mode=MODERN, elicitation_callback=answering("ada")) as ada,
            Client(front, mode=MODERN, elicitation_callback=answering("bob")) as bob,
        ):
            heard: dict[str, list[str]] = {"ada": [], "bob": []}

            async def ask(name: str, client: Client) -> None:
                heard[name].append(text_of(await client.call_tool("ask__ask_user", {})))

            for _ in range(3):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(ask, "ada", ada)
                    tg.start_soon(ask, "bob", bob)
    for name in ("ada", "bob"):
        assert heard[name] == [f'user: action=accept content={{"username": "{name}"}}'] * 3, heard
    assert len(backend.calls) == 6  # each call ran once: the answer reached the call that asked


async def test_a_call_that_outlives_its_request_gives_back_the_pooled_session_it_took_after(tmp_path: Path) -> None:
    """A 2026-07-28 call suspended for its client's answer goes on after its request ended (the retry
    resumes it); when it reaches a second backend only then, the pooled session it is lent there goes
    back when that call ends, and the next request is served on it. Each backend counts the sessions
    opened on it: the ledger."""
    one = HandshakeOnly(toy_server.build(tmp_path / "one").streamable_http_app(host="127.0.0.1"))
    two = HandshakeOnly(toy_server.build(tmp_path / "two").streamable_http_app(host="127.0.0.1"))
    with anyio.fail_after(90):
        async with (
            over_http(one) as first,
            over_http(two) as second,
            front_over({"one": {"url": first, **AS_READ}, "two": {"url": second, **AS_READ}}, tmp_path) as (proxy, _),
        ):
            before = (one.initialized, two.initialized)  # the proxy's own sessions
            suspended = SessionRef("request-1", None, ephemeral=True)
            with speaking(MODERN), serving(suspended):
                await proxy.backends.get("one").call_tool("record", {"value": "during"})
                suspended.end()  # its request is answered `input_required`; the call goes on
                await proxy.backends.get("two").call_tool("record", {"value": "after"})
            for n in range(2):
                later = SessionRef(f"request-{n + 2}", None, ephemeral=True)
                with speaking(MODERN), serving(later):
                    await proxy.backends.get("two").call_tool("record", {"value": f"next-{n}"})
                later.end()
    assert [json.loads(line)["value"] for line in recorded(tmp_path / "two")] == ["after", "next-0", "next-1"]
    assert (one.initialized - before[0], two.initialized - before[1]) == (1, 1)  # one session each, lent again
