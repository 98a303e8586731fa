"""What a client reads directly from a looser HTTP server, the backend session reads too: several
messages in one JSON body, a 2026-07-28 result without `resultType`, a listen stream sent as JSON
lines (the conformance suite's reference server does each; measured behind the proxy in
docs/BENCHMARKS.md, Conformance against the reference server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2
import pytest

from mcp_spec_proxy.backends.events import Lines
from mcp_spec_proxy.backends.http import _lenient

pytestmark = pytest.mark.anyio

PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "t", "progress": 50}}
RESULT = {"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "done"}]}}


def events(body: bytes) -> list[dict[str, object]]:
    return [json.loads(line.removeprefix(b"data: ")) for line in body.splitlines() if line.startswith(b"data: ")]


def test_messages_one_per_line_in_a_json_body_become_the_events_they_are() -> None:
    body = json.dumps(PROGRESS).encode() + b"\n" + json.dumps(RESULT).encode()
    converted, stream = _lenient(body, modern=True)
    assert stream
    got = events(converted)
    assert got[0] == PROGRESS
    assert got[1]["id"] == 7 and got[1]["result"] == {**RESULT["result"], "resultType": "complete"}  # type: ignore[dict-item]


def test_a_modern_result_without_result_type_is_complete_and_a_handshake_one_passes_unchanged() -> None:
    body = json.dumps(RESULT).encode()
    modern, stream = _lenient(body, modern=True)
    assert not stream and json.loads(modern)["result"]["resultType"] == "complete"
    assert _lenient(body, modern=False) == (body, False)


def test_what_is_not_json_passes_unchanged() -> None:
    assert _lenient(b"<html>oops</html>", modern=True) == (b"<html>oops</html>", False)


class Chunks(httpx2.AsyncByteStream):
    def __init__(self, *chunks: bytes) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


async def read(stream: Lines) -> list[bytes]:
    return [event async for event in stream]


async def test_a_listen_stream_of_json_lines_is_passed_on_line_by_line_whatever_the_chunks() -> None:
    ack = b'{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{}}'
    change = b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}'
    stream = Lines(Chunks(ack[:10], ack[10:] + b"\n" + change[:5], change[5:] + b"\n"), 1000, lambda n: b"big")
    assert await read(stream) == [
        b"event: message\ndata: " + ack + b"\n\n",
        b"event: message\ndata: " + change + b"\n\n",
    ]


async def test_a_line_over_the_bound_is_never_kept_and_is_told_as_oversized() -> None:
    stream = Lines(Chunks(b"x" * 600, b"y" * 600 + b"\n", b'{"ok":1}\n'), 1000, lambda n: f"over:{n}".encode())
    assert await read(stream) == [b"over:1200", b'event: message\ndata: {"ok":1}\n\n']
