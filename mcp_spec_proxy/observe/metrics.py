"""Prometheus metrics of one running proxy, read from what it already records.

The gate's audit lines are the ground truth of every call, so the call metrics are taken from
them as they are written (`MeteredAudit`, a wrapper of the gate's audit sink): a count of each
call by server, tool, effect and outcome; the held calls now; each verdict and its latency by
reviewer; the lines the store refused. LEASH's decisions come from its telemetry records
(`Metrics.telemetry`), and the backends' state and restarts are read from the pool at scrape
time (`_BackendCollector`), so nothing is counted twice and nothing is kept that the pool knows.

Each proxy has its own registry (no process-wide state: tests run many proxies in one process).

    mcp_spec_proxy_calls_total{server,tool,effect,outcome}   reads: forwarded; writes: their terminal
                                                              line (forwarded, error, blocked, unsent,
                                                              abandoned, forward-interrupted, awaiting-input)
    mcp_spec_proxy_held_calls                                 writes waiting for a verdict now
    mcp_spec_proxy_verdicts_total{reviewer,verdict}           accepted | rejected, by the reviewer that decided
    mcp_spec_proxy_review_seconds{reviewer}                   from held to verdict (histogram)
    mcp_spec_proxy_store_errors_total{operation}              audit lines the store refused (record, claim, later)
    mcp_spec_proxy_leash_decisions_total{layer,decision}      route, escalate, observe, and the gate's escalations
    mcp_spec_proxy_backend_up{server}                         1 while connected
    mcp_spec_proxy_backend_state{server,state}                1 for its state: starting, connected,
                                                              reconnecting, unavailable
    mcp_spec_proxy_backend_restarts_total{server}             reconnects and restarts since the proxy started
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.errors import StateError

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TERMINAL = frozenset({"blocked", "forwarded", "unsent", "abandoned", "forward-interrupted", "awaiting-input"})
STATES = ("starting", "connected", "reconnecting", "login", "unavailable")
MAX_OPEN = 100_000  # held calls remembered for their labels; past this the oldest are forgotten
REVIEW_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)  # a person may take minutes


@dataclass
class _Open:
    server: str
    tool: str
    effect: str
    held_at: float
    waiting: bool = True  # no verdict yet


class Metrics:
    """The proxy's registry and the instruments the wrappers feed."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "mcp_spec_proxy_calls", "Tool calls at the gate", ["server", "tool", "effect", "outcome"], registry=r
        )
        self.held = Gauge("mcp_spec_proxy_held_calls", "Writes waiting for a verdict now", registry=r)
        self.verdicts = Counter("mcp_spec_proxy_verdicts", "Verdicts by reviewer", ["reviewer", "verdict"], registry=r)
        self.review = Histogram(
            "mcp_spec_proxy_review_seconds", "Held to verdict", ["reviewer"], buckets=REVIEW_BUCKETS, registry=r
        )
        self.store_errors = Counter(
            "mcp_spec_proxy_store_errors", "Audit lines the store refused", ["operation"], registry=r
        )
        self.leash = Counter("mcp_spec_proxy_leash_decisions", "LEASH decisions", ["layer", "decision"], registry=r)

    def watch_backends(self, pool: BackendPool) -> None:
        self.registry.register(_BackendCollector(pool))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def telemetry(self, kind: str, fields: dict[str, Any]) -> None:
        """A telemetry record: LEASH's decisions are counted from theirs."""
        if kind != "leash":
            return
        layer = str(fields.get("layer", ""))
        if layer == "route":
            self.leash.labels("route", "strong" if fields.get("strong_led") else "weak").inc()
        elif layer == "escalate":
            self.leash.labels("escalate", "escalate").inc()
        elif layer == "observe":
            self.leash.labels("observe", "flag" if fields.get("flagged") else "pass").inc()


class MeteredAudit:
    """The gate's audit sink, counting each line it is handed on its way to the store."""

    def __init__(self, inner: AuditSink, metrics: Metrics) -> None:
        self._inner = inner
        self._metrics = metrics
        self._open: OrderedDict[str, _Open] = OrderedDict()

    async def record(self, kind: str, **fields: Any) -> None:
        try:
            await self._inner.record(kind, **fields)
        except StateError:
            self._metrics.store_errors.labels("record").inc()
            raise
        self._observe(kind, fields)

    def note(self, kind: str, **fields: Any) -> None:
        self._inner.note(kind, **fields)
        self._observe(kind, fields)

    def later(self, kind: str, **fields: Any) -> None:
        self._metrics.store_errors.labels("later").inc()
        self._inner.later(kind, **fields)
        self._observe(kind, fields)  # what happened to the call happened, whenever its line is written

    async def claim(self, session: str, key: str, call: str, **fields: Any) -> str | None:
        try:
            return await self._inner.claim(session, key, call, **fields)
        except StateError:
            self._metrics.store_errors.labels("claim").inc()
            raise

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)  # a store's own extras (its tests reach them through the gate's sink)

    def _observe(self, kind: str, fields: dict[str, Any]) -> None:
        m = self._metrics
        call = str(fields.get("call") or "")
        if kind == "read":
            m.calls.labels(fields.get("server", ""), fields.get("tool", ""), "read", "forwarded").inc()
        elif kind == "held":
            if call in self._open:
                return
            server, tool = str(fields.get("server", "")), str(fields.get("tool", ""))
            self._open[call] = _Open(server, tool, str(fields.get("effect", "write")), time.monotonic())
            while len(self._open) > MAX_OPEN:
                self._settle(self._open.popitem(last=False)[1])
            m.held.inc()
        elif kind == "verdict":
            reviewer = str(fields.get("decided_by") or fields.get("reviewer") or "")
            m.verdicts.labels(reviewer, "accepted" if fields.get("accepted") else "rejected").inc()
            latency = fields.get("latency_ms")
            if isinstance(latency, int | float):
                m.review.labels(reviewer).observe(latency / 1000)
            opened = self._open.get(call)
            if opened is not None and opened.waiting:
                opened.waiting = False
                m.held.dec()
        elif kind == "leash-escalated":
            m.leash.labels("gate", "escalate").inc()
        elif kind in TERMINAL:
            opened = self._open.pop(call, None)
            if opened is None:
                return
            self._settle(opened)
            outcome = "error" if kind == "forwarded" and fields.get("is_error") else kind
            m.calls.labels(opened.server, opened.tool, opened.effect, outcome).inc()

    def _settle(self, opened: _Open) -> None:
        if opened.waiting:
            opened.waiting = False
            self._metrics.held.dec()


class _BackendCollector(Collector):
    """The backends' state and restarts, read from the pool at each scrape."""

    def __init__(self, pool: BackendPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("mcp_spec_proxy_backend_up", "1 while the backend is connected", labels=["server"])
        state = GaugeMetricFamily(
            "mcp_spec_proxy_backend_state", "The backend's state (1 for the current one)", labels=["server", "state"]
        )
        restarts = CounterMetricFamily(
            "mcp_spec_proxy_backend_restarts", "Reconnects and restarts of the backend", labels=["server"]
        )
        for name, backend in sorted(self._pool.backends.items()):
            up.add_metric([name], 1.0 if backend.status == "connected" else 0.0)
            for each in STATES:
                state.add_metric([name, each], 1.0 if backend.status == each else 0.0)
            restarts.add_metric([name], float(backend.restarts))
        yield up
        yield state
        yield restarts
