"""A backend's malformed message heard on a lean read's stream (`backends/lean_http.py`) is answered as
the SDK's own dispatcher answers it, and the read goes on: a request with params its schema refuses gets
INVALID_PARAMS (no pydantic text on the wire), a malformed notification is dropped, and an SSE event that
is not UTF-8 is dropped instead of ending the read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp_types import INVALID_PARAMS

from mcp_spec_proxy.backends.lean_http import LeanLeg, _Stream
from tests.fixtures import toy_server

pytestmark = pytest.mark.anyio


class Posted:
    """The guard's part the leg posts its replies through: what it posted, kept."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def build_request(self, method: str, url: str, *, content: bytes, headers: dict[str, str]) -> httpx2.Request:
        return httpx2.Request(method, url, content=content, headers=headers)

    async def send(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append(json.loads(request.content))
        return httpx2.Response(202, request=request)


async def test_a_malformed_question_is_answered_invalid_params_and_a_malformed_notice_dropped(tmp_path: Path) -> None:
    async with Client(toy_server.build(tmp_path / "ledger"), mode="legacy") as client:
        posted = Posted()
        leg = LeanLeg(posted, "http://backend/mcp", "s1", "2025-11-25", client)  # type: ignore[arg-type]
        await leg._hear({"jsonrpc": "2.0", "id": "q1", "method": "elicitation/create", "params": {"bogus": 1}})
        await leg._hear({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"bogus": 1}})
    assert posted.sent == [
        {
            "jsonrpc": "2.0",
            "id": "q1",
            "error": {"code": INVALID_PARAMS, "message": "Invalid request parameters", "data": ""},
        }
    ]


def test_an_sse_event_that_is_not_utf8_is_dropped() -> None:
    stream = _Stream()
    assert stream.parse(b'id: 7\ndata: {"a": "\xff\xfe"}') is None
    assert stream.parse(b'id: 8\ndata: {"jsonrpc": "2.0", "id": 1, "result": {}}') == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {},
    }
    assert stream.last_id == "8"
