"""The one door to the `mcp` SDK's private names: an SDK release that moves them breaks this file only.

The rest of the package imports the SDK's public API directly; what it needs from underscored
modules or names comes from here, each under a public alias, with the reason it is used:

* `mcp.client._transport.Transport` / `TransportStreams`, `mcp.shared._stream_protocols.ReadStream`:
  the types of a client transport and its streams. `backends/transports.py` wraps the read side
  to learn the moment a backend's stream ends; `backends/stdio.py` yields the same pair.
* `mcp.shared._httpx_utils.create_mcp_http_client`: the httpx client the SDK's own streamable
  HTTP transport would build (its timeouts, redirects), given the configured headers.
* `mcp.client.stdio._create_platform_compatible_process`, `_drain_stdout`, `_parse_line`,
  `_stop_server_process`: the SDK's spawn (own process group), line parsing and bounded, shielded
  shutdown, so `backends/stdio.py`'s size-bounded stdio client behaves as the SDK's in all else.
* `mcp.server.stdio._claim_fd`, `_open_stdin_diversion`, `_open_stdout_diversion`,
  `_UnownedTextWrapper`: the SDK stdio server's claim of fd 0 and 1 (stray prints and children
  cannot touch the wire), which `fronts/stdio.py` needs because it reads the lines itself (to
  answer malformed ones) instead of letting `stdio_server` open the streams (`claimed_stdio`).
* `ServerSession._connection`: a handler's `Connection` (its per-connection state, its session id,
  its outbound channel for notifications). The SDK hands it to handlers only through the session;
  `Context.connection` exists but is not what the request runner fills in yet (`server_connection`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TextIO

from mcp.client._transport import Transport, TransportStreams
from mcp.client.stdio import _create_platform_compatible_process as create_platform_compatible_process
from mcp.client.stdio import _drain_stdout as drain_stdout
from mcp.client.stdio import _parse_line as parse_line
from mcp.client.stdio import _stop_server_process as stop_server_process
from mcp.server.connection import Connection
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import _claim_fd, _open_stdin_diversion, _open_stdout_diversion, _UnownedTextWrapper
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared._stream_protocols import ReadStream


@contextmanager
def claimed_stdio() -> Iterator[tuple[TextIO, TextIO]]:
    """The wire's stdin and stdout as text, while fd 0 and 1 point elsewhere; restored on exit.

    Best-effort as in the SDK: where descriptors cannot be diverted, the sys streams' buffers
    are served in place. Closing the text layers never closes the buffers under them.
    """
    with ExitStack() as releases:
        wire_in, release_in = _claim_fd(0, sys.stdin, "rb", _open_stdin_diversion)
        _on_exit(releases, release_in)
        wire_out, release_out = _claim_fd(1, sys.stdout, "wb", _open_stdout_diversion)
        _on_exit(releases, release_out)
        yield (
            _UnownedTextWrapper(wire_in, encoding="utf-8", errors="replace"),
            _UnownedTextWrapper(wire_out, encoding="utf-8"),
        )


def _on_exit(stack: ExitStack, release: Callable[[], None] | None) -> None:
    if release is not None:
        stack.callback(release)


def server_connection(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The connection a request arrived on (see the module docstring for why it is read privately)."""
    connection: Connection = ctx.session._connection  # pyright: ignore[reportPrivateUsage]
    return connection


__all__ = [
    "ReadStream",
    "Transport",
    "TransportStreams",
    "claimed_stdio",
    "create_mcp_http_client",
    "create_platform_compatible_process",
    "drain_stdout",
    "parse_line",
    "server_connection",
    "stop_server_process",
]
