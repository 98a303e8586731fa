"""Connections to the wrapped MCP servers.

`BackendPool` runs one supervised `Backend` per enabled server, each in its own task, so one
that fails to start, hangs or dies never blocks or breaks the others.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
from mcp.server import Server

from mcp_spec_proxy.backends.connection import Backend, Listing, OnListing
from mcp_spec_proxy.config import ServerConfig
from mcp_spec_proxy.errors import BackendUnavailable

logger = logging.getLogger(__name__)

__all__ = ["Backend", "BackendPool", "Listing", "OnListing"]


class BackendPool:
    def __init__(
        self,
        servers: dict[str, ServerConfig],
        on_listing: OnListing,
        *,
        log_dir: Path | None = None,
        in_process: dict[str, Server[Any]] | None = None,
    ) -> None:
        in_process = in_process or {}
        self.backends = {
            name: Backend(name, config, on_listing, log_dir=log_dir, in_process=in_process.get(name))
            for name, config in servers.items()
        }

    def get(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            raise BackendUnavailable(name, "is not configured") from None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every backend until cancelled; `started` once each has connected or failed once."""
        async with anyio.create_task_group() as tg:
            for backend in self.backends.values():
                tg.start_soon(backend.run, name=f"backend:{backend.name}")
            await self.settled()
            unavailable = [b.name for b in self.backends.values() if b.status != "connected"]
            if unavailable:
                logger.warning("unavailable at start: %s", ", ".join(unavailable))
            task_status.started()

    async def settled(self) -> None:
        """Wait until every backend has connected or given up its first attempt."""
        for backend in self.backends.values():
            await backend.first_attempt.wait()
