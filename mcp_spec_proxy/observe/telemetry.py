"""Telemetry: one JSON line per decision, with every model call it took and what each cost; and
OpenTelemetry traces of each call.

Unlike the audit log (the promise that no write moves without a verdict), telemetry is for
measuring: the segment that was reviewed, the verdict, the action taken, and each model call's
prompt, completion and cached tokens and latency. Lines are flushed, not fsynced.

Traces are on where a tracer provider is installed: the proxy's own, for `telemetry: {otlp: URL}`
(`open_tracing`: a batch of spans at a time to that OTLP/HTTP receiver, flushed when the proxy
stops), or the operator's (by code, or by `opentelemetry-instrument`). Where none is, nothing
here makes a span: `Tracing` is off, and each of its spans is one shared no-op context (all the
read path pays), and the MCP front drops the SDK's span middleware (`fronts/fast_read.py`).

A call is one trace, named by its audit call id: the gate's span of the call (`Tracing.call`)
carries the id as `mcp_spec_proxy.call.id` (`CALL_ID`), and so does the span the call's request
opened, when the SDK's middleware made one, which is then the trace's root; under it the
review (reviewer, verdict), each model call the verdict took, and the forward to the backend.
Spans carry names, kinds and counts, never a call's arguments, a verdict's reason or a session id.
Under `auth:` the call's spans (its root among them) name who asks by their subject alone
(`SUBJECT`: the token's `sub`), never its client, scopes, groups or the token.

A receiver that is down or refuses spans costs the proxy one warning (and one more line when it
takes spans again): the export runs on the SDK's own thread, its failures are told once
(`otlp.Exporter`), never as a traceback, and the calls go on as before.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from mcp_spec_proxy.observe.jsonl import JsonLines

if TYPE_CHECKING:  # types only: the gate, below which these live, calls in here
    from mcp_spec_proxy.models import ModelCall
    from mcp_spec_proxy.principal import Principal
    from mcp_spec_proxy.review import Verdict
    from mcp_spec_proxy.review.kinds import Chain
    from mcp_spec_proxy.tools.catalog import CatalogTool

logger = logging.getLogger(__name__)

SERVICE = "mcp-spec-proxy"
"""The `service.name` of the proxy's spans, and the name of its tracer."""
CALL_ID = "mcp_spec_proxy.call.id"
"""The span attribute holding a call's audit id (the result's `_meta["mcp-spec-proxy/call"]`)."""
SUBJECT = "mcp_spec_proxy.principal.sub"
"""The span attribute naming who asks, where the front authenticated them: the principal's subject only."""
TRACES_PATH = "/v1/traces"
STOP_FLUSH_S = 5.0
"""Seconds a stopping proxy gives the spans still queued to reach the receiver."""
OTEL_EXTRA = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
"""What `telemetry.otlp` needs installed: `pip install 'mcp-spec-proxy[otel]'`."""


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


_OFF: AbstractContextManager[None] = nullcontext()  # stateless: one for every span not made


class Review:
    """The span of one review, told its verdict once it comes (a no-op where tracing is off)."""

    def __init__(self, tracer: trace.Tracer | None, span: trace.Span | None) -> None:
        self._tracer = tracer
        self._span = span

    def decided(self, verdict: Verdict) -> Verdict:
        """`verdict`, on the review's span, with a child span for each model call it took (drawn
        from what each cost: the call ended when it was recorded, `latency_s` after it began)."""
        if self._span is None or self._tracer is None:
            return verdict
        self._span.set_attributes(
            {
                "mcp_spec_proxy.verdict.accepted": verdict.accepted,
                "mcp_spec_proxy.verdict.accepted_steps": verdict.accepted_steps,
                "mcp_spec_proxy.verdict.decided_by": verdict.reviewer,
            }
        )
        for call in verdict.model_calls:
            self._model_call(call)
        return verdict

    def _model_call(self, call: ModelCall) -> None:
        assert self._tracer is not None
        span = self._tracer.start_span(
            f"chat {call.model}",
            kind=SpanKind.CLIENT,
            start_time=call.at_ns - int(call.latency_s * 1e9),
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": call.model,
                "gen_ai.usage.input_tokens": call.prompt_tokens,
                "gen_ai.usage.output_tokens": call.completion_tokens,
                "mcp_spec_proxy.model.role": call.role,
                "mcp_spec_proxy.model.purpose": call.purpose,
                "mcp_spec_proxy.model.cached_tokens": call.cached_tokens,
            },
        )
        if not call.ok:
            span.set_status(Status(StatusCode.ERROR, call.error))
        span.end(end_time=call.at_ns)


