"""The loopback redirect of one login: a listener on 127.0.0.1 that takes the authorization code.

`Redirect.listen(port)` binds `127.0.0.1:PORT` before the browser is sent to the authorization
server (so the redirect never finds the port closed), and `wait(state)` answers requests to
`/callback` until one carries the login's own `state`: any other request (a web page in the
user's browser can reach loopback ports and may guess the port, never the state) is answered 400
and does not end the wait. The first request with the right state ends it, whatever it carries
(a `code`, or the authorization server's `error`), and the listener closes. The SDK checks the
state again, and the `iss` (RFC 9207), before it uses the code.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
from mcp.shared.auth import AuthorizationCodeResult

logger = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16_384
READ_TIMEOUT_S = 10.0
PAGE = "<!doctype html><title>{title}</title><p>{text}</p>"


class LoginRefused(Exception):
    """The authorization server sent the person back with an `error` instead of a code."""


class Redirect:
    """One login's listener; `listen` binds it, `wait` takes the code, `aclose` lets the port go."""

    def __init__(self, listener: anyio.abc.SocketListener, port: int) -> None:
        self._listener = listener
        self.port = port

    @classmethod
    async def listen(cls, port: int) -> Redirect:
        """Bind 127.0.0.1:`port` (0: a free one); an `OSError` when it is taken."""
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)
        socket_listener = listener.listeners[0]
        bound = socket_listener.extra(anyio.abc.SocketAttribute.local_port)
        assert isinstance(socket_listener, anyio.abc.SocketListener)
        return cls(socket_listener, bound)

    async def wait(self, state: str) -> AuthorizationCodeResult:
        """The code the authorization server sent back with `state`; raises `LoginRefused` on its error."""
        while True:
            stream = await self._listener.accept()
            async with stream:
                params = await _request(stream)
                if params is None or params.get("state") != state:
                    await _answer(stream, 400, "Not this login", "This is not the login the proxy is waiting for.")
                    continue
                if "code" not in params:
                    error = params.get("error", "no code")
                    await _answer(stream, 400, "Login refused", "The authorization server refused the login.")
                    raise LoginRefused(f"{error}: {params.get('error_description', '')}".rstrip(": "))
                await _answer(stream, 200, "Logged in", "Logged in. You may close this tab.")
                return AuthorizationCodeResult(code=params["code"], state=params["state"], iss=params.get("iss"))

    async def aclose(self) -> None:
        await self._listener.aclose()


async def _request(stream: anyio.abc.SocketStream) -> dict[str, str] | None:
    """The query of a `GET /callback` request, or None for anything else."""
    head = b""
    with anyio.move_on_after(READ_TIMEOUT_S):
        while b"\r\n\r\n" not in head and len(head) < MAX_REQUEST_BYTES:
            try:
                head += await stream.receive(4096)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or parts[0] != "GET":
        return None
    target = urlsplit(parts[1])
    if target.path != "/callback":
        return None
    return {key: values[0] for key, values in parse_qs(target.query).items()}


async def _answer(stream: anyio.abc.SocketStream, status: int, title: str, text: str) -> None:
    body = PAGE.format(title=title, text=text).encode()
    reason = "OK" if status == 200 else "Bad Request"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
    )
    try:
        await stream.send(head.encode() + body)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        logger.debug("the login redirect's browser went before its answer")


__all__ = ["LoginRefused", "Redirect"]
