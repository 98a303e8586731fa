"""Append-only JSON Lines files: the audit log and telemetry share this one writer.

Each `record` appends one line from a worker thread, so the event loop never waits on the disk,
and returns once the line is written — and, for a `durable` log, fsynced. Concurrent records are
group-committed: one write and one fsync for every line queued meanwhile. Lines never interleave.
A writer cancelled while it commits for the others still commits their lines: no record waits on
a commit nobody runs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, TextIO

import anyio

from mcp_spec_proxy.errors import StateError

logger = logging.getLogger(__name__)


class JsonLines:
    def __init__(self, path: Path | None, *, durable: bool, tag: str) -> None:
        self.path = path
        self._durable = durable
        self._tag = tag  # the field that names each line's kind: "event" in the audit log
        self._handle: TextIO | None = None
        self._queue: list[tuple[str, _Waiter]] = []
        self._flushing = False

    async def record(self, kind: str, **fields: Any) -> None:
        """Append one line; returns once it is written (and fsynced, for a durable log)."""
        if self.path is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), self._tag: kind, **fields}, default=str, ensure_ascii=False)
        waiter = _Waiter()
        self._queue.append((line, waiter))
        if not self._flushing:
            # Group commit: whoever finds no flush running writes every queued line with one fsync,
            # so a hundred concurrent writers cost a few fsyncs, not a hundred in a row.
            self._flushing = True
            try:
                # Shielded: the lines queued behind this writer wait on it alone. Cancelled (its
                # client left), it still commits them, or their writers wait forever: among them
                # the gate's shielded `abandoned` line, which a proxy's exit then waits on.
                with anyio.CancelScope(shield=True):
                    await self._commit_queued()
            finally:
                self._flushing = False
        await waiter.wait()

    async def _commit_queued(self) -> None:
        """Write every queued line, a batch per thread hop, until the queue stays empty."""
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                await anyio.to_thread.run_sync(self._append, [text for text, _ in batch])
            except Exception as exc:  # whatever the write raised, its writers hear it: none waits on
                failure = exc if isinstance(exc, StateError) else StateError(f"cannot append to {self.path}: {exc}")
                for _, each in batch:
                    each.fail(failure)
            else:
                for _, each in batch:
                    each.done.set()

    def note(self, kind: str, **fields: Any) -> None:
        """Append one line without waiting for the disk (reads): it rides the next group commit.

        With no commit running the line is written (not fsynced) at once from the event loop: a
        small buffered write, never a thread hop; during a commit it joins the queue.
        """
        if self.path is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), self._tag: kind, **fields}, default=str, ensure_ascii=False)
        if self._flushing:
            self._queue.append((line, _Waiter()))
            return
        try:
            self._write([line], sync=False)
        except StateError as exc:
            logger.warning("%s", exc)

    def _append(self, lines: list[str]) -> None:
        self._write(lines, sync=self._durable)

    def _write(self, lines: list[str], *, sync: bool) -> None:
        assert self.path is not None
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # A lone surrogate cannot be UTF-8; written as `\udXXX` it is the JSON escape for itself
                # (it can only sit inside a JSON string), so the line stays valid and nothing raises.
                self._handle = self.path.open("a", encoding="utf-8", errors="backslashreplace")
            self._handle.write("".join(line + "\n" for line in lines))
            self._handle.flush()
            if sync:
                os.fsync(self._handle.fileno())
        except OSError as exc:
            raise StateError(f"cannot append to {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


class _Waiter:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: StateError | None = None

    def fail(self, error: StateError) -> None:
        self.error = error
        self.done.set()

    async def wait(self) -> None:
        await self.done.wait()
        if self.error is not None:
            raise self.error


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON Lines file (a torn last line from a crash is skipped)."""
    events: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
