"""What a backend tells its clients unasked: log messages and resource updates, relayed upward.

A backend's `notifications/message` and `notifications/resources/updated` (or, on the
2026-07-28 era, a resource update on its `subscriptions/listen` stream) become a `Notice`
handed to the pool's `on_notice`; the fronts pass it to their clients. Nothing here reads or
changes what the backend sent: `params` are its own, with its server's name beside them.

Log messages of the 2026-07-28 era are request-scoped: a client opts in on its own request
(`_meta` `io.modelcontextprotocol/logLevel`) and hears the messages on that request. The front
sets `request_logs` to a `LogRoute` while it serves such a request; a backend that forwards a
call under it stamps the level on the request it sends and delivers its messages to the route
while the call is in flight. A context variable, because the route has to cross the barrier
and the gate, which have no business carrying it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import get_args

import mcp_types as types

LEVELS: tuple[types.LoggingLevel, ...] = get_args(types.LoggingLevel)
"""Log levels, least severe first (RFC 5424 order, as the spec's `LoggingLevel` lists them)."""


def admits(threshold: types.LoggingLevel | None, level: types.LoggingLevel) -> bool:
    """Whether a message at `level` passes a client's `threshold` (None: the client set none)."""
    return threshold is None or LEVELS.index(level) >= LEVELS.index(threshold)


@dataclass(frozen=True)
class LogMessage:
    server: str
    params: types.LoggingMessageNotificationParams

    @property
    def logger(self) -> str:
        """The logger the client sees: the server's name, then the backend's own logger if any."""
        own = self.params.logger
        return f"{self.server}/{own}" if own else self.server


@dataclass(frozen=True)
class ResourceUpdate:
    server: str
    uri: str


Notice = LogMessage | ResourceUpdate
OnNotice = Callable[[Notice], Awaitable[None]]


@dataclass(frozen=True, eq=False)
class LogRoute:
    """Where a 2026-07-28 request's log messages go: its opt-in level and its response stream."""

    level: types.LoggingLevel
    deliver: Callable[[LogMessage], Awaitable[None]]


request_logs: ContextVar[LogRoute | None] = ContextVar("mcp_spec_proxy.request_logs", default=None)
