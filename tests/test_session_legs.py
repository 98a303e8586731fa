"""Each client session its own backend session: two clients of the HTTP front, with different roots
and capabilities, on one URL backend that keeps state per session (npm server-everything, which
caches each session's roots and lists `get-roots-list` only to clients that declared roots).

The proxy runs its HTTP front in this process; the clients are real `mcp` clients over HTTP in the
handshake era (the era whose backend sessions keep state).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from pydantic import FileUrl

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import Proxy, StatePaths, running_proxy
from tests import backends
from tests.harness import spawned, stdio, text_of, toy
from tests.test_remote_backends import everything_over

pytestmark = pytest.mark.anyio


def roots_of(uri: str) -> Any:
    async def list_roots(context: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri), name=uri.rsplit("/", 1)[-1])])

    return list_roots


@asynccontextmanager
async def front_over(backend: dict[str, Any], tmp_path: Path) -> AsyncIterator[tuple[Proxy, str]]:
    config = ProxyConfig.model_validate({"servers": {"remote": backend}, "review": {"default": "deny"}})
    async with running_proxy(config, StatePaths(tmp_path)) as proxy, anyio.create_task_group() as tg:
        front = McpFront(proxy)
        port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
        yield proxy, f"http://127.0.0.1:{port}/mcp"
        tg.cancel_scope.cancel()


async def test_two_clients_with_different_roots_each_see_their_own(tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with everything_over("streamableHttp") as url, front_over({"url": url}, tmp_path) as (proxy, front):
            async with (
                Client(front, mode="legacy", list_roots_callback=roots_of("file:///projects/alpha")) as alpha,
                Client(front, mode="legacy", list_roots_callback=roots_of("file:///projects/beta")) as beta,
            ):
                seen_by_alpha = text_of(await alpha.call_tool("remote__get-roots-list", {}))
                seen_by_beta = text_of(await beta.call_tool("remote__get-roots-list", {}))
                legs = proxy.backends.get("remote").sessions
                assert legs is not None
                assert (legs.open, legs.opened) == (2, 2)
                again = text_of(await alpha.call_tool("remote__get-roots-list", {}))
                assert legs.opened == 2  # once per client session, never per request
            with anyio.fail_after(10):
                while legs.open:  # noqa: ASYNC110 (a count the proxy keeps; no event marks it)
                    await anyio.sleep(0.05)  # each client's session ended: its backend session closes with it
    assert "file:///projects/alpha" in seen_by_alpha and "beta" not in seen_by_alpha
    assert "file:///projects/beta" in seen_by_beta and "alpha" not in seen_by_beta
    assert "file:///projects/alpha" in again


async def test_a_client_that_declared_no_roots_is_not_asked_for_them(tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with (
            everything_over("streamableHttp") as url,
            front_over({"url": url}, tmp_path) as (_, front),
            Client(front, mode="legacy") as plain,
        ):
            result = await plain.call_tool("remote__get-roots-list", {})
    # Directly, a client without roots is never offered the tool; its own backend session was told
    # the client declared none, so the server refuses it as it would directly.
    assert result.is_error
    assert "not found" in text_of(result).lower() or "unknown" in text_of(result).lower()


async def test_isolation_shared_keeps_one_backend_session_for_every_client(tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with (
            everything_over("streamableHttp") as url,
            front_over({"url": url, "isolation": "shared"}, tmp_path) as (proxy, front),
            Client(front, mode="legacy", list_roots_callback=roots_of("file:///projects/alpha")) as alpha,
        ):
            await alpha.call_tool("remote__get-roots-list", {})
            assert proxy.backends.get("remote").sessions is None


async def test_a_stdio_backend_under_per_session_gives_each_http_client_session_its_own_process(tmp_path: Path) -> None:
    ledger = tmp_path / "rec"
    with anyio.fail_after(90):
        async with front_over(toy(ledger, isolation="per_session"), tmp_path / "state") as (proxy, front):
            async with (
                Client(front, mode="legacy") as alpha,
                Client(front, mode="legacy") as beta,
            ):
                await alpha.call_tool("remote__echo", {"text": "a"})
                await beta.call_tool("remote__echo", {"text": "b"})
                await alpha.call_tool("remote__echo", {"text": "a again"})
                legs = proxy.backends.get("remote").sessions
                assert legs is not None
                assert (legs.open, legs.opened) == (2, 2)
            with anyio.fail_after(10):
                while legs.open:  # noqa: ASYNC110 (a count the proxy keeps; no event marks it)
                    await anyio.sleep(0.05)  # each process ends with its client's session


def changing_roots(current: list[str]) -> Any:
    async def list_roots(context: ClientRequestContext) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=FileUrl(uri)) for uri in current])

    return list_roots


async def until_seen(client: Client, tool: str, text: str) -> str:
    with anyio.fail_after(20):
        while text not in (seen := text_of(await client.call_tool(tool, {}))):  # noqa: ASYNC110 (polls the backend)
            await anyio.sleep(0.1)
    return seen


async def test_a_clients_roots_change_reaches_its_own_backend_session_and_its_logs_reach_it_alone(
    tmp_path: Path,
) -> None:
    roots = ["file:///projects/alpha"]
    heard: dict[str, list[str]] = {"alpha": [], "beta": []}
    updated = anyio.Event()

    def hearing(name: str) -> Any:
        async def messages(message: Any) -> None:
            if isinstance(message, types.LoggingMessageNotification):
                heard[name].append(str(message.params.data))
                if name == "alpha" and "Roots updated" in str(message.params.data):
                    updated.set()

        return messages

    with anyio.fail_after(90):
        async with (
            everything_over("streamableHttp") as url,
            front_over({"url": url}, tmp_path) as (_, front),
            Client(
                front, mode="legacy", list_roots_callback=changing_roots(roots), message_handler=hearing("alpha")
            ) as alpha,
            Client(
                front, mode="legacy", list_roots_callback=roots_of("file:///b"), message_handler=hearing("beta")
            ) as beta,
        ):
            debug = types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug"))
            await alpha.session.send_request(debug, types.EmptyResult)
            await beta.session.send_request(debug, types.EmptyResult)
            await until_seen(alpha, "remote__get-roots-list", "file:///projects/alpha")
            await until_seen(beta, "remote__get-roots-list", "file:///b")
            updated = anyio.Event()
            beta_before = len(heard["beta"])
            roots[:] = ["file:///projects/gamma"]
            await alpha.session.send_notification(types.RootsListChangedNotification())
            # The backend asks its session's client again, outside any call, and says so in a log line.
            await updated.wait()
            seen = text_of(await alpha.call_tool("remote__get-roots-list", {}))
    assert "file:///projects/gamma" in seen and "alpha" not in seen
    assert heard["beta"][beta_before:] == []  # A's backend session's log line is A's alone


async def test_the_stdio_fronts_one_client_is_asked_for_its_roots_outside_any_call(tmp_path: Path) -> None:
    roots = ["file:///projects/alpha"]
    updates: list[str] = []
    updated = anyio.Event()

    async def messages(message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification) and "Roots updated" in str(message.params.data):
            updates.append(str(message.params.data))
            updated.set()

    config = {"servers": {"remote": stdio(backends.everything())}, "review": {"default": "deny"}}
    async with spawned(config, tmp_path, list_roots=changing_roots(roots), messages=messages) as client:
        debug = types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug"))
        await client.session.send_request(debug, types.EmptyResult)
        await until_seen(client, "remote__get-roots-list", "file:///projects/alpha")
        updated = anyio.Event()
        roots[:] = ["file:///projects/gamma"]
        await client.session.send_notification(types.RootsListChangedNotification())
        with anyio.fail_after(20):
            await updated.wait()  # the backend asked, outside any call, and was answered
        seen = text_of(await client.call_tool("remote__get-roots-list", {}))
    assert "file:///projects/gamma" in seen and "alpha" not in seen