_NO_REVIEW = Review(None, None)


class Tracing:
    """The spans the gate makes of each call; off (`Tracing(None)`) it makes none."""

    def __init__(self, tracer: trace.Tracer | None) -> None:
        self._tracer = tracer

    @property
    def on(self) -> bool:
        return self._tracer is not None

    def call(
        self, call: str | None, tool: CatalogTool, author: str, principal: Principal | None = None
    ) -> AbstractContextManager[Any]:
        """The span of one call at the gate, named by its audit id and by the subject of who asks."""
        if self._tracer is None:
            return _OFF
        request = trace.get_current_span()
        if call and request.is_recording() and CALL_ID not in (getattr(request, "attributes", None) or {}):
            # The request's span (the SDK's: the trace's root) is named by the call it carried; a
            # substitute run in a rejected call's place leaves the first call's id there.
            request.set_attribute(CALL_ID, call)
            if principal is not None:
                request.set_attribute(SUBJECT, principal.sub)
        attributes = {
            "mcp_spec_proxy.tool": tool.name,
            "mcp_spec_proxy.server": tool.server,
            "mcp_spec_proxy.effect": tool.effect,
            "mcp_spec_proxy.author": author,
        }
        if call:
            attributes[CALL_ID] = call
        if principal is not None:  # the subject alone: a client id, scopes and groups stay off spans
            attributes[SUBJECT] = principal.sub
        return self._tracer.start_as_current_span(
            f"call {tool.name}",
            # With no request span around it (a read the stdio front took off the wire), it is the entry.
            kind=SpanKind.INTERNAL if request.get_span_context().is_valid else SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,  # its message may quote what a backend or a client sent
        )

    @contextmanager
    def review(self, reviewer: Chain) -> Iterator[Review]:
        """The span of a review by `reviewer`, named as the audit names it (`strong`, `strong→human`)."""
        if self._tracer is None:
            yield _NO_REVIEW
            return
        with self._tracer.start_as_current_span(
            "review", attributes={"mcp_spec_proxy.reviewer": reviewer.text}, record_exception=False
        ) as span:
            yield Review(self._tracer, span)

    def forward(self, tool: CatalogTool) -> AbstractContextManager[Any]:
        """The span of a call sent to its backend."""
        if self._tracer is None:
            return _OFF
        return self._tracer.start_as_current_span(
            f"forward {tool.server}",
            kind=SpanKind.CLIENT,
            attributes={"mcp_spec_proxy.server": tool.server, "mcp_spec_proxy.backend_tool": tool.original},
            record_exception=False,
        )


def traces_endpoint(url: str) -> str:
    """The URL spans are posted to: `url` itself when it names a path, else its `/v1/traces`."""
    return url if urlsplit(url).path not in ("", "/") else url.rstrip("/") + TRACES_PATH


def otel_missing() -> str | None:
    """The module of the `otel` extra that is not installed, if one is (`telemetry.otlp` needs them)."""
    for name in OTEL_EXTRA:
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return name
    return None


@asynccontextmanager
async def open_tracing(otlp: str | None, replica: int | None = None) -> AsyncIterator[Tracing]:
    """The proxy's `Tracing`: with `otlp`, spans exported to that receiver (`observe/otlp.py`) and the
    ones still queued flushed on exit, within `STOP_FLUSH_S`; without, on only where the operator
    installed a tracer provider."""
    if otlp is None:
        yield Tracing(trace.get_tracer(SERVICE) if tracing_configured() else None)
        return
    from mcp_spec_proxy.observe.otlp import Export  # the SDK and the exporter: loaded only for `telemetry.otlp`

    export = Export.install(traces_endpoint(otlp), SERVICE, replica)
    try:
        yield Tracing(trace.get_tracer(SERVICE))
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_FLUSH_S) as waited:
            await anyio.to_thread.run_sync(export.stop, abandon_on_cancel=True)
        if waited.cancelled_caught:
            logger.warning("traces: the spans still queued did not reach %s within %gs", export.endpoint, STOP_FLUSH_S)
