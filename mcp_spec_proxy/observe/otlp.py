"""The proxy's tracer provider for `telemetry: {otlp: URL}`: spans in batches to an OTLP/HTTP
receiver (protobuf), from the SDK's own thread.

Imported only where `telemetry.otlp` is set (the `otel` extra: `opentelemetry-sdk` and
`opentelemetry-exporter-otlp-proto-http`); `telemetry.open_tracing` is the way in. The
exporter reads the SDK's `OTEL_EXPORTER_OTLP_TRACES_*` / `OTEL_EXPORTER_OTLP_*` variables for
what the config does not say (headers, timeout, certificates, compression), and the resource
takes `OTEL_RESOURCE_ATTRIBUTES` beside `service.name`.

Promises: a receiver that is down, slow or answering errors costs the proxy one warning when
spans first fail to go (and one line when they go again) — the SDK exporter's own lines, one per
retry of each batch, are kept out of the log — and never a traceback or a call's time: spans are
queued and sent off the event loop. On stop the queue is flushed (`Export.stop`), and a receiver
that failed last time is not waited on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from mcp_spec_proxy import __version__

logger = logging.getLogger(__name__)

# The exporter's own loggers: a receiver that is down would log every retry of every batch there.
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp")
RETRY_S = 5.0  # while a receiver fails, how often a batch is sent to see whether it takes spans again
WHY_CHARS = 300  # of the exporter's first complaint, quoted in the proxy's one line


class _Quiet(logging.Filter):
    """Keeps the exporter's own lines out of the log, remembering the first one's words since
    `why` was last read (why a batch did not go) for `Exporter`'s single line."""

    def __init__(self) -> None:
        super().__init__()
        self._first = ""

    def filter(self, record: logging.LogRecord) -> bool:
        self._first = self._first or record.getMessage()
        return False

    def why(self) -> str:
        first, self._first = self._first, ""
        return first if len(first) <= WHY_CHARS else first[:WHY_CHARS] + "…"


class Exporter(SpanExporter):
    """The OTLP/HTTP exporter, telling an outage in one line each way: when spans first fail to
    go, and when they go again."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._inner = OTLPSpanExporter(endpoint=endpoint)
        self._quiet = _Quiet()
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self._quiet)
        self._failing = False
        self._next_try = 0.0  # while failing: when a batch is sent again (the ones before are dropped)
        self.stopping = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._failing and (self.stopping or time.monotonic() < self._next_try):
            # It did not take the last batch: no batch waits out the exporter's retries until the
            # next try, and a stop waits for none.
            return SpanExportResult.FAILURE
        try:
            result = self._inner.export(spans)
            why = self._quiet.why()
        except Exception as exc:  # boundary: an exporter fault costs spans, never the proxy a traceback
            result, why = SpanExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
            self._quiet.why()  # what it logged before raising is told by the exception
        if result is SpanExportResult.SUCCESS:
            if self._failing:
                logger.warning("traces: the receiver at %s takes spans again", self.endpoint)
            self._failing = False
            return result
        if not self._failing:
            logger.warning(
                "traces: the receiver at %s did not take %d spans (%s); spans are dropped until it does"
                " (tried again every %gs)",
                self.endpoint,
                len(spans),
                why or "no answer",
                RETRY_S,
            )
        self._failing = True
        self._next_try = time.monotonic() + RETRY_S
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).removeFilter(self._quiet)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


@dataclass
class Export:
    """Spans on their way to one receiver: the exporter and the batch processor feeding it."""

    endpoint: str
    exporter: Exporter
    processor: BatchSpanProcessor

    @classmethod
    def install(cls, endpoint: str, service: str, replica: int | None) -> Export:
        """Export every span to `endpoint`: through a tracer provider installed now, or through
        the SDK provider the operator installed already (their spans and the proxy's together)."""
        installed = trace.get_tracer_provider()
        if isinstance(installed, TracerProvider):
            provider = installed
        else:
            attributes: dict[str, str | int] = {"service.name": service, "service.version": __version__}
            if replica is not None:  # the store numbers this process: one replica of many
                attributes |= {"service.instance.id": f"replica-{replica}", "mcp_spec_proxy.replica": replica}
            # Not flushed at exit: the proxy flushes when it stops, and a receiver that is down must not hold the exit.
            provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
            trace.set_tracer_provider(provider)
            if trace.get_tracer_provider() is not provider:  # another was installed first: the API keeps it
                logger.warning("telemetry.otlp: a tracer provider that is not the SDK's is installed; spans go there")
        exporter = Exporter(endpoint)
        processor = BatchSpanProcessor(exporter)
        provider.add_span_processor(processor)
        logger.info("traces go to %s (OTLP/HTTP)", endpoint)
        return cls(endpoint, exporter, processor)

    def stop(self) -> None:
        """Send what is queued (the processor's shutdown flushes it), then close the exporter.
        Blocking: run it in a thread, bounded."""
        self.exporter.stopping = True
        self.processor.shutdown()
