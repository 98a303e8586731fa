"""The audit log: one JSON line per held call and per verdict, durable before anything moves.

Every line is flushed and fsynced before `record` returns, so the barrier can promise that a
write is only forwarded after its verdict is on disk, and a proxy killed at any moment leaves
a log whose every complete line parses.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

import anyio

from mcp_spec_proxy.errors import StateError


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle: TextIO | None = None
        self._lock = anyio.Lock()

    async def record(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ts": round(time.time(), 6), "event": event, **fields}, default=str, ensure_ascii=False)
        if self.path is None:
            return
        async with self._lock:
            # The fsync is the promise; it runs off the event loop so reads keep flowing.
            await anyio.to_thread.run_sync(self._append, line)

    def _append(self, line: str) -> None:
        try:
            if self._handle is None:
                assert self.path is not None
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = self.path.open("a", encoding="utf-8")
            self._handle.write(line + "\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise StateError(f"cannot append to audit log {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_audit(path: Path) -> list[dict[str, Any]]:
    """Every complete line of an audit log (a torn last line from a crash is skipped)."""
    events: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
