"""`telemetry: {otlp: URL}` on the real command: each call's spans reach an OTLP/HTTP receiver
running in the test (it decodes `ExportTraceServiceRequest`, as a collector would), one trace per
call, named by the id the audit trail and the result's `_meta` carry; and a receiver that is down
or refuses spans costs the proxy one log line, never a call.

Ground truth: the toy backend's ledger (what really ran) and the audit log (what the proxy says
ran); the scripted strong model answers the write's review over real HTTP.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from mcp_spec_proxy import proxy as proxy_module
from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.observe.telemetry import CALL_ID, traces_endpoint, tracing_configured
from mcp_spec_proxy.proxy import running_proxy, validate
from mcp_spec_proxy.testing import Respond, ScriptedModelServer
from tests.harness import recorded, segment_length, spawned, text_of, toy, toy_twins, verdict
from tests.ops_world import SERVING, serving, until

pytestmark = pytest.mark.anyio

LEDGER = '{"value": "traced"}'  # the toy's line for the write, once it ran


@dataclass
class Span:
    trace: str
    id: str
    parent: str
    name: str
    attributes: dict[str, Any]
    resource: dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass
class Receiver:
    """An OTLP/HTTP receiver: POST /v1/traces, protobuf; answers `status` (200: it takes them)."""

    status: int = 200
    spans: list[Span] = field(default_factory=list)
    posts: int = 0
    url: str = ""

    def take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        Span(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            {kv.key: _value(kv.value) for kv in span.attributes},
                            resource,
                        )
                    )

    def trace_of(self, call: str) -> list[Span]:
        """The spans of the trace whose root names `call`."""
        roots = [span for span in self.spans if not span.parent and span.attributes.get(CALL_ID) == call]
        assert len(roots) == 1, f"one root span should name call {call}: {self.spans}"
        return [span for span in self.spans if span.trace == roots[0].trace]


@contextmanager
def receiving(status: int = 200) -> Iterator[Receiver]:
    receiver = Receiver(status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            receiver.posts += 1
            if self.path == "/v1/traces" and receiver.status == 200:
                receiver.take(body)
            self.send_response(receiver.status if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def closed_port() -> int:
    """A port nothing listens on (bound once, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def accept(request: Any) -> str:
    return verdict(segment_length(request))


def configured(tmp: Path, model: ScriptedModelServer, otlp: str) -> dict[str, Any]:
    return {
        "servers": {"toy": toy(tmp / "rec")},
        "models": {"strong": {"base_url": model.base_url, "model": "strong-model", "max_retries": 0}},
        "review": {"default": "strong", "intent": False},
        "telemetry": {"otlp": otlp},
    }


async def read_and_write(url: str) -> tuple[str, str]:
    """A read and a write over streamable HTTP; the call ids their results carry."""
    async with (
        httpx2.AsyncClient(timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        read = await client.call_tool("toy__echo", {"text": "hello"})
        written = await client.call_tool("toy__record", {"value": "traced"})
    assert not read.is_error and not written.is_error, (text_of(read), text_of(written))
    assert read.meta is not None and written.meta is not None
    return read.meta[CALL_META], written.meta[CALL_META]


def parent_of(span: Span, spans: list[Span]) -> Span:
    return next(other for other in spans if other.id == span.parent)


def under(span: Span, ancestor: Span, spans: list[Span]) -> bool:
    while span.parent:
        span = parent_of(span, spans)
        if span.id == ancestor.id:
            return True
    return False


async def test_each_call_is_one_trace_named_by_its_audit_call_id_with_review_model_and_forward_spans(
    tmp_path: Path,
) -> None:
    with receiving() as receiver:
        async with (
            ScriptedModelServer(Respond(accept)) as model,
            serving(configured(tmp_path, model, receiver.url), tmp_path) as proxy,
        ):
            with anyio.fail_after(60):
                read, write = await read_and_write((await proxy.line(SERVING)).group(1))
                proxy.terminate()
                assert await proxy.wait() == 0
        with anyio.fail_after(30):
            await until(lambda: any(span.attributes.get(CALL_ID) == write for span in receiver.spans))
    assert recorded(tmp_path / "rec") == [LEDGER]  # the ledger: the write ran, once
    audit = read_audit(tmp_path / "state" / "audit.jsonl")
    assert {row["event"] for row in audit if row.get("call") == read} == {"read"}
    assert [row["event"] for row in audit if row.get("call") == write] == ["held", "verdict", "forwarded"]
    assert "Traceback" not in proxy.log() and "traces: the receiver" not in proxy.log()

    spans = receiver.trace_of(write)
    root = next(span for span in spans if not span.parent)
    assert root.resource["service.name"] == "mcp-spec-proxy"
    (call,) = [span for span in spans if span.name == "call toy__record"]
    assert call.attributes[CALL_ID] == write and under(call, root, spans)  # the root: the SDK's request span
    assert call.attributes["mcp_spec_proxy.effect"] == "write"
    (review,) = [span for span in spans if span.name == "review"]
    assert parent_of(review, spans) is call
    assert review.attributes["mcp_spec_proxy.reviewer"] == "strong"
    assert review.attributes["mcp_spec_proxy.verdict.accepted"] is True
    (chat,) = [span for span in spans if span.name == "chat strong-model"]
    assert parent_of(chat, spans) is review
    assert chat.attributes["gen_ai.request.model"] == "strong-model"
    assert chat.attributes["gen_ai.usage.input_tokens"] > 0 and len(model.chat_requests) == 1
    (forward,) = [span for span in spans if span.name == "forward toy"]
    assert parent_of(forward, spans) is call
    assert forward.attributes["mcp_spec_proxy.backend_tool"] == "record"

    spans = receiver.trace_of(read)
    (call,) = [span for span in spans if span.name == "call toy__echo"]
    assert call.attributes[CALL_ID] == read and call.attributes["mcp_spec_proxy.effect"] == "read"
    (forward,) = [span for span in spans if span.name == "forward toy"]
    assert parent_of(forward, spans) is call
    assert not [span for span in spans if span.name in ("review", "chat strong-model")]  # a read is not reviewed
    # Nothing the client or the backend wrote travels in a span.
    assert not [
        span for span in receiver.spans if "hello" in repr(span.attributes) or "traced" in repr(span.attributes)
    ]


async def test_a_read_taken_off_the_stdio_wire_is_traced_too_when_otlp_is_configured(tmp_path: Path) -> None:
    with receiving() as receiver:
        async with ScriptedModelServer(Respond(accept)) as model:
            async with spawned(configured(tmp_path, model, receiver.url), tmp_path) as client:
                read = await client.call_tool("toy__echo", {"text": "hello"})
            assert read.meta is not None
            call = read.meta[CALL_META]
        with anyio.fail_after(30):  # the proxy flushed its spans as it stopped, when its stdin closed
            await until(lambda: any(span.attributes.get(CALL_ID) == call for span in receiver.spans))
    spans = receiver.trace_of(call)
    (root,) = [span for span in spans if not span.parent]
    assert root.name == "call toy__echo"  # no SDK span around it: the lean path's own is the root
    assert [span.name for span in spans if span.parent == root.id] == ["forward toy"]
    assert [row["event"] for row in read_audit(tmp_path / "state" / "audit.jsonl") if row.get("call") == call] == [
        "read"
    ]


# Batches every 0.1 s, each given 2 s (retries included): the SDK's own variables, read by its exporter.
QUICK_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"}
TOLD = re.compile(r"traces: the receiver at \S+ did not take")


@pytest.mark.parametrize("fault", ["down", "refusing"])
async def test_a_receiver_that_is_down_or_refuses_costs_one_log_line_and_no_call(tmp_path: Path, fault: str) -> None:
    with receiving(status=500) as receiver:
        otlp = receiver.url if fault == "refusing" else f"http://127.0.0.1:{closed_port()}"
        async with ScriptedModelServer(Respond(accept)) as model:
            config = configured(tmp_path, model, otlp)
            async with serving(config, tmp_path, env=QUICK_EXPORT) as proxy:
                with anyio.fail_after(60):
                    url = (await proxy.line(SERVING)).group(1)
                    await read_and_write(url)
                    await proxy.line(TOLD)  # the first batch failed ...
                    _, write = await read_and_write(url)  # ... and calls answer as before
                    proxy.terminate()
                    assert await proxy.wait() == 0
    assert recorded(tmp_path / "rec") == [LEDGER, LEDGER]
    events = [row["event"] for row in read_audit(tmp_path / "state" / "audit.jsonl") if row.get("call") == write]
    assert events == ["held", "verdict", "forwarded"]
    log = proxy.log()
    assert "Traceback" not in log
    told = [line for line in log.splitlines() if "traces:" in line]
    assert len(told) == 1, log  # once, however many batches failed, the last one at the stop included
    assert "spans are dropped until it does" in told[0]
    assert ("500" if fault == "refusing" else "Connection refused") in told[0]
    assert "opentelemetry" not in log  # the exporter's own lines (one per retry) stay out
    if fault == "refusing":
        assert receiver.posts >= 1 and not receiver.spans  # it was asked, and took nothing


async def test_without_otlp_or_a_tracer_provider_no_span_is_made_on_any_path(tmp_path: Path) -> None:
    raw = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "allow", "intent": False}}
    assert not tracing_configured()  # this process installed none: the spans above ran in the proxy's own
    with anyio.fail_after(60):
        async with running_proxy(ProxyConfig.model_validate(raw), None, in_process=toy_twins(raw)) as proxy:
            front = McpFront(proxy)
            assert not proxy.gate.tracing.on
            assert front.server.middleware == [front.fast_read]  # the SDK's span middleware is dropped too


async def test_otlp_without_the_otel_extra_is_a_config_error_naming_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(proxy_module, "otel_missing", lambda: "opentelemetry.sdk")
    config = ProxyConfig.model_validate({"telemetry": {"otlp": "http://collector:4318"}})

    with pytest.raises(ConfigError) as caught:
        await validate(config, {}, "servers.yaml")

    assert str(caught.value) == (
        "servers.yaml: telemetry.otlp: opentelemetry.sdk is not installed — pip install 'mcp-spec-proxy[otel]'"
    )


def test_a_receiver_named_by_its_base_gets_spans_at_its_traces_path() -> None:
    assert traces_endpoint("http://collector:4318") == "http://collector:4318/v1/traces"
    assert traces_endpoint("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert traces_endpoint("https://otel.example/ingest/traces") == "https://otel.example/ingest/traces"


OPERATORS_PROVIDER = """
import json, sys
from pathlib import Path

import anyio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_spec_proxy.calls.results import CALL_META
from tests.harness import proxied, toy

spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)  # the operator's code, before the proxy starts


async def main() -> None:
    tmp = Path(sys.argv[1])
    config = {"servers": {"toy": toy(tmp / "rec")}, "review": {"default": "allow", "intent": False}}
    async with proxied(config, tmp / "state", twins=True) as run:
        read = await run.client.call_tool("toy__echo", {"text": "hi"})
    names = {span.name: dict(span.attributes or {}) for span in spans.get_finished_spans()}
    print(json.dumps({"call": read.meta[CALL_META], "spans": names}))


anyio.run(main)
"""


def test_a_tracer_provider_the_operator_installed_gets_the_same_spans_without_otlp(tmp_path: Path) -> None:
    # A process of its own: a tracer provider, once installed, stays for the process's life.
    done = subprocess.run(
        [sys.executable, "-c", OPERATORS_PROVIDER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    call, spans = seen["call"], seen["spans"]
    assert spans["tools/call toy__echo"][CALL_ID] == call  # the SDK's request span, kept and named
    assert spans["call toy__echo"][CALL_ID] == call
    assert spans["forward toy"]["mcp_spec_proxy.backend_tool"] == "echo"
