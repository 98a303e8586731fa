"""The audit log: one JSON line per held call and per verdict, durable before anything moves.

Every line is flushed and fsynced before `record` returns, so the barrier can promise that a
write is only forwarded after its verdict is on disk, and a proxy killed at any moment leaves
a log whose every complete line parses (`read_audit` skips a torn last line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from mcp_spec_proxy.jsonl import JsonLines, read_lines


class AuditSink(Protocol):
    """Where the gate writes its audit lines: this file (`AuditLog`) or a shared table (`store/`)."""

    async def record(self, kind: str, **fields: Any) -> None:
        """Durable before it returns; raises `StateError` when it cannot be (the write is then refused)."""

    def note(self, kind: str, **fields: Any) -> None:
        """Best effort, never waits (reads): a failure is logged, never raised."""

    def close(self) -> None: ...


class AuditLog(JsonLines):
    def __init__(self, path: Path | None) -> None:
        super().__init__(path, durable=True, tag="event")


read_audit = read_lines
