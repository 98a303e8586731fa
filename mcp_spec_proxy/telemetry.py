"""Telemetry: one JSON line per decision, with every model call it took and what each cost.

Unlike the audit log (the promise that no write moves without a verdict), telemetry is for
measuring: the segment that was reviewed, the verdict, the action taken, and each model call's
prompt, completion and cached tokens and latency. Lines are flushed, not fsynced.
"""

from __future__ import annotations

from pathlib import Path

from mcp_spec_proxy.jsonl import JsonLines


class Telemetry(JsonLines):
    def __init__(self, path: Path | None) -> None:
        super().__init__(path, durable=False, tag="kind")
