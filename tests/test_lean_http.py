"""The lean HTTP read path (`fronts/lean_http.py`): the same bytes as the SDK's path, from outside.

Each scenario runs over real HTTP, with raw requests: against a proxy whose reads take the lean
lane and against ones where every request takes the SDK's path. The answers must be the same bytes
(event ids, call ids and session ids aside) with the same status and headers, in both eras and for
every kind of Accept; a handshake-era read the lane answers is one JSON body, the bytes the SDK's
transport sends in JSON mode (a second SDK-path proxy, its manager set to JSON answers, says what
they are), and everything else the bytes of the SDK's path as this front runs it. A spy on the lane
says which requests it answered, and the toy's ledger and the audit log say what ran. Under `auth:`,
a forged token is refused as before, and the lane never serves it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts import lean_http
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.harness import recorded, toy, toy_twins
from tests.lean_spy import spied_install
from tests.oauth import authorization_server, unsigned

pytestmark = pytest.mark.anyio

HANDSHAKE = "2025-11-25"
MODERN = "2026-07-28"
BOTH = "application/json, text/event-stream"
HEADERS = (
    "content-type",
    "content-length",
    "cache-control",
    "connection",
    "x-accel-buffering",
    "www-authenticate",
    "allow",
)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str
    session: bool  # whether it named the session (its id is random)


@dataclass
class Lane:
    """How many requests the lean lane answered itself."""

    took: list[bool] = field(default_factory=list)


@asynccontextmanager
async def front(
    tmp_path: Path, lean: bool, auth: dict[str, Any] | None = None, json_mode: bool = False
) -> AsyncIterator[tuple[str, Lane]]:
    """A proxy on HTTP: its reads on the lean lane, or every request on the SDK's path (`json_mode`:
    the SDK's transport answering each request with one JSON body)."""
    raw: dict[str, Any] = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "deny"}}
    if auth is not None:
        raw["auth"] = auth
    lane = Lane()
    with anyio.fail_after(60), pytest.MonkeyPatch.context() as patch:
        patch.setattr(lean_http, "install", spied_install(lean, lane.took, json_mode=json_mode))
        config = ProxyConfig.model_validate(raw)
        async with (
            running_proxy(config, StatePaths(tmp_path / "state"), in_process=toy_twins(raw)) as proxy,
            anyio.create_task_group() as tg,
        ):
            port = 0 if auth is None else int(auth["audience"].split(":")[-1].split("/")[0])
            mcp = McpFront(proxy)
            port = await tg.start(lambda task_status: serve_http(mcp, "127.0.0.1", port, task_status=task_status))
            yield f"http://127.0.0.1:{port}/mcp", lane
            tg.cancel_scope.cancel()


def normal(response: httpx.Response, session: str | None) -> Answer:
    body = response.text
    body = re.sub(r"(?m)^id: [^\r\n]*", "id: EVENT", body)  # random event ids
    body = re.sub(rf'"{re.escape(CALL_META)}":"[0-9a-f]+"', f'"{CALL_META}":"CALL"', body)
    port = re.compile(r"127\.0\.0\.1:\d+")
    headers = {name: port.sub("LOCAL", response.headers[name]) for name in HEADERS if name in response.headers}
    body = port.sub("LOCAL", body)
    named = response.headers.get("mcp-session-id")
    return Answer(response.status_code, headers, body, named is not None and named == session)


