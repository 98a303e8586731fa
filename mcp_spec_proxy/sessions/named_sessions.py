"""Which session a 2026-07-28 request over HTTP continues: the one it names.

That era has no `Mcp-Session-Id`; a client groups its calls (so a write's reviewer sees the reads
before it) by naming a session in the `Mcp-Spec-Proxy-Session` header or in
`_meta["mcp-spec-proxy/session"]`. A request that names none is a session of its own, and the
front says once how to name one. Sessions are kept by name, the least recently used forgotten
past `MAX_NAMED_SESSIONS`. Under `auth:` a name is its principal's own: another principal's token
naming it names another session, never the first one's trajectory. A write of a request that named
no session says so on its result (`Session.alone`): the log line reaches the operator, the notice
the client and whoever reads its transcript.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.sessions.barrier import Session
from mcp_spec_proxy.tools.catalog import digest

logger = logging.getLogger(__name__)

SESSION_HEADER = "mcp-spec-proxy-session"
SESSION_META = "mcp-spec-proxy/session"
MAX_NAMED_SESSIONS = 4096  # 2026-07-28 sessions kept by name; the least recently used goes first


class NamedSessions:
    """The 2026-07-28 sessions by name (and principal)."""

    def __init__(self, new_session: Callable[[str | None, Principal | None], Session]) -> None:
        self._new = new_session
        self._named: OrderedDict[str, Session] = OrderedDict()
        self._told_unnamed = False  # the warning about requests that name no session: once per front

    def session(self, request: object, meta: object, principal: Principal | None) -> Session:
        """The session a request (its HTTP request and `_meta`) names, made on first use."""
        name = session_name(request, meta, principal)
        if name is None:
            self._tell_unnamed()
            alone = self._new(None, principal)  # a request that names no session is its own
            alone.alone = True  # its write's result says so (`sessions/barrier.py`)
            return alone
        named = self._named.pop(name, None) or self._new(session_key(name), principal)
        self._named[name] = named
        while len(self._named) > MAX_NAMED_SESSIONS:
            self._named.popitem(last=False)
        return named

    def _tell_unnamed(self) -> None:
        # A client that sends each call as its own request (fastmcp's does) keeps its reads from a write's reviewer.
        if self._told_unnamed:
            return
        self._told_unnamed = True
        logger.warning(
            "a 2026-07-28 request over HTTP named no session: each such request is a session of its own, so"
            " the reviewer of a write sees none of the client's earlier reads; to group a conversation's calls,"
            " send the header `%s: <one name per conversation>` on every request (or _meta[%r])",
            "Mcp-Spec-Proxy-Session",
            SESSION_META,
        )


def session_key(name: str) -> str:
    """The id of the session `name` (as `session_name` gives it) names: what its audit lines and the
    store call it. A digest: a client's name may be long or odd, and under `auth:` it holds the principal."""
    return "named-" + digest(name)[:12]


def keys_of_name(name: str, principals: Iterable[Principal]) -> list[str]:
    """Every id a session a client named `name` may have: named with no principal (stdio, no `auth:`),
    or by one of `principals` (`mcp-spec-proxy audit --session NAME` finds its lines by these)."""
    name = name[:256]
    return [session_key(name), *(session_key(f"{principal.key}\n{name}") for principal in principals)]


def session_name(request: object, meta: object, principal: Principal | None) -> str | None:
    """The session a 2026-07-28 request names: its header, else its `_meta`; None when it names none.
    A name is its principal's own (the key is prefixed with the principal's)."""
    headers: Any = getattr(request, "headers", None)
    name = headers.get(SESSION_HEADER) if headers is not None else None
    if not name:
        meta = meta or {}
        value = meta.get(SESSION_META) if isinstance(meta, Mapping) else getattr(meta, SESSION_META, None)
        name = value if isinstance(value, str) else None
    if not name:
        return None
    return name[:256] if principal is None else f"{principal.key}\n{name[:256]}"


__all__ = [
    "MAX_NAMED_SESSIONS",
    "SESSION_HEADER",
    "SESSION_META",
    "NamedSessions",
    "keys_of_name",
    "session_key",
    "session_name",
]
