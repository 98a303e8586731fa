"""A backend tool's public name: `<server><separator><tool>`, legal, bounded, and never another's.

A public name is a function of the configured servers and its own server and tool only, never of
which other tools exist or of listing order, and no two servers can ever produce the same one
(`public_name`); the catalog leaves out both tools of one server whose hashed names collide.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection

_ILLEGAL = re.compile(r"[^A-Za-z0-9_.-]")
RESERVED_NAMES = frozenset({"delegate", "report_outcome", "search_tools", "call_tool"})
"""The proxy's own tools' names (fronts/own_tools.py, fronts/catalog_search.py): never a backend's."""
_HASHED = re.compile(r"-[0-9a-f]{6}\Z")


def public_name(
    server: str, tool: str, separator: str, limit: int, servers: Collection[str] = (), *, namespaced: bool = True
) -> str:
    """`<server><sep><tool>`, legal characters only, at most `limit` long.

    A server configured with `namespace: false` keeps its tools' own names where they are legal,
    fit, do not end like a hash suffix, are not one of the proxy's own tools' names and do not start
    like any configured server's namespaced names (`<server><sep>`): such a server can never take a
    name that lies in another's namespace. Any other of its names is made as a namespaced server's
    would be, and so is one another server's tool also has as its own name (the catalog decides that).

    The plain name is kept only when it is legal, fits, splits back at its first separator into
    this very server and tool (`a_` + `x` and `a` + `_x` both spell `a___x`) and does not end
    like a hash suffix (`-<6 hex>`). Any other name is cut and gets a 6-hex hash of its identity
    (`server/tool`). So a plain name decodes to one server and tool, and can never equal a
    hashed one. A hashed name keeps `<server><sep>` whole (config guarantees room for it), and
    where it would start like a longer configured server's names (`a` + `__` + `_x y` would read
    `a___x_y`, where server `a_`'s names live; `servers` are the configured names) a `.` follows
    the separator, which no server name holds: every hashed name lies where only its own server's
    names do, so no crafted tool of another server can hash to it. A name depends on nothing but
    these arguments, so it never moves to another tool when a backend comes or goes.
    """
    if not namespaced and (
        len(tool) <= limit
        and not _ILLEGAL.search(tool)
        and not _HASHED.search(tool)
        and tool not in RESERVED_NAMES
        and not any(tool.startswith(f"{other}{separator}") for other in (*servers, server))
    ):
        return tool
    plain = f"{server}{separator}{tool}"
    name = _ILLEGAL.sub("_", plain)
    if (
        len(name) <= limit
        and name == plain
        and plain.split(separator, 1) == [server, tool]
        and not _HASHED.search(name)
    ):
        return name
    head = f"{server}{separator}"
    if any(
        other != server and f"{other}{separator}".startswith(head) and name.startswith(f"{other}{separator}")
        for other in servers
    ):
        name = f"{head}.{name[len(head) :]}"
    return _with_suffix(name, f"{server}/{tool}", limit)


def _with_suffix(name: str, identity: str, limit: int) -> str:
    suffix = hashlib.sha256(identity.encode()).hexdigest()[:6]
    return f"{name[: limit - 7]}-{suffix}"


__all__ = ["RESERVED_NAMES", "public_name"]
