"""Append-only JSON Lines files: the audit log and telemetry share this one writer.

Each `record` appends one line and flushes it from a worker thread, so the event loop never
waits on the disk; a `durable` log also fsyncs before `record` returns. Records are serialised
under a lock, so lines never interleave.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

import anyio

from mcp_spec_proxy.errors import StateError


class JsonLines:
    def __init__(self, path: Path | None, *, durable: bool, tag: str) -> None:
        self.path = path
        self._durable = durable
        self._tag = tag  # the field that names each line's kind: "event" in the audit log
        self._handle: TextIO | None = None
        self._lock = anyio.Lock()

    async def record(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), self._tag: kind, **fields}, default=str, ensure_ascii=False)
        async with self._lock:
            await anyio.to_thread.run_sync(self._append, line)

    def _append(self, line: str) -> None:
        assert self.path is not None
        try:
            if self._handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._handle = self.path.open("a", encoding="utf-8")
            self._handle.write(line + "\n")
            self._handle.flush()
            if self._durable:
                os.fsync(self._handle.fileno())
        except OSError as exc:
            raise StateError(f"cannot append to {self.path}: {exc.strerror}") from None

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a JSON Lines file (a torn last line from a crash is skipped)."""
    events: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
