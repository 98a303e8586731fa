"""The lean HTTP lane serves 2026-07-28 clients that can be asked: a read its backend asks in comes back
`input_required`, as on the SDK's path, and the client's retry resumes that very call.

A real asking server (tests/fixtures/asking_server.py) behind a real HTTP front, once with the lean
lane and once with every request on the SDK's path (`tests/test_lean_http_asks.py`'s `front`). The
SDK's own 2026-07-28 client, answering with callbacks, must get the same results and be asked the
same questions on both; a raw client's bytes — the `input_required` answer and the retry's — must be
the SDK's (the random `requestState` aside), and a state is good for its own call only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from tests.harness import text_of
from tests.test_lean_http_asks import BOTH, CAPABILITIES, Person, front

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"


async def test_a_2026_client_that_can_be_asked_gets_the_lane_and_its_backend_s_questions(tmp_path: Path) -> None:
    results: dict[bool, tuple[list[str], list[str], list[str]]] = {}
    for lean in (False, True):
        person = Person("ada")
        async with front(tmp_path / str(lean), lean) as (url, lane), person.client(url, MODERN) as client:
            got = [
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
        if lean:  # each first request went the lean way; each retry carrying an answer, the SDK's
            assert lane.took.count(True) == 3, lane.took
    assert results[True] == results[False]
    got, asked, relayed = results[True]
    assert got == [
        "roots: file:///home/ada",
        'user: action=accept content={"username": "ada"}',
        "model m said: ada says hi",
    ]
    assert asked == ["roots", "elicitation: ask_user: who are you?", "sampling"]
    assert relayed == ["roots/list", "elicitation/create", "sampling/createMessage"]  # each audited


ENVELOPE = {
    PROTOCOL_VERSION_META_KEY: MODERN,
    CLIENT_INFO_META_KEY: {"name": "raw", "version": "1"},
    CLIENT_CAPABILITIES_META_KEY: CAPABILITIES,
}


def _normal(text: str) -> str:
    text = re.sub(r'"requestState":"[^"]+"', '"requestState":"STATE"', text)
    return re.sub(rf'"{re.escape(CALL_META)}":"[0-9a-f]+"', f'"{CALL_META}":"CALL"', text)


async def _raw(url: str) -> list[tuple[int, str, str]]:
    """A raw client that declares sampling, elicitation and roots: a read its backend asks in, its retry
    with the answer, and the same state offered again."""
    async with httpx.AsyncClient(timeout=30) as http:

        async def post(n: int, tool: str, extra: dict[str, Any] | None = None) -> httpx.Response:
            params = {"name": tool, "arguments": {}, "_meta": ENVELOPE, **(extra or {})}
            headers = {
                "accept": BOTH,
                "content-type": "application/json",
                "mcp-protocol-version": MODERN,
                "mcp-method": "tools/call",
                "mcp-name": tool,
                "mcp-spec-proxy-session": "conversation",
            }
            body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
            return await http.post(url, json=body, headers=headers)

        asked = await post(1, "ask__ask_user")
        result = json.loads(asked.text)["result"]
        ((key, _),) = result["inputRequests"].items()
        answer = {"inputResponses": {key: {"action": "accept", "content": {"username": "raw"}}}}
        retry = {**answer, "requestState": result["requestState"]}
        answered = await post(2, "ask__ask_user", retry)
        again = await post(3, "ask__ask_user", retry)  # spent
        return [(r.status_code, r.headers["content-type"], _normal(r.text)) for r in (asked, answered, again)]


async def test_a_raw_2026_client_s_input_required_and_retry_are_the_sdk_s_bytes(tmp_path: Path) -> None:
    async with front(tmp_path / "full", lean=False) as (url, lane):
        full = await _raw(url)
    async with front(tmp_path / "lean", lean=True) as (url, lane):
        lean = await _raw(url)
    assert lane.took[:1] == [True], lane.took  # the asked read went the lean way
    assert lean == full
    asked, answered, again = lean
    assert '"resultType":"input_required"' in asked[2] and "who are you?" in asked[2]
    assert 'content={\\"username\\": \\"raw\\"}' in answered[2]
    assert "names no call waiting" in again[2]  # a state resumes its call once
