"""Telemetry: one JSON line per decision, with every model call it took and what each cost.

Unlike the audit log (the promise that no write moves without a verdict), telemetry is for
measuring: the segment that was reviewed, the verdict, the action taken, and each model call's
prompt, completion and cached tokens and latency. Lines are flushed, not fsynced.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

import anyio


class Telemetry:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._handle: TextIO | None = None
        self._lock = anyio.Lock()

    async def record(self, kind: str, **fields: Any) -> None:
        if self.path is None:
            return
        line = json.dumps({"ts": round(time.time(), 6), "kind": kind, **fields}, default=str, ensure_ascii=False)
        async with self._lock:
            await anyio.to_thread.run_sync(self._append, line)

    def _append(self, line: str) -> None:
        if self._handle is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a", encoding="utf-8")
        self._handle.write(line + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
