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

logger = logging.getLogger(__name__)

_PAGE_CAP = 50


@dataclass
class Listing:
    tools: list[types.Tool] = field(default_factory=list)
    prompts: list[types.Prompt] = field(default_factory=list)
    resources: list[types.Resource] = field(default_factory=list)
    templates: list[types.ResourceTemplate] = field(default_factory=list)


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
