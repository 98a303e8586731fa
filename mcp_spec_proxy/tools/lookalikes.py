"""Tools of different servers that look alike, and which of those servers the user trusts more.

Any backend can list a copy of another server's tool: the same name (`transfer`), or the same
description under a name of its own. A client that reads only a few search hits, and a reviewer
that reads a call's tool name, must not take one for the other, and which one a client is shown
must not depend on how the servers' names sort (a backend chooses nothing about the config, but
an operator may well name a server `acme`). So:

* two tools of two servers **look alike** when their names are the same words (`Transfer`,
  `transfer`, `transfer_`: `toolwords.words` of the name, stop words kept) or their descriptions
  are (at least `MIN_DESCRIPTION_WORDS` of them, equal once case, punctuation, plurals and common
  words are folded away). Equal keys, not a similarity score: a catalog of thousands is grouped
  in one pass, and a look-alike is something a person can check by eye;
* `preference` orders the servers the user trusts more first: those whose annotations the user
  trusts (`trust_annotations: true`) before those whose annotations are ignored, then in the
  order the config lists them. Never by name.

Search (`toolsearch`) shows a set of look-alikes as one hit, the tool of the most trusted server,
with the others beside it; the verifier's prompt names a held call's server and its look-alikes
on other servers (`prompts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.tools.words import words

MIN_DESCRIPTION_WORDS = 3
"""A description of fewer words ("Deprecated.") says too little to make two tools alike."""
NAME_CHARS = 200
DESCRIPTION_CHARS = 1500
"""What of a name and a description is compared (the same cuts search indexes)."""

Key = tuple[str, ...]


def name_key(tool: CatalogTool) -> Key:
    return ("name", *words(tool.original[:NAME_CHARS], keep_stop=True))


def description_key(tool: CatalogTool) -> Key | None:
    found = words((tool.definition.description or "")[:DESCRIPTION_CHARS])
    return ("description", *found) if len(found) >= MIN_DESCRIPTION_WORDS else None


def keys(tool: CatalogTool) -> tuple[Key, ...]:
    """What makes another server's tool a look-alike of this one: either key equal."""
    described = description_key(tool)
    return (name_key(tool),) if described is None else (name_key(tool), described)


def preference(servers: Mapping[str, ServerConfig]) -> dict[str, int]:
    """Each configured server's rank, 0 for the most trusted (see the module docstring)."""
    order = sorted(enumerate(servers.items()), key=lambda item: (not item[1][1].trust_annotations, item[0]))
    return {name: rank for rank, (_, (name, _)) in enumerate(order)}


def groups(tools: Sequence[CatalogTool], tool_keys: Sequence[tuple[Key, ...]]) -> list[int]:
    """Per tool, the index of the first tool of its set of look-alikes (itself when it has none).

    Only keys that two servers share join tools, and joining is transitive: a copy of a copy is
    in the same set."""
    parent = list(range(len(tools)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    holders: dict[Key, list[int]] = {}
    for index, own in enumerate(tool_keys):
        for key in own:
            holders.setdefault(key, []).append(index)
    for members in holders.values():
        if len({tools[i].server for i in members}) > 1:
            first = root(members[0])
            for other in members[1:]:
                parent[root(other)] = first
    roots = [root(i) for i in range(len(tools))]
    least: dict[int, int] = {}
    for index, r in enumerate(roots):
        least.setdefault(r, index)
    return [least[r] for r in roots]


def lookalikes(tool: CatalogTool, tools: Sequence[CatalogTool]) -> list[CatalogTool]:
    """The tools of other servers whose names are the same words as `tool`'s (the verifier's
    prompt: names only, since every review would otherwise fold every description again)."""
    own = name_key(tool)
    return [other for other in tools if other.server != tool.server and name_key(other) == own]
