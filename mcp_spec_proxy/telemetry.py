"""Telemetry: one JSON line per decision, with every model call it took and what each cost.

Unlike the audit log (the promise that no write moves without a verdict), telemetry is for
measuring: the segment that was reviewed, the verdict, the action taken, and each model call's
prompt, completion and cached tokens and latency. Lines are flushed, not fsynced.

OpenTelemetry is the operator's to turn on: `tracing_configured()` says whether a tracer
provider is installed, and where none is, the MCP front makes no spans at all (the SDK's are
no-ops then, but not free).
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry import trace

from mcp_spec_proxy.jsonl import JsonLines


class Telemetry(JsonLines):
    def __init__(self, path: Path | None) -> None:
        super().__init__(path, durable=False, tag="kind")


def tracing_configured() -> bool:
    """Whether an OpenTelemetry tracer provider is installed (by code, or by `opentelemetry-instrument`)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
