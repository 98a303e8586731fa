"""What one backend lists: its tools, prompts, resources and resource templates, every page."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError
from mcp_types import METHOD_NOT_FOUND

from mcp_spec_proxy.backends.era import Era

logger = logging.getLogger(__name__)

_PAGE_CAP = 50


@dataclass
class Listing:
    tools: list[types.Tool] = field(default_factory=list)
    prompts: list[types.Prompt] = field(default_factory=list)
    resources: list[types.Resource] = field(default_factory=list)
    templates: list[types.ResourceTemplate] = field(default_factory=list)
    # Tools and prompts that only one era's leg lists, by name: shown to that era's clients only.
    only_tools: dict[str, Era] = field(default_factory=dict)
    only_prompts: dict[str, Era] = field(default_factory=dict)
    # The lists ("tools", "prompts", "resources") the server announced changed: clients are told, as
    # they would be directly, even where the proxy's copy came out the same.
    announced: frozenset[str] = frozenset()

    def beside(self, other: Listing, era: Era, other_era: Era) -> Listing:
        """This leg's listing (its clients speak `era`) with what only `other`'s (`other_era`) lists.
        A name both list keeps this leg's definition: one definition per tool, one fingerprint."""
        tools = {t.name for t in self.tools}
        others = {t.name for t in other.tools}
        prompts = {p.name for p in self.prompts}
        other_prompts = {p.name for p in other.prompts}
        uris = {str(r.uri) for r in self.resources}
        shapes = {t.uri_template for t in self.templates}
        return Listing(
            tools=[*self.tools, *(t for t in other.tools if t.name not in tools)],
            prompts=[*self.prompts, *(p for p in other.prompts if p.name not in prompts)],
            resources=[*self.resources, *(r for r in other.resources if str(r.uri) not in uris)],
            templates=[*self.templates, *(t for t in other.templates if t.uri_template not in shapes)],
            only_tools=_only(tools, others, era, other_era),
            only_prompts=_only(prompts, other_prompts, era, other_era),
        )


def _only(mine: set[str], theirs: set[str], era: Era, other_era: Era) -> dict[str, Era]:
    return {**{name: era for name in mine - theirs}, **{name: other_era for name in theirs - mine}}


OnListing = Callable[[str, Listing | None], Awaitable[None]]
"""Called with a backend's name and its fresh listing, or None when it goes away."""


async def list_all(client: Client, *, refresh: bool = False) -> Listing:
    """Everything `client`'s server lists (cached pages unless `refresh`)."""
    mode: Any = "refresh" if refresh else "use"
    caps = client.server_capabilities
    listing = Listing()
    if caps.tools is not None:
        listing.tools = await _all_pages(lambda c: client.list_tools(cursor=c, cache_mode=mode), "tools")
    if caps.prompts is not None:
        listing.prompts = await _all_pages(lambda c: client.list_prompts(cursor=c, cache_mode=mode), "prompts")
    if caps.resources is not None:
        listing.resources = await _all_pages(lambda c: client.list_resources(cursor=c, cache_mode=mode), "resources")
        listing.templates = await _all_pages(
            lambda c: client.list_resource_templates(cursor=c, cache_mode=mode), "resource_templates"
        )
    return listing


async def _all_pages(fetch: Callable[[str | None], Awaitable[Any]], attribute: str) -> list[Any]:
    items: list[Any] = []
    cursor: str | None = None
    try:
        for _ in range(_PAGE_CAP):
            page = await fetch(cursor)
            items.extend(getattr(page, attribute))
            cursor = page.next_cursor
            if cursor is None:
                break
    except MCPError as exc:
        # Servers announce capabilities they only half implement (resources without templates).
        if exc.code != METHOD_NOT_FOUND:
            raise
        logger.debug("%s/list not implemented; treating as empty", attribute)
    return items


__all__ = ["Listing", "OnListing", "list_all"]
