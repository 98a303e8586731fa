"""The audit log: one JSON line per held call and per verdict, durable before anything moves.

Every line is flushed and fsynced before `record` returns, so the barrier can promise that a
write is only forwarded after its verdict is on disk, and a proxy killed at any moment leaves
a log whose every complete line parses (`read_audit` skips a torn last line).

A line that could not be written once its call was settled (the `forwarded` of a call that ran,
a `blocked`, an `abandoned`) is not lost: `later` keeps it, and `run` writes it as soon as the
disk takes lines again (after the next line that is written, or every `RETRY_S`), with one
warning while it waits; a proxy that stops first logs the lines it still holds.

`claim` binds a client's idempotency key to the one call of its session that may be forwarded
with it; this log remembers the keys for as long as the process runs (the last `MAX_KEYS`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import anyio

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.observe.jsonl import JsonLines, read_lines

logger = logging.getLogger(__name__)

RETRY_S = 5.0
MAX_KEYS = 100_000  # idempotency keys remembered by one process; past this the oldest are forgotten


class AuditSink(Protocol):
    """Where the gate writes its audit lines: this file (`AuditLog`) or a shared table (`store/`)."""

    async def record(self, kind: str, **fields: Any) -> None:
        """Durable before it returns; raises `StateError` when it cannot be (the write is then refused)."""

    def note(self, kind: str, **fields: Any) -> None:
        """Best effort, never waits (reads): a failure is logged, never raised."""

    def later(self, kind: str, **fields: Any) -> None:
        """A line `record` could not write about a call already settled: kept, and written in the
        background until it is (or the process stops), with one warning. Never raises."""

    async def claim(self, session: str, key: str, call: str, **fields: Any) -> str | None:
        """Bind idempotency key `key` (a digest) of `session` to `call`, durably (its `claimed` line
        carries `fields` too: who asked), unless another call holds it: then that call's id, and
        nothing is written. Raises `StateError`."""

    async def holder(self, session: str, key: str) -> str | None:
        """The call that holds idempotency key `key` (a digest) of `session`, claimed on any replica the
        sink serves; None when none does yet, or when it cannot be asked now (never raises)."""

    def close(self) -> None: ...


class AuditLog(JsonLines):
    def __init__(self, path: Path | None) -> None:
        super().__init__(path, durable=True, tag="event")
        self._late: list[tuple[str, dict[str, Any]]] = []
        self._wake = anyio.Event()
        self._keys: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._writing = anyio.Lock()  # one writer of the kept lines: none is written twice

    async def record(self, kind: str, **fields: Any) -> None:
        await super().record(kind, **fields)
        if self._late:
            self._wake.set()  # the disk takes lines again: the kept ones go now

    def later(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        if not self._late:
            logger.warning("audit lines of settled calls are kept in memory until %s can be written", self.path)
        self._late.append((kind, {**fields, "late": True, "at": round(time.time(), 6)}))
        self._wake.set()

    async def run(self) -> None:
        """Write the kept lines whenever the disk may take them again; for as long as the process runs."""
        while True:
            with anyio.move_on_after(RETRY_S):
                await self._wake.wait()
            self._wake = anyio.Event()
            await self.write_late()

    async def write_late(self) -> None:
        """Write the kept lines now, in order; those the disk still refuses stay kept."""
        async with self._writing:
            if not self._late:
                return
            while self._late:
                kind, fields = self._late[0]
                try:
                    await super().record(kind, **fields)
                except StateError:
                    return  # kept: the next attempt comes with the next line written, or after RETRY_S
                self._late.pop(0)
            logger.warning("the kept audit lines are written to %s", self.path)

    async def claim(self, session: str, key: str, call: str, **fields: Any) -> str | None:
        slot = (session, key)
        holder = self._keys.get(slot)
        if holder is not None:
            self._keys.move_to_end(slot)
            return holder
        self._keys[slot] = call  # before the await: a concurrent claim of the same key sees it
        while len(self._keys) > MAX_KEYS:
            self._keys.popitem(last=False)
        try:
            await super().record("claimed", call=call, session=session, key=key, **fields)
        except StateError:
            if self._keys.get(slot) == call:
                del self._keys[slot]  # nothing was forwarded under it: the key is free again
            raise
        return None

    async def holder(self, session: str, key: str) -> str | None:
        return self._keys.get((session, key))

    def close(self) -> None:
        for kind, fields in self._late:
            logger.error("audit line never written (the proxy stopped first): %s %s", kind, fields)
        self._late.clear()
        super().close()


read_audit = read_lines
