"""Telemetry: one JSON line per decision, with every model call it took and what each cost.

Unlike the audit log (the promise that no write moves without a verdict), telemetry is for
measuring: the segment that was reviewed, the verdict, the action taken, and each model call's
prompt, completion and cached tokens and latency. Lines are flushed, not fsynced.

OpenTelemetry is the operator's to turn on: `tracing_configured()` says whether a tracer
provider is installed, and where none is, the MCP front makes no spans at all (the SDK's are
no-ops then, but not free).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry import trace

from mcp_spec_proxy.jsonl import JsonLines


class Telemetry(JsonLines):
    def __init__(self, path: Path | None) -> None:
        super().__init__(path, durable=False, tag="kind")
        # Told every record, written or not (a proxy with no telemetry file still counts LEASH's decisions).
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []

    async def record(self, kind: str, **fields: Any) -> None:
        for listener in self.listeners:
            listener(kind, fields)
        await super().record(kind, **fields)


def tracing_configured() -> bool:
    """Whether an OpenTelemetry tracer provider is installed (by code, or by `opentelemetry-instrument`)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
