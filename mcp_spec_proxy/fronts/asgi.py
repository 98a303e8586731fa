"""Serving the HTTP fronts: uvicorn on a socket we bind first, and the checks at their door.

`serve_asgi` binds before it announces, so port 0 works and the port is known. Both HTTP fronts
(MCP over streamable HTTP, the OpenAI-compatible gateway) answer only the names in
`host_names` (loopback, `--allow-host`, the bind address) and, with `--token-env`, only
requests that carry the token (`BearerToken`). `HostGuard` is that Host/Origin check for an app
that has none of its own (the MCP SDK checks for the MCP front). No front sends CORS headers, so
a browser never hands a foreign page an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
from collections.abc import Iterable, Iterator
from typing import Literal
from urllib.parse import urlsplit

import anyio
import anyio.abc
import uvicorn
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_spec_proxy.wire_types import ErrorBody

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_WILDCARD_BINDS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::")


def host_names(bind: str, extra: Iterable[str] = ()) -> list[str]:
    """The host names (no port) a server bound to `bind` answers to: loopback, `extra` (the
    `--allow-host` values), and the bind address itself unless it is loopback or a wildcard."""
    hosts = [*LOOPBACK_NAMES, *extra]
    if bind not in _WILDCARD_BINDS:
        hosts.append(f"[{bind}]" if ":" in bind else bind)
    return hosts


class BearerToken:
    """Refuses every request that does not carry `Authorization: Bearer <token>`."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self._expected):
                message = (
                    "unauthorized: send Authorization: Bearer <token>, the token in the variable named by --token-env"
                )
                await _refusal(401, message, "unauthorized", {"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self._app(scope, receive, send)


class HostGuard:
    """Refuses a request whose Host, or Origin when it sends one, names a host not in `hosts`.

    DNS rebinding: a page on evil.example that re-points its name at 127.0.0.1 reaches a loopback
    server, but with `Host: evil.example`. A page that posts cross-site sends its own `Origin`
    (`null` from a sandbox): only `http(s)://` origins on an allowed host pass. Clients that are
    not browsers send no Origin.
    """

    def __init__(self, app: ASGIApp, hosts: Iterable[str]) -> None:
        self._app = app
        self._hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host = headers.get("host", "")
            origin = headers.get("origin")
            if not self._allowed(host):
                name = _name(host) or host
                message = (
                    f"refused: this server does not answer to Host {host!r} (DNS-rebinding protection);"
                    f" if you reach it by that name on purpose, start it with --allow-host {name}"
                )
                await _refusal(421, message, "invalid_host")(scope, receive, send)
                return
            if origin is not None and not self._allowed_origin(origin):
                message = (
                    f"refused: requests from Origin {origin!r} may not use this server (a web page's"
                    " cross-site request); only this server's own http(s) origins may"
                )
                await _refusal(403, message, "invalid_origin")(scope, receive, send)
                return
        await self._app(scope, receive, send)

    def _allowed(self, netloc: str) -> bool:
        netloc = netloc.lower()
        return netloc in self._hosts or _name(netloc) in self._hosts

    def _allowed_origin(self, origin: str) -> bool:
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        plain = not (parts.path or parts.query or parts.fragment or parts.username or parts.password)
        return parts.scheme in ("http", "https") and plain and self._allowed(parts.netloc)


def _name(netloc: str) -> str | None:
    """The host name of `host[:port]` (`[v6]:port` keeps its brackets), or None if malformed."""
    if netloc.startswith("["):
        name, bracket, rest = netloc.partition("]")
        name, port = name + bracket, rest.removeprefix(":")
        if not bracket or (rest and not rest.startswith(":")):
            return None
    else:
        name, _, port = netloc.partition(":")
    if not name or (port and not port.isdigit()):
        return None
    return name


def _refusal(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-style error body: the gateway's clients read it, and it is plain JSON to anyone else."""
    body: ErrorBody = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the command's own (`stop_on_signal`) decide when a front
    stops. uvicorn's would close the port at the first SIGTERM, in the middle of a drain."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_asgi(
    app: ASGIApp,
    host: str,
    port: int,
    *,
    announce: str = "",
    lifespan: bool = True,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled; `task_status.started(port)` once the socket listens, and `announce`
    (a log format taking the host and the bound port) logged then. `lifespan=False` for an app
    that has nothing to start or stop.

    Clients that connect before uvicorn accepts wait in the socket's backlog, so there is no
    window in which the port is announced but refuses connections.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, so asyncio sets TCP_NODELAY on accepted connections (else answers wait on delayed ACKs).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on" if lifespan else "off", log_config=None, http=_http_protocol()
    )
    server = _Server(config)
    served = anyio.Event()
    shield = anyio.CancelScope(shield=True)

    async def run() -> None:
        # Shielded: a stop asks uvicorn to shut down (below) instead of cancelling it, since a
        # cancelled lifespan or request task logs an ERROR traceback at every ordinary stop.
        with shield:
            try:
                await server.serve([sock])
            finally:
                served.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        bound = int(sock.getsockname()[1])
        if announce:
            logger.info(announce, host, bound)
        task_status.started(bound)
        try:
            await served.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await _shut_down(server, served, shield)


def _http_protocol() -> type[asyncio.Protocol] | Literal["h11"]:
    """What uvicorn parses HTTP with: httptools where it is installed (the `fast` extra), with the
    bound on a request's head that h11 keeps (`fronts/bounded_head.py`); else h11."""
    try:
        from mcp_spec_proxy.fronts.bounded_head import BoundedHttpTools
    except ImportError:
        return "h11"
    return BoundedHttpTools


STOP_GRACE_S = 1.0
"""How long a stop lets the requests in flight finish before their connections are closed."""


async def _shut_down(server: uvicorn.Server, served: anyio.Event, shield: anyio.CancelScope) -> None:
    """Stop uvicorn in order, every wait bounded: new connections refused, the requests in flight
    given `STOP_GRACE_S`, then the connections still open closed — a stream that never ends (an
    SSE tab, an MCP GET stream) hears its client leave and ends as for any disconnect — and the
    lifespan shut down."""
    server.should_exit = True
    with anyio.move_on_after(STOP_GRACE_S):
        await served.wait()
    if served.is_set():
        return
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.close()
    with anyio.move_on_after(STOP_GRACE_S * 2):
        await served.wait()
    if not served.is_set():  # an app that ignores its disconnects: no longer waited for
        server.force_exit = True
        shield.cancel()
