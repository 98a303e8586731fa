"""Which protocol era the client of the current request speaks, so that it reaches each backend in
that era where the backend speaks it.

The front sets `CLIENT_ERA` around every request it serves (`fronts/fast_read.py`); below it, the
catalog shows that era's listing (a server may list some tools on one era only) and a backend
sends the request down the leg of that era (`connection.py`). Where it is unset (the proxy's own
agent, the gateway, start-up) every era's tools are seen, and a call goes down the backend's first
leg unless only its other leg lists the tool.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Era = Literal["handshake", "modern"]

CLIENT_ERA: contextvars.ContextVar[Era | None] = contextvars.ContextVar("mcp_spec_proxy.client_era", default=None)


def era_of(protocol_version: str | None) -> Era:
    """The era of a negotiated protocol version (2026-07-28 and later: modern)."""
    return "modern" if protocol_version in MODERN_PROTOCOL_VERSIONS else "handshake"


@contextmanager
def speaking(protocol_version: str | None) -> Iterator[None]:
    """Around one request of a client that speaks `protocol_version`."""
    token = CLIENT_ERA.set(era_of(protocol_version))
    try:
        yield
    finally:
        CLIENT_ERA.reset(token)


def seen_by_client(era: Era | None) -> bool:
    """Whether something only `era`'s leg lists (None: every leg) is there for the current client."""
    current = CLIENT_ERA.get()
    return era is None or current is None or current == era


__all__ = ["CLIENT_ERA", "Era", "era_of", "seen_by_client", "speaking"]
