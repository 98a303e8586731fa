"""A remote backend's login asked of the person through their client: URL-mode elicitation (2025-11-25).

While a URL backend's login waits for the person (`BackendAuth.waiting_at`, `backends/oauth.py`),
each client connection that declared `elicitation.url` in its capabilities is sent one
`elicitation/create` with `mode: "url"`: the authorization server's page, which sends the browser
back to the proxy's loopback redirect. The client shows it (or opens it) and answers; the login
completes on the loopback as from any browser, and `notifications/elicitation/complete` tells the
client once it has. A client connected after the login began is asked too, once per login. Only
handshake-era connections with a standalone channel are asked: the 2026-07-28 era forbids a request
to the client outside one of its own. Clients that cannot be asked find the login on the approval
console ("Log in to SERVER") and, in a refused call, the one line that names the console
(`ConsoleQueue.login_note`). The URL is the authorization server's: it never holds the console's key.
"""

from __future__ import annotations

import logging
import secrets
import weakref
from typing import TYPE_CHECKING

import anyio
import mcp_types as types
from mcp.server.connection import Connection
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

if TYPE_CHECKING:
    from mcp_spec_proxy.fronts.mcp import McpFront

logger = logging.getLogger(__name__)

LOOK_S = 0.5
"""How often, while a login waits, the connections are looked over for one not yet asked."""


class LoginAsks:
    """Asks the front's URL-elicitation clients to log in to each backend that waits for it (`run`)."""

    def __init__(self, front: McpFront) -> None:
        self._front = front
        self._logins = {name: auth for name, auth in front.proxy.logins.items() if auth.interactive}
        # Per connection, the logins it was asked about: server -> (authorization URL, elicitation id).
        self._asked: weakref.WeakKeyDictionary[Connection, dict[str, tuple[str, str]]] = weakref.WeakKeyDictionary()
        self._changed = anyio.Event()
        for auth in self._logins.values():
            auth.watchers.append(lambda _server, _url: self._changed.set())

    async def run(self) -> None:
        """Ask and tell, until cancelled (with the front)."""
        if not self._logins:
            return
        async with anyio.create_task_group() as tg:
            while True:
                waiting = {name: auth.waiting_at for name, auth in self._logins.items() if auth.waiting_at}
                for connection in self._askable():
                    asked = self._asked.setdefault(connection, {})
                    for server, (url, elicitation) in list(asked.items()):
                        if waiting.get(server) != url:  # that login ended (or began again elsewhere)
                            del asked[server]
                            tg.start_soon(_complete, connection, elicitation)
                    for server, url in waiting.items():
                        if server not in asked:
                            asked[server] = (url, secrets.token_urlsafe(12))
                            tg.start_soon(self._ask, connection, server, url, asked[server][1])
                self._changed = anyio.Event()
                with anyio.move_on_after(LOOK_S if waiting else None):  # a client that arrives is asked too
                    await self._changed.wait()

    def _askable(self) -> list[Connection]:
        front = self._front
        found = [*front.connections, *([front.stdio_connection] if front.stdio_connection is not None else [])]
        return [c for c in dict.fromkeys(found) if _takes_url(c)]

    async def _ask(self, connection: Connection, server: str, url: str, elicitation: str) -> None:
        message = (
            f"The server {server!r} behind mcp-spec-proxy asks you to log in before its tools can be used:"
            " open this page and log in; its tools appear once you have"
        )
        params = types.ElicitRequestURLParams(message=message, url=url, elicitation_id=elicitation)
        try:
            with anyio.move_on_after(self._logins[server].settings.login_timeout):
                result = await connection.send_request(types.ElicitRequest(params=params))
                logger.info("the client answered the login to %r: %s", server, result.action)
        except Exception as exc:  # boundary: a client that cannot be asked still has the console and the log
            logger.info("could not ask the client to log in to %r (%s)", server, type(exc).__name__)


def _takes_url(connection: Connection) -> bool:
    capabilities = connection.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return (
        elicitation is not None
        and elicitation.url is not None
        and connection.protocol_version not in MODERN_PROTOCOL_VERSIONS
        and connection.has_standalone_channel
    )


async def _complete(connection: Connection, elicitation: str) -> None:
    """`notifications/elicitation/complete`: the login the client was asked for is done (or ended)."""
    with anyio.move_on_after(2):
        await connection.notify("notifications/elicitation/complete", {"elicitationId": elicitation})