def call(request_id: int, name: str, arguments: Any, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


ENVELOPE = {
    PROTOCOL_VERSION_META_KEY: MODERN,
    CLIENT_INFO_META_KEY: {"name": "raw", "version": "1"},
    CLIENT_CAPABILITIES_META_KEY: {},
}

# (name, arguments, accept): a read, a non-ASCII read, arguments the tool refuses (an isError result),
# a write (held and refused), an unknown tool, Accept the SDK refuses.
CASES: list[tuple[str, Any, str]] = [
    ("toy__echo", {"text": "plain"}, BOTH),
    ("toy__echo", {"text": 'héllo 😀 "quoted" \\ </script>'}, BOTH),
    ("toy__echo", {"text": 5}, BOTH),
    ("toy__record", {"value": "v", "intent": "x"}, BOTH),
    ("toy__nope", {}, BOTH),
    ("toy__echo", {"text": "json only"}, "application/json"),
    ("toy__echo", {"text": "sse only"}, "text/event-stream"),
]


async def handshake_answers(
    url: str, headers: dict[str, str] | None = None, intruder: dict[str, str] | None = None
) -> list[Answer]:
    """The answers to `CASES` on a session of the client's own; and, with `intruder`'s headers, to a
    read another credential sends on that session."""
    async with httpx.AsyncClient(headers=headers) as http:
        base = {"accept": BOTH, "content-type": "application/json"}
        opened = await http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": HANDSHAKE,
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            },
            headers=base,
        )
        session = opened.headers["mcp-session-id"]
        ours = {**base, "mcp-session-id": session, "mcp-protocol-version": HANDSHAKE}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=ours)
        await http.post(url, json=call(1, "toy__echo", {"text": "first"}), headers=ours)  # makes the session's state
        answers = []
        for n, (name, arguments, accept) in enumerate(CASES, start=2):
            response = await http.post(url, json=call(n, name, arguments), headers={**ours, "accept": accept})
            answers.append(normal(response, session))
        # A client that leaves the version header out (the transport then assumes the oldest era's stream).
        bare = {name: value for name, value in ours.items() if name != "mcp-protocol-version"}
        answers.append(
            normal(await http.post(url, json=call(98, "toy__echo", {"text": "no header"}), headers=bare), session)
        )
        # A Content-Type the security check lets by (a prefix) and the transport refuses (not exactly JSON): 415.
        odd = {**ours, "content-type": "application/json-patch+json"}
        answers.append(normal(await http.post(url, json=call(97, "toy__echo", {"text": "odd"}), headers=odd), session))
        if intruder is not None:
            response = await http.post(url, json=call(99, "toy__echo", {"text": "x"}), headers={**ours, **intruder})
            answers.append(normal(response, session))
        return answers


async def modern_answers(url: str, headers: dict[str, str] | None = None) -> list[Answer]:
    async with httpx.AsyncClient(headers=headers) as http:
        answers = []
        for n, (name, arguments, accept) in enumerate(CASES, start=1):
            routing = {
                "accept": accept,
                "content-type": "application/json",
                "mcp-protocol-version": MODERN,
                "mcp-method": "tools/call",
                "mcp-name": name,
                "mcp-spec-proxy-session": "conversation",
            }
            response = await http.post(url, json=call(n, name, arguments, ENVELOPE), headers=routing)
            answers.append(normal(response, None))
        return answers


# The handshake-era answers the lane gives (the reads with an Accept the SDK takes: `CASES` 0-2 and the
# read without a version header); each is the SDK's JSON-mode answer.
LANE_READS = (0, 1, 2, len(CASES))


def sdk_answers(sse: list[Answer], json_mode: list[Answer], era: str) -> list[Answer]:
    """What the SDK's path answers, each request as the lean lane must: its JSON mode for the reads the
    lane answers in the handshake era (2026-07-28 answers are JSON in both), its SSE mode for the rest."""
    return [json_mode[n] if era == "handshake" and n in LANE_READS else answer for n, answer in enumerate(sse)]


@pytest.mark.parametrize("era", ["handshake", "modern"])
async def test_the_lean_lane_answers_with_the_sdk_s_bytes(tmp_path: Path, era: str) -> None:
    answers = handshake_answers if era == "handshake" else modern_answers
    async with front(tmp_path / "full", lean=False) as (url, lane):
        full = await answers(url)
    async with front(tmp_path / "json", lean=False, json_mode=True) as (url, lane):
        full_json = await answers(url)
    async with front(tmp_path / "lean", lean=True) as (url, lane):
        lean = await answers(url)
    expected = sdk_answers(full, full_json, era)
    for case, wanted, got in zip(
        [*CASES, "no version header", "a Content-Type not exactly JSON"], expected, lean, strict=False
    ):
        assert got == wanted, case
    assert len(full) == len(lean)
    # The reads with an Accept the SDK takes went the lean way; nothing else did.
    taken = [answered for answered in lane.took if answered]
    assert len(taken) == (4 if era == "handshake" else 3), lane.took
    assert '"isError":true' in lean[2].body and "text" in lean[2].body
    assert "héllo 😀" in json.loads(_data(lean[1].body))["result"]["content"][0]["text"]
    if era == "handshake":  # one JSON body, where the SDK's path as this front runs it sends an SSE stream
        assert all(lean[n].headers["content-type"] == "application/json" for n in LANE_READS)
        assert all(full[n].headers["content-type"] == "text/event-stream" for n in LANE_READS)
        assert json.loads(_data(full[0].body)) == json.loads(lean[0].body)
    assert recorded(tmp_path / "lean" / "rec") == recorded(tmp_path / "full" / "rec") == []  # the write never ran
    events = [(e["event"], e.get("tool")) for e in read_audit(tmp_path / "lean" / "state" / "audit.jsonl")]
    assert events.count(("read", "toy__echo")) == (4 if era == "handshake" else 2)


