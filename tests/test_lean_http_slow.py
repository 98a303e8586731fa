"""A 2026-07-28 read that outlasts the SDK's deferral window, on the lean HTTP lane and on the SDK's path.

On a front that answers SSE, the SDK's 2026-07-28 writer answers a request that is still running
after `_SSE_PING_INTERVAL` with an SSE stream: a `: ping` comment at once and at each interval,
then the answer as one event. The lane must answer such a read with the same bytes. The backend is
a real process (tests/fixtures/slow_server.py) whose read answers only when the test writes to a
named pipe, which it does once the client has seen a ping: no clock decides the outcome.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp.server import _streamable_http_modern as sdk_modern

from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts import lean_http, lean_modern
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.lean_spy import spied_install
from tests.test_lean_http import BOTH, ENVELOPE, MODERN, call

pytestmark = pytest.mark.anyio

SLOW = Path(__file__).parent / "fixtures" / "slow_server.py"
PINGS = re.compile(rb"(: ping\r\n\r\n)+")
HEADERS = ("content-type", "cache-control", "connection", "x-accel-buffering")
ROUTING = {  # a 2026-07-28 request's headers for `slow__slow`
    "accept": BOTH,
    "content-type": "application/json",
    "mcp-protocol-version": MODERN,
    "mcp-method": "tools/call",
    "mcp-name": "slow__slow",
}


@asynccontextmanager
async def front(
    tmp_path: Path, lean: bool, release: Path, cancels: Path | None = None
) -> AsyncIterator[tuple[str, list[bool]]]:
    """A real HTTP front before the slow server (`cancels`: where it notes a read cancelled); what the
    lane answered itself."""
    env = {"SLOW_CANCELS": str(cancels)} if cancels is not None else {}
    backend = {"command": sys.executable, "args": [str(SLOW), str(release)], "env": env}
    raw: dict[str, Any] = {"servers": {"slow": backend}, "review": {"default": "deny"}}
    took: list[bool] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lean_http, "install", spied_install(lean, took))
        async with (
            running_proxy(ProxyConfig.model_validate(raw), StatePaths(tmp_path / "state")) as proxy,
            anyio.create_task_group() as tg,
        ):
            mcp = McpFront(proxy)
            port = await tg.start(lambda task_status: serve_http(mcp, "127.0.0.1", 0, task_status=task_status))
            yield f"http://127.0.0.1:{port}/mcp", took
            tg.cancel_scope.cancel()


async def _slow_read(url: str, release: Path) -> tuple[int, dict[str, str], bytes]:
    """A 2026-07-28 read of `slow__slow` as sent, released once a ping has come (or at once, when
    its answer has started without one)."""
    async with (
        httpx.AsyncClient(timeout=30) as http,
        http.stream("POST", url, json=call(1, "slow__slow", {}, ENVELOPE), headers=ROUTING) as response,
    ):
        body, released = b"", False
        async for chunk in response.aiter_raw():
            body += chunk
            if not released and PINGS.search(body):
                await anyio.to_thread.run_sync(release.write_text, "go\n")
                released = True
        headers = {name: response.headers[name] for name in HEADERS if name in response.headers}
        return response.status_code, headers, body


async def test_a_slow_2026_read_answers_with_the_sdk_s_pings_and_stream(tmp_path: Path) -> None:
    """The window shortened for the SDK's writer and the lane's alike (the lane's is the SDK's)."""
    assert lean_modern.PING_S == sdk_modern._SSE_PING_INTERVAL
    answers = {}
    for lean in (False, True):
        release = tmp_path / f"release-{lean}"
        os.mkfifo(release)
        with pytest.MonkeyPatch.context() as patch, anyio.fail_after(60):
            patch.setattr(sdk_modern, "_SSE_PING_INTERVAL", 0.2)
            patch.setattr(lean_modern, "PING_S", 0.2)
            async with front(tmp_path / str(lean), lean, release) as (url, took):
                status, headers, body = await _slow_read(url, release)
            assert took == ([True] if lean else []), took
        body = re.sub(rb'"' + re.escape(CALL_META.encode()) + rb'":"[0-9a-f]+"', b'"CALL"', body)
        answers[lean] = (status, headers, PINGS.sub(b": ping\r\n\r\n", body))  # as many as the wait took
    assert answers[True] == answers[False]
    status, headers, body = answers[True]
    assert (status, headers["content-type"]) == (200, "text/event-stream")
    assert body.startswith(b": ping\r\n\r\n") and b"done: go" in body


async def test_a_2026_client_that_leaves_mid_read_cancels_it_at_the_backend(tmp_path: Path) -> None:
    """As the SDK's path watches a request for its client's disconnect, the lane does once a read has
    run `WATCH_S` (shortened here): the read is cancelled and the backend told, nothing answered."""
    release, cancels = tmp_path / "release", tmp_path / "cancels"
    os.mkfifo(release)
    with pytest.MonkeyPatch.context() as patch, anyio.fail_after(60):
        patch.setattr(lean_modern, "WATCH_S", 0.1)
        async with front(tmp_path / "lean", True, release, cancels) as (url, took):
            async with httpx.AsyncClient(timeout=30) as http, anyio.create_task_group() as tg:
                tg.start_soon(lambda: http.post(url, json=call(1, "slow__slow", {}, ENVELOPE), headers=ROUTING))
                await anyio.sleep(1.0)  # the read waits at the backend, watched
                tg.cancel_scope.cancel()  # the client leaves: its connection closes
            while not cancels.exists():  # noqa: ASYNC110 -- the backend's own note, in its own process
                await anyio.sleep(0.05)
            assert took == [True], took
            # The cancelled read's thread still waits at the pipe: this line is its. Then another read goes.
            await anyio.to_thread.run_sync(release.write_text, "late\n")
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: anyio.to_thread.run_sync(release.write_text, "go\n"))
                async with httpx.AsyncClient(timeout=30) as http:
                    answer = await http.post(url, json=call(2, "slow__slow", {}, ENVELOPE), headers=ROUTING)
    assert cancels.read_text() == "slow\n"
    assert "done: go" in answer.text
