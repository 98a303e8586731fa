"""A proxy with its approval console served on a real loopback port, for the console tests.

`console_world(...)` runs the proxy in this process (the toy backend as its in-process twin, its
ledger the ground truth), serves the console on 127.0.0.1:0 and yields its link; `calling(...)`
starts a client's call in the background so a test can decide it on the page meanwhile.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from mcp import Client

from mcp_spec_proxy.fronts.console import Console, serve_console
from mcp_spec_proxy.fronts.console.overwrite import OldContent
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.review.console import ConsoleQueue, Pending
from tests.harness import Proxied, proxied, toy


@dataclass
class World:
    p: Proxied
    url: str  # the link with its secret
    queue: ConsoleQueue
    ledger: Path
    tg: anyio.abc.TaskGroup

    @property
    def origin(self) -> str:
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def secret(self) -> str:
        return self.url.split("token=", 1)[1]

    async def held(self, count: int = 1) -> list[Pending]:
        """Wait until `count` calls wait on the console."""
        with anyio.fail_after(30):
            version = self.queue.version
            while len(self.queue.pending()) < count:
                version = await self.queue.changed_since(version)
        return self.queue.pending()


@dataclass
class Call:
    result: types.CallToolResult | None = None
    done: anyio.Event = field(default_factory=anyio.Event)
    progress: list[str] = field(default_factory=list)

    async def wait(self) -> types.CallToolResult:
        with anyio.fail_after(30):
            await self.done.wait()
        assert self.result is not None
        return self.result


def calling(
    world: World, tool: str, arguments: dict[str, Any], *, progress: bool = False, client: Client | None = None
) -> Call:
    call = Call()
    client = client or world.p.client

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        call.progress.append(message or "")

    async def run() -> None:
        call.result = await client.call_tool(tool, arguments, progress_callback=heard if progress else None)
        call.done.set()

    world.tg.start_soon(run)
    return call


@asynccontextmanager
async def another_session(world: World) -> AsyncIterator[Client]:
    """A second client of the same proxy, in a session of its own: one session's writes wait their
    turn (`sessions/barrier.py`), so calls waiting on the console side by side come from two sessions."""
    async with Client(McpFront(world.p.proxy).server) as client:
        yield client


@asynccontextmanager
async def console_world(
    tmp_path: Path,
    review: dict[str, Any] | None = None,
    leash: dict[str, Any] | None = None,
    *,
    mode: str = "legacy",
    server: str = "toy",
    servers: dict[str, Any] | None = None,
) -> AsyncIterator[World]:
    """`servers` replaces the toy (`server`: its name) with other backends."""
    ledger = tmp_path / "ledger"
    config: dict[str, Any] = {
        "servers": servers or {server: toy(ledger)},
        "review": {"default": "console", "timeout": 60, **(review or {})},
    }
    if leash is not None:
        config["leash"] = leash
    async with proxied(config, tmp_path / "state", twins=True, mode=mode) as p:
        queue = p.proxy.console
        assert queue is not None
        async with anyio.create_task_group() as tg:
            site = Console(queue, p.proxy.store.read_audit, p.proxy.leash, OldContent(p.proxy.gate, p.proxy.catalog))
            url = await tg.start(lambda task_status: serve_console(site, "127.0.0.1", 0, task_status=task_status))
            yield World(p, url, queue, ledger, tg)
            tg.cancel_scope.cancel()