def _data(body: str) -> str:
    """The JSON of an answer: a JSON body, or the data of its SSE event that carries one."""
    lines = [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: {")]
    return lines[-1] if lines else body


async def test_a_cancelled_lean_read_ends_with_the_sdk_s_answer_and_the_backend_hears_it(tmp_path: Path) -> None:
    async with front(tmp_path, lean=True) as (url, lane), httpx.AsyncClient(timeout=30) as http:
        base = {"accept": BOTH, "content-type": "application/json"}
        opened = await http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": HANDSHAKE,
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            },
            headers=base,
        )
        ours = {**base, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": HANDSHAKE}
        await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=ours)
        await http.post(url, json=call(1, "toy__echo", {"text": "first"}), headers=ours)
        hung: list[httpx.Response] = []
        async with anyio.create_task_group() as tg:

            async def hang() -> None:
                hung.append(await http.post(url, json=call(7, "toy__hang", {}), headers=ours))

            tg.start_soon(hang)
            await anyio.sleep(0.5)  # the read reaches the backend (were it later, the cancel finds nothing to cancel)
            cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
            await http.post(url, json=cancel, headers=ours)
        was = await http.post(url, json=call(8, "toy__was_cancelled", {}), headers=ours)
    assert lane.took.count(True) == 2  # the hung read and the question after it went the lean way
    assert '"code":-32800' in hung[0].text and "Request cancelled" in hung[0].text
    assert json.loads(_data(was.text))["result"]["content"][0]["text"] == "true"


async def test_under_auth_a_forged_token_is_refused_as_before_and_never_reaches_the_lane(tmp_path: Path) -> None:
    async with authorization_server() as issuer:
        answers: dict[str, list[Answer]] = {}
        for kind in ("sse", "json", "lean"):
            port = _free_port()
            audience = f"http://127.0.0.1:{port}/mcp"
            auth = {"issuer": issuer.issuer, "audience": audience, "scopes": ["mcp"]}
            lean = kind == "lean"
            async with front(tmp_path / kind, lean=lean, auth=auth, json_mode=kind == "json") as (url, lane):
                token = await issuer.mint(sub="alice", client_id="cli-a", aud=audience, scope="mcp")
                bob = await issuer.mint(sub="bob", client_id="cli-b", aud=audience, scope="mcp")
                good = await handshake_answers(
                    url, {"authorization": f"Bearer {token}"}, intruder={"authorization": f"Bearer {bob}"}
                )
                forged = unsigned(
                    {"sub": "alice", "client_id": "cli-a", "aud": audience, "scope": "mcp", "iss": issuer.issuer}
                )
                refused = await modern_answers(url, {"authorization": f"Bearer {forged}"})
                answers[kind] = [*good, *refused]
                before = len(lane.took)
        assert answers["lean"] == sdk_answers(answers["sse"], answers["json"], "handshake")
        assert answers["lean"][len(CASES) + 1].status == 415  # a Content-Type not exactly JSON, as the SDK says
        assert answers["lean"][len(CASES) + 2].status == 404  # another principal's read on alice's session
        assert all(
            answer.status == 401 and "www-authenticate" in answer.headers
            for answer in answers["lean"][len(CASES) + 3 :]
        )
        assert len([t for t in lane.took[:before] if t]) == 4  # the good token's reads went the lean way


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
