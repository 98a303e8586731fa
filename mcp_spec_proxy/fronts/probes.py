"""The operator's endpoints of an HTTP front: `/healthz`, `/readyz` and `/metrics`.

A `Door` is the app uvicorn serves on a front's port. It listens from the start of the command,
before the proxy is running, and the front's own app is mounted on it once the proxy serves
(`Door.mounted`); until then (and after, while it stops) every other path is answered 503
"starting", so the port answering says nothing about readiness: `/readyz` does.

    GET /healthz   200 {"status": "ok"}: the process serves HTTP (liveness).
    GET /readyz    200 {"status": "ready"} only when the front's app is mounted (tools/list
                   answers), every enabled backend is connected, the store answers with its
                   schema current, and the replica is not draining (SIGTERM); else 503
                   {"status": "not ready", "reasons": [...]}.
    GET /metrics   the Prometheus text of the proxy's metrics (`observe/metrics.py`).

The two probes answer ahead of the token and the Host check: a kubelet or a load balancer sends
neither (it reaches the pod by its address). They say nothing else: their reasons are counts and
kinds ("1 of 2 backends not connected"), never a name, and no CORS header lets a web page read
them. `/metrics` names servers and tools: with a token it requires the token (and then skips the
Host check — the token is what a rebinding page cannot send, and a scraper reaches the pod by its
address); without one it sits behind the Host check, like the front. The store's answer is
remembered for `STORE_CHECK_S`, so probes at any rate cost the database one query a second, and the
check waits for the database half a second at most (`store.postgres.PROBE_S`, not the store's
`timeout`): a probe is answered well within a kubelet's default 1 s probe timeout, database or not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_spec_proxy.calls.drain import Answering
from mcp_spec_proxy.fronts.asgi import BearerToken, HostGuard, serve_asgi

if TYPE_CHECKING:
    from mcp_spec_proxy.proxy import Proxy

logger = logging.getLogger(__name__)

STORE_CHECK_S = 1.0
LIFESPAN_STOP_S = 5.0
PROBES = ("/healthz", "/readyz")


class Readiness:
    """Why this replica should get no traffic now; nothing when it may."""

    def __init__(self) -> None:
        self.proxy: Proxy | None = None  # set while the front's app is mounted
        self._store: tuple[float, list[str]] | None = None
        self._checking = anyio.Lock()  # one store check at a time, however many probes wait

    async def reasons(self) -> list[str]:
        proxy = self.proxy
        if proxy is None:
            return ["starting: the proxy does not serve yet"]
        if proxy.gate.drain.draining:
            return ["draining: the replica is shutting down"]
        reasons = []
        backends = proxy.backends.backends.values()
        down = sum(1 for backend in backends if backend.status != "connected")
        if down:
            reasons.append(f"{down} of {len(backends)} backends not connected")
        return reasons + await self._store_reasons(proxy)

    async def _store_reasons(self, proxy: Proxy) -> list[str]:
        async with self._checking:
            if self._store is None or time.monotonic() - self._store[0] > STORE_CHECK_S:
                self._store = (time.monotonic(), await proxy.store.health())
            return self._store[1]


class Door:
    """The ASGI app on a front's port: the probes, `/metrics`, and the front once it is mounted."""

    def __init__(self, *, token: str | None, hosts: Iterable[str], answering: Answering | None = None) -> None:
        self.readiness = Readiness()
        self._app: ASGIApp | None = None
        # Requests other than GET the front is answering now (a call's POST): the command waits for them.
        self.answering = answering or Answering()
        metrics: ASGIApp = self._metrics
        self._metrics_app = BearerToken(metrics, token) if token else HostGuard(metrics, hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            path = scope["path"]
            if path == "/healthz":
                await JSONResponse({"status": "ok"}, headers=_NO_STORE)(scope, receive, send)
                return
            if path == "/readyz":
                reasons = await self.readiness.reasons()
                body: dict[str, Any] = {"status": "not ready", "reasons": reasons} if reasons else {"status": "ready"}
                await JSONResponse(body, status_code=503 if reasons else 200, headers=_NO_STORE)(scope, receive, send)
                return
            if path == "/metrics":
                await self._metrics_app(scope, receive, send)
                return
        app = self._app
        if app is None:
            if scope["type"] == "http":
                message = "not serving: the proxy is starting (or stopping); GET /readyz says when it serves"
                body = {"error": {"message": message, "code": "starting"}}
                await JSONResponse(body, status_code=503, headers={"Retry-After": "1"})(scope, receive, send)
            return
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await app(scope, receive, send)  # a GET is a stream of notifications: it lasts as long as its client
            return
        request = object()
        self.answering.begin(request)
        try:
            await app(scope, receive, send)
        finally:
            self.answering.end(request)

    async def answered(self) -> None:
        """Wait until no request that may carry a call is being answered: after a drain, the
        results of the calls it let finish have reached their clients (bound it)."""
        await self.answering.answered()

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        proxy = self.readiness.proxy
        body = proxy.metrics.render() if proxy is not None and proxy.metrics is not None else b""
        from mcp_spec_proxy.observe.metrics import CONTENT_TYPE

        await Response(body, media_type=CONTENT_TYPE, headers=_NO_STORE)(scope, receive, send)

    async def serve(
        self,
        host: str,
        port: int,
        *,
        task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen now: the probes answer from here on; the front once `mounted`."""
        await serve_asgi(
            self,
            host,
            port,
            announce="probes on http://%s:%d/readyz (the proxy is starting)",
            lifespan=False,
            task_status=task_status,
        )

    @asynccontextmanager
    async def mounted(self, app: ASGIApp, proxy: Proxy) -> AsyncIterator[None]:
        """Serve `app` (its lifespan run here: uvicorn started before it existed) for the block."""
        async with lifespan(app):
            self._app = app
            self.readiness.proxy = proxy
            try:
                yield
            finally:
                self.readiness.proxy = None
                self._app = None


_NO_STORE = {"Cache-Control": "no-store"}


@asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """Run `app`'s ASGI lifespan (startup before the block, shutdown after), as uvicorn would."""
    to_app, app_reads = anyio.create_memory_object_stream[dict[str, Any]](2)
    app_says, from_app = anyio.create_memory_object_stream[dict[str, Any]](2)

    async def receive() -> dict[str, Any]:
        return await app_reads.receive()

    async def send(message: Any) -> None:
        await app_says.send(dict(message))

    async def run() -> None:
        try:
            await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
        finally:
            app_says.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await to_app.send({"type": "lifespan.startup"})
        started = await from_app.receive()
        if started["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the HTTP front did not start: {started.get('message', started['type'])}")
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(LIFESPAN_STOP_S):
                await to_app.send({"type": "lifespan.shutdown"})
                async for message in from_app:
                    if message["type"].startswith("lifespan.shutdown"):
                        break
            tg.cancel_scope.cancel()
