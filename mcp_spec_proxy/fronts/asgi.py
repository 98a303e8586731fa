"""Serving an ASGI app with uvicorn on a socket we bind first, so port 0 works and the port is known."""

from __future__ import annotations

import socket

import anyio
import anyio.abc
import uvicorn
from starlette.types import ASGIApp


async def serve_asgi(
    app: ASGIApp, host: str, port: int, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; `task_status.started(port)` once the socket listens.

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
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", log_config=None))
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        task_status.started(int(sock.getsockname()[1]))
