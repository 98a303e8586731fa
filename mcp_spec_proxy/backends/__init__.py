"""Connections to the wrapped MCP servers.

`BackendPool` runs one supervised `Backend` per enabled server, each in its own task, so one
that fails to start, hangs or dies never blocks or breaks the others; `BackendPool.ready` says
when the proxy may start serving, without waiting for a backend that hangs in its handshake.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp.server.lowlevel import Server

from mcp_spec_proxy.backends import progress
from mcp_spec_proxy.backends.connection import Backend
from mcp_spec_proxy.backends.listing import Listing, OnListing
from mcp_spec_proxy.backends.notices import LogMessage, LogRoute, Notice, OnNotice, ResourceUpdate
from mcp_spec_proxy.backends.oauth import BackendAuth
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.errors import BackendUnavailable
from mcp_spec_proxy.prespawn import Prespawned

logger = logging.getLogger(__name__)

__all__ = [
    "Backend",
    "BackendPool",
    "Listing",
    "LogMessage",
    "LogRoute",
    "Notice",
    "OnListing",
    "OnNotice",
    "ResourceUpdate",
]


class BackendPool:
    def __init__(
        self,
        servers: dict[str, ServerConfig],
        on_listing: OnListing,
        *,
        log_dir: Path | None = None,
        in_process: dict[str, Server[Any]] | None = None,
        grace: float | None = None,
        on_notice: OnNotice | None = None,
        early: Prespawned | None = None,
        logins: Mapping[str, BackendAuth] | None = None,
    ) -> None:
        """`early` holds the stdio processes the launcher spawned before the SDK loaded (`launch.py`);
        `logins` the OAuth clients of the URL backends with `auth:` (`backends/oauth.py`), by name."""
        logins = logins or {}
        in_process = in_process or {}
        self.grace = grace
        self.backends = {
            name: Backend(
                name,
                config,
                on_listing,
                log_dir=log_dir,
                in_process=in_process.get(name),
                on_notice=on_notice,
                early=early,
                auth=logins.get(name),
            )
            for name, config in servers.items()
        }

    def connected(self) -> list[Backend]:
        """The backends connected now, by name."""
        return [self.backends[name] for name in sorted(self.backends) if self.backends[name].capabilities is not None]

    def get(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            raise BackendUnavailable(name, "is not configured") from None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every backend until cancelled; `started` once the pool is `ready()`."""
        async with anyio.create_task_group() as tg:
            for backend in self.backends.values():
                tg.start_soon(backend.run, name=f"backend:{backend.name}")
            await self.ready()
            settled = {b.name: b.first_attempt.is_set() for b in self.backends.values()}
            starting = [name for name, done in settled.items() if not done]
            status = {name: self.backends[name].status for name, done in settled.items() if done}
            unavailable = [name for name, now in status.items() if now not in ("connected", "login")]
            waiting = [name for name, now in status.items() if now == "login"]
            if starting:
                logger.warning("still starting: %s — their tools are announced when they connect", ", ".join(starting))
            if waiting:
                logger.warning(
                    "waiting for a login: %s — their tools are announced once it is done", ", ".join(waiting)
                )
            if unavailable:
                logger.warning("unavailable at start: %s", ", ".join(unavailable))
            task_status.started()

    async def ready(self) -> None:
        """Wait until every backend has connected or given up its first attempt, or, once one has,
        until the rest have gone quiet: a window (`grace`, else as long as `progress` needs to
        tell) in which none settled and our child processes neither ran nor waited to run nor
        read from disk (`progress.busy`).

        A server still starting works and is waited for; one that hangs in its handshake sleeps,
        and holds up nobody past the window, not for its `startup_timeout`. The proxy then serves
        what is ready, and the late backend's tools reach clients as a list change when it
        connects (or never, if it fails). With no backend settled there is nothing to serve yet,
        so the first is waited for."""
        pending = [b for b in self.backends.values() if not b.first_attempt.is_set()]
        if not pending:
            return
        send, receive = anyio.create_memory_object_stream[str](len(pending))
        async with anyio.create_task_group() as tg:
            for backend in pending:
                tg.start_soon(_tell_settled, backend, send.clone())
            send.close()
            with receive:
                left = len(pending)
                if left == len(self.backends):
                    await receive.receive()  # nothing to serve before the first
                    left -= 1
                before = await anyio.to_thread.run_sync(progress.snapshot)
                while left:
                    window = self.grace or (before.window if before else progress.COARSE_WINDOW_S)
                    with anyio.move_on_after(window) as quiet:
                        await receive.receive()
                        left -= 1
                    after = await anyio.to_thread.run_sync(progress.snapshot)
                    if quiet.cancelled_caught and not progress.busy(before, after, window):
                        break
                    before = after
                tg.cancel_scope.cancel()

    async def settled(self) -> None:
        """Wait until every backend has connected or given up its first attempt: for one-shot
        commands (`tools`, `run`), which hear no list change after they have looked."""
        for backend in self.backends.values():
            await backend.first_attempt.wait()


async def _tell_settled(backend: Backend, send: MemoryObjectSendStream[str]) -> None:
    with send:
        await backend.first_attempt.wait()
        await send.send(backend.name)
