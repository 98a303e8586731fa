"""A backend's requests to the client (sampling, elicitation, roots) reach the client of the call.

Parity: the same tools of a real asking server (tests/fixtures/asking_server.py), called directly
and through the proxy as a real stdio process, in both client eras, with the backend speaking
both eras or only the handshake one, give the same answers. Then the side doors: a backend's
question never approves a held write, a relayed request_state is no approval ticket, a backend's
sampling never reaches the reviewer's model, a switched-off relay is refused, and every relayed
request is on the audit trail.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from pydantic import FileUrl

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Respond, ScriptedModelServer
from tests.harness import ERAS, PROXY_COMMAND, proxy_env, segment_length, text_of, verdict

pytestmark = pytest.mark.anyio

ASKING = Path(__file__).parent / "fixtures" / "asking_server.py"
BACKEND_ERAS = ["both", "legacy-only"]


class ClientSide:
    """What the client was asked, and its answers."""

    def __init__(self, *, approve_writes: bool = True) -> None:
        self.asked: list[str] = []
        self.approve_writes = approve_writes

    async def sampling(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        prompt = params.messages[0].content
        self.asked.append(f"sampling: {prompt.text if isinstance(prompt, types.TextContent) else prompt}")
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="forty-two"), model="client-model"
        )

    async def elicitation(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(f"elicitation: {params.message}")
        if "who are you" in params.message:
            return types.ElicitResult(action="accept", content={"username": "ada"})
        return types.ElicitResult(action="accept", content={"approve": self.approve_writes})  # the proxy's review

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl("file:///home/ada/notes"), name="notes")])

    def client(self, server: StdioServerParameters | str, era: str) -> Client:
        return Client(
            server,
            mode=era,
            sampling_callback=self.sampling,
            elicitation_callback=self.elicitation,
            list_roots_callback=self.roots,
        )


def backend(ledger: Path, backend_era: str) -> dict[str, Any]:
    flags = ["--legacy-only"] if backend_era == "legacy-only" else []
    return {"command": sys.executable, "args": [str(ASKING), *flags], "env": {"ASKING_LEDGER": str(ledger)}}


def proxy_params(tmp: Path, config: dict[str, Any]) -> StdioServerParameters:
    config_file = tmp / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config))
    args = ["--config", str(config_file), "--state-dir", str(tmp / "state"), "--log-level", "WARNING"]
    return StdioServerParameters(command=PROXY_COMMAND, args=args, env=proxy_env())


@asynccontextmanager
async def connected(params: StdioServerParameters | str, side: ClientSide, era: str) -> AsyncIterator[Client]:
    with anyio.fail_after(90):
        async with side.client(params, era) as client:
            yield client


CALLS = [
    ("ask_model", {"prompt": "what is six times seven?"}),
    ("ask_user", {}),
    ("ask_roots", {}),
    ("ask_then_write", {"note": "n1"}),
]


@pytest.mark.parametrize("backend_era", BACKEND_ERAS)
@pytest.mark.parametrize("era", ERAS)
async def test_a_backends_questions_reach_the_client_as_they_do_directly(
    tmp_path: Path, era: str, backend_era: str
) -> None:
    direct_ledger, proxied_ledger = tmp_path / "direct.jsonl", tmp_path / "proxied.jsonl"
    direct_side, proxied_side = ClientSide(), ClientSide()
    spec = backend(direct_ledger, backend_era)
    direct = StdioServerParameters(command=spec["command"], args=spec["args"], env=spec["env"])
    config = {"servers": {"ask": backend(proxied_ledger, backend_era)}, "review": {"default": "allow"}}
    # A 2026-07-28 client cannot reach a handshake-only server directly; through the proxy it can.
    direct_era = era if backend_era == "both" else "legacy"
    async with connected(direct, direct_side, direct_era) as client:
        expected = [text_of(await client.call_tool(name, args)) for name, args in CALLS]
    async with connected(proxy_params(tmp_path, config), proxied_side, era) as client:
        got = [text_of(await client.call_tool(f"ask__{name}", args)) for name, args in CALLS]
    assert expected[0] == "model client-model said: forty-two"
    assert expected[1] == expected[3] == 'user: action=accept content={"username": "ada"}'
    assert expected[2] == "roots: file:///home/ada/notes"
    assert got == expected
    assert proxied_side.asked == direct_side.asked
    assert proxied_ledger.read_text() == direct_ledger.read_text()  # the write ran once, with the user's answer
    audit = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    relayed = [(row["server"], row["method"]) for row in audit if row.get("event") == "relayed"]
    assert relayed == [
        ("ask", "sampling/createMessage"),
        ("ask", "elicitation/create"),
        ("ask", "roots/list"),
        ("ask", "elicitation/create"),
    ]


@asynccontextmanager
async def http_proxy(tmp_path: Path, config: dict[str, Any]) -> AsyncIterator[str]:
    with anyio.fail_after(60):
        async with (
            running_proxy(ProxyConfig.model_validate(config), StatePaths(tmp_path / "state")) as proxy,
            anyio.create_task_group() as tg,
        ):
            front = McpFront(proxy)
            port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
            yield f"http://127.0.0.1:{port}/mcp"
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("backend_era", BACKEND_ERAS)
@pytest.mark.parametrize("era", ERAS)
async def test_a_backends_questions_reach_a_client_of_the_http_front(
    tmp_path: Path, era: str, backend_era: str
) -> None:
    """The same answers as directly (the first test's), on the HTTP front: a handshake-era client
    is asked on its call's stream, a 2026-07-28 client through a suspended call."""
    ledger = tmp_path / "ledger.jsonl"
    config = {"servers": {"ask": backend(ledger, backend_era)}, "review": {"default": "allow"}}
    side = ClientSide()
    async with http_proxy(tmp_path, config) as url, side.client(url, era) as client:
        got = [text_of(await client.call_tool(f"ask__{name}", args)) for name, args in CALLS]
    user = 'user: action=accept content={"username": "ada"}'
    assert got == ["model client-model said: forty-two", user, "roots: file:///home/ada/notes", user]
    assert [json.loads(line)["note"] for line in ledger.read_text().splitlines()] == ["n1"]
    assert len(side.asked) == 4


@pytest.mark.parametrize("era", ERAS)
async def test_a_backends_question_inside_a_write_is_asked_only_after_the_writes_own_review(
    tmp_path: Path, era: str
) -> None:
    """Under `human` review the proxy asks first; a refusal means the backend never runs (and
    never asks); an approval runs it, and its own question is then the user's to answer."""
    ledger = tmp_path / "ledger.jsonl"
    config = {"servers": {"ask": backend(ledger, "both")}, "review": {"default": "human"}}
    refusing = ClientSide(approve_writes=False)
    async with connected(proxy_params(tmp_path, config), refusing, era) as client:
        refused = await client.call_tool("ask__ask_then_write", {"note": "no"})
    assert refused.is_error and not ledger.exists()
    assert [asked.split(":")[0] for asked in refusing.asked] == ["elicitation"]
    assert "who are you" not in refusing.asked[0]

    approving = ClientSide()
    async with connected(proxy_params(tmp_path, config), approving, era) as client:
        done = await client.call_tool("ask__ask_then_write", {"note": "yes"})
    assert text_of(done) == 'user: action=accept content={"username": "ada"}'
    assert len(approving.asked) == 2 and "who are you" in approving.asked[1]
    assert [json.loads(line)["note"] for line in ledger.read_text().splitlines()] == ["yes"]


async def test_a_backends_sampling_never_reaches_the_reviewers_model(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    seen: list[str] = []

    def review(request: ChatRequest) -> str:
        seen.append(json.dumps(request.messages))
        return verdict(segment_length(request), "fine")

    async with ScriptedModelServer(Respond(review)) as model:
        config = {
            "servers": {"ask": backend(ledger, "both")},
            "models": {"strong": {"base_url": model.base_url, "model": "strong"}},
            "review": {"default": "strong"},
        }
        side = ClientSide()
        async with connected(proxy_params(tmp_path, config), side, "legacy") as client:
            answer = await client.call_tool("ask__ask_model", {"prompt": "secret prompt for the client model"})
            written = await client.call_tool("ask__ask_then_write", {"note": "n"})
    assert text_of(answer) == "model client-model said: forty-two"
    assert not written.is_error
    assert side.asked[0] == "sampling: secret prompt for the client model"
    # The strong model was asked once, to review the write (the read's result is in its segment,
    # as an observation); the backend's sampling request went to the client's model alone.
    assert len(seen) == 1 and "verifier" in seen[0]
    assert "max_tokens" not in seen[0] and '"sampling' not in seen[0]


@pytest.mark.parametrize("era", ERAS)
async def test_a_relay_switched_off_for_a_server_is_refused_and_the_client_is_not_asked(
    tmp_path: Path, era: str
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    server = {**backend(ledger, "both"), "relay": {"sampling": False}}
    config = {"servers": {"ask": server}, "review": {"default": "allow"}}
    side = ClientSide()
    async with connected(proxy_params(tmp_path, config), side, era) as client:
        # The backend's own error, as a client without sampling would get it from the backend directly.
        with pytest.raises(MCPError, match=r"(?i)sampling not supported"):
            await client.call_tool("ask__ask_model", {"prompt": "p"})
        user = await client.call_tool("ask__ask_user", {})
    assert text_of(user) == 'user: action=accept content={"username": "ada"}'
    assert side.asked == ["elicitation: ask_user: who are you?"]


async def test_a_backends_request_outside_any_call_asks_the_stdio_fronts_one_client(tmp_path: Path) -> None:
    """Its one client is the client of every shared backend session: asked as it would be directly."""
    fifo = tmp_path / "later"
    os.mkfifo(fifo)
    server = backend(tmp_path / "ledger", "legacy-only")
    server["env"]["ASKING_LATER_FIFO"] = str(fifo)
    config = {"servers": {"ask": server}, "review": {"default": "allow"}}
    side = ClientSide()
    async with connected(proxy_params(tmp_path, config), side, "legacy") as client:
        assert text_of(await client.call_tool("ask__ask_later", {})) == "will ask"
        with anyio.fail_after(20):  # the backend asks 0.2 s after its answer, with no call in flight
            outcome = await anyio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
    assert outcome.startswith("answered:") and "forty-two" in outcome
    assert side.asked == ["sampling: unasked"]


async def test_a_backends_request_outside_any_call_on_a_shared_http_session_reaches_no_client(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "later"
    os.mkfifo(fifo)
    server = backend(tmp_path / "ledger", "legacy-only")
    server["env"]["ASKING_LATER_FIFO"] = str(fifo)
    config = {"servers": {"ask": server}, "review": {"default": "allow"}}  # a stdio backend: shared
    side = ClientSide()
    async with http_proxy(tmp_path, config) as url, connected(url, side, "legacy") as client:
        assert text_of(await client.call_tool("ask__ask_later", {})) == "will ask"
        with anyio.fail_after(20):
            outcome = await anyio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
    assert outcome.startswith(
        "error -32600: mcp-spec-proxy cannot tell which client this sampling/createMessage is for"
    )
    assert "no call of a client is in flight" in outcome
    assert side.asked == []


async def test_a_relayed_request_state_is_single_use_and_no_approval_ticket(tmp_path: Path) -> None:
    """2026-07-28: the state of a suspended call resumes that call once; replayed, moved to other
    arguments, or offered as a write's approval, it resumes and approves nothing."""
    ledger = tmp_path / "ledger.jsonl"
    config = {"servers": {"ask": backend(ledger, "both")}, "review": {"default": "human"}}
    side = ClientSide()
    async with connected(proxy_params(tmp_path, config), side, "2026-07-28") as client:
        session = client.session
        first = await session.call_tool("ask__ask_user", {}, allow_input_required=True)
        assert isinstance(first, types.InputRequiredResult) and first.input_requests is not None
        (key, request), state = next(iter(first.input_requests.items())), first.request_state
        assert isinstance(request, types.ElicitRequest) and "who are you" in request.params.message
        answer: types.InputResponses = {key: types.ElicitResult(action="accept", content={"username": "eve"})}
        done = await session.call_tool("ask__ask_user", {}, input_responses=answer, request_state=state)
        assert text_of(done) == 'user: action=accept content={"username": "eve"}'
        with pytest.raises(Exception, match="names no call waiting"):
            await session.call_tool("ask__ask_user", {}, input_responses=answer, request_state=state)
        approve: types.InputResponses = {
            "mcp-spec-proxy/approval": types.ElicitResult(action="accept", content={"approve": True})
        }
        with pytest.raises(Exception, match="names no call waiting"):
            await session.call_tool("ask__ask_then_write", {"note": "x"}, input_responses=approve, request_state=state)
    assert not ledger.exists()
