"""The MCP front over streamable HTTP at `/mcp`, both protocol eras.

DNS-rebinding protection is always on (the Host and Origin must name this server; `allowed_hosts`
adds names), and with a token every request must carry `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import anyio
import anyio.abc
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp

from mcp_spec_proxy.fronts.asgi import BearerToken, host_names, serve_asgi
from mcp_spec_proxy.fronts.mcp import McpFront


def http_app(front: McpFront, *, host: str, token: str | None, allowed_hosts: list[str] | None = None) -> ASGIApp:
    """The streamable HTTP app at `/mcp`, with DNS-rebinding protection always on."""
    hosts = [f"{name}:*" for name in host_names(host, allowed_hosts or [])]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=hosts,
        allowed_origins=[f"http://{h}" for h in hosts] + [f"https://{h}" for h in hosts],
    )
    app: ASGIApp = front.server.streamable_http_app(host=host, transport_security=security)
    return BearerToken(app, token) if token else app


async def serve_http(
    front: McpFront,
    host: str,
    port: int,
    *,
    token: str | None = None,
    allowed_hosts: list[str] | None = None,
    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve streamable HTTP until cancelled; `task_status.started(port)` once listening."""
    app = http_app(front, host=host, token=token, allowed_hosts=allowed_hosts)
    async with front.suspensions.hosting():  # 2026-07-28 calls waiting for their client's answers
        await serve_asgi(
            app, host, port, announce="serving streamable HTTP on http://%s:%d/mcp", task_status=task_status
        )
