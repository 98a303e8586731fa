"""A task group a front hosts while it serves: work that outlives the request that started it.

A suspended 2026-07-28 call (`relay.Suspensions`) and the pinger of a lean read that outlasts the
SDK's deferral window (`lean_modern.LeanAnswers`) run in one; it ends, and cancels what still runs
in it, when the front stops serving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc


class Host:
    """`group` while `hosting()` is entered, else None (a front that is not serving)."""

    def __init__(self) -> None:
        self.group: anyio.abc.TaskGroup | None = None

    @asynccontextmanager
    async def hosting(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as group:
            self.group = group
            try:
                yield
            finally:
                self.group = None
                group.cancel_scope.cancel()


__all__ = ["Host"]
