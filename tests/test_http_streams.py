"""A streamable HTTP backend's streams behind the proxy: big answers, events in the middle of a
call, and a call's stream that ended before its answer.

The backend is a real Python SDK server process on a free port (`tests/fixtures/streaming_server.py`):
its events end in `\\r\\n\\r\\n` and it sends no keep-alive pings, so an event the proxy held back
until more bytes came would never arrive.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCError

from mcp_spec_proxy.backends.events import Frames
from mcp_spec_proxy.backends.http import GuardedClient
from mcp_spec_proxy.backends.raw import Oversized
from mcp_spec_proxy.errors import RESULT_TOO_LARGE
from tests.dropping import Cutter
from tests.harness import ERAS, call_error, proxied, text_of

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).parent / "fixtures" / "streaming_server.py"
SERVING = b"serving streamable HTTP on "


@asynccontextmanager
async def streaming_server() -> AsyncIterator[str]:
    """The streaming fixture on a free port; yields its URL once it listens."""
    process = await anyio.open_process([sys.executable, str(SERVER), "--http", "0"])
    async with process:
        assert process.stderr is not None
        seen = b""
        with anyio.fail_after(30):
            async for chunk in process.stderr:
                seen += chunk
                if SERVING in seen and seen.endswith(b"\n"):
                    break
        try:
            yield seen.split(SERVING, 1)[1].split()[0].decode()
        finally:
            process.terminate()


def served(url: str, **extra: object) -> dict[str, object]:
    return {"servers": {"s": {"url": url, **extra}}, "review": {"default": "allow"}}


@pytest.mark.parametrize("mode", ERAS)
async def test_a_10_mb_result_from_an_http_backend_arrives_whole_and_one_over_max_result_bytes_is_withheld(
    tmp_path: Path, mode: str
) -> None:
    async with streaming_server() as url, proxied(served(url, max_result_bytes=12_000_000), tmp_path, mode=mode) as p:
        with anyio.fail_after(60):
            whole = await p.client.call_tool("s__big", {"size": 10_000_000})
            over = await call_error(p.client, "s__big", {"size": 13_000_000})
            # Past the transport's bound (1.5 times the cap): read to its end, never held.
            far_over = await call_error(p.client, "s__big", {"size": 20_000_000})
            after = await p.client.call_tool("s__echo", {"text": "still here"})
    assert text_of(whole) == "x" * 10_000_000
    assert over.code == far_over.code == RESULT_TOO_LARGE
    assert over.message.startswith("backend 's' returned too much from big (13.0 MB), more than max_result_bytes")
    assert far_over.message.startswith("backend 's' returned too much from big (20.0 MB), more than max_result_bytes")
    assert text_of(after) == "still here"


async def test_progress_from_an_http_backend_reaches_the_client_while_the_call_runs(tmp_path: Path) -> None:
    # The backend answers only once released, and the client releases it only on hearing its
    # progress: a progress the proxy held back would leave the call waiting for ever.
    heard: list[str] = []
    progressed = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        heard.append(f"progress {progress:g}/{total:g}: {message}")
        progressed.set()

    async with streaming_server() as url, proxied(served(url), tmp_path) as p:

        async def release() -> None:
            await progressed.wait()
            heard.append("released")
            await p.client.call_tool("s__release", {})

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(release)
                result = await p.client.call_tool("s__progress_then_wait", {}, progress_callback=on_progress)
                heard.append(text_of(result))
    assert heard == ["progress 1/2: started", "released", "done after release"]


async def test_a_call_whose_http_stream_ends_before_its_answer_is_resumed_and_answered(tmp_path: Path) -> None:
    # A handshake-era leg: its session is what a GET with Last-Event-ID resumes in (a 2026-07-28
    # request that cannot be asked anything may be answered with plain JSON, which has no events).
    async with streaming_server() as url, anyio.create_task_group() as tg:
        # The connection of the call carrying "cut-here" is cut inside its answer, once the
        # backend has sent it: only a GET with Last-Event-ID can still fetch it.
        cutter = Cutter(int(httpx2.URL(url).port or 0), b"cut-here", cut="mid-answer")
        relay = await tg.start(cutter.serve)
        config = served(f"http://127.0.0.1:{relay}/mcp", max_result_bytes=1_000_000)
        async with proxied(config, tmp_path) as p:
            with anyio.fail_after(30):
                cut = await p.client.call_tool("s__echo", {"text": "cut-here"})
                closed = await p.client.call_tool("s__drop_then_answer", {})  # the backend closes it
                # An answer past the bound on the resumed stream is refused as on the first one.
                too_big = await call_error(p.client, "s__drop_then_answer", {"size": 2_000_000})
        tg.cancel_scope.cancel()
    assert cutter.cuts == 1
    assert text_of(cut) == "cut-here"
    assert text_of(closed) == "answered after the drop"
    assert too_big.code == RESULT_TOO_LARGE and "returned too much from drop_then_answer (2.0 MB)" in too_big.message


def _lf(data: bytes) -> bytes:
    """`data` with every line end written `\\n`, as an SSE parser reads it."""
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_each_sse_event_is_passed_on_as_soon_as_its_blank_line_arrives(ending: bytes) -> None:
    events = [ending.join([b"id: 1", b"event: message", b'data: {"n": 1}']), b'data: {"n": 2}', b": ping"]
    body = b"".join(event + ending + ending for event in events)
    # A blank line `\r\n` is known once its `\r` is in: the `\n` may never come (`\r` alone ends a line).
    known = [body.index(event) + len(event) + 2 * len(ending) - (ending == b"\r\n") for event in events]
    for cut in range(1, len(body)):
        frames = Frames(limit=1000)
        first = frames.feed(body[:cut])
        assert all(isinstance(event, bytes) for event in first)
        ended = [_lf(event) + b"\n\n" for event, at in zip(events, known, strict=True) if at <= cut]
        assert [_lf(bytes(event)) for event in first] == ended, cut
        rest = frames.feed(body[cut:])
        assert _lf(b"".join(bytes(event) for event in first + rest)) == _lf(body), cut


def test_an_sse_event_over_the_bound_is_counted_not_kept() -> None:
    frames = Frames(limit=100)
    small, big = b"data: ok\r\n\r\n", b"data: " + b"y" * 1000 + b"\r\n\r\n"
    body = small + big + small
    passed: list[bytes | int] = []
    for at in range(0, len(body), 7):
        passed += frames.feed(body[at : at + 7])
    assert passed == [small, len(big), small]
    assert frames.rest() == b""


async def test_a_json_answer_over_the_bound_is_read_to_its_end_and_answered_with_the_proxys_mark() -> None:
    answer = json.dumps({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "z" * 500}]}})

    def backend(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "application/json"}, content=answer.encode())

    async with GuardedClient(limit=100, transport=httpx2.MockTransport(backend)) as http:
        sent = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "big"}}
        response = await http.send(http.build_request("POST", "http://backend/mcp", json=sent), stream=True)
        body = json.loads(await response.aread())
        error = JSONRPCError.model_validate(body)
        restored = http.restore(SessionMessage(error))
        again = http.restore(SessionMessage(error))  # the mark is taken back once
    assert response.status_code == 502 and error.id == 7 and error.error.code == RESULT_TOO_LARGE
    assert isinstance(restored, SessionMessage) and isinstance(restored.message, JSONRPCError)
    assert restored.message.error.data == Oversized(len(answer), 100)
    assert isinstance(again, SessionMessage) and again.message == error
