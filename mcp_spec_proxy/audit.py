"""The audit log: one JSON line per held call and per verdict, durable before anything moves.

Every line is flushed and fsynced before `record` returns, so the barrier can promise that a
write is only forwarded after its verdict is on disk, and a proxy killed at any moment leaves
a log whose every complete line parses (`read_audit` skips a torn last line).
"""

from __future__ import annotations

from pathlib import Path

from mcp_spec_proxy.jsonl import JsonLines, read_lines


class AuditLog(JsonLines):
    def __init__(self, path: Path | None) -> None:
        super().__init__(path, durable=True, tag="event")


read_audit = read_lines
