"""The catalog's search mode on the MCP front: `search_tools` and `call_tool`.

Under `catalog: {mode: search}` a client lists two meta-tools (and the proxy's own tools) instead
of every backend tool, so a catalog of thousands of tools costs it a search result, not the whole
list. `search_tools` ranks the callable tools for a request in words (`tools/search.py`) and answers
each hit's public name, server, effect (read or write) and input schema as the client would have
listed it (a write's schema with its `intent` argument). A hit with look-alikes on other servers
(`lookalikes`) is the most trusted server's tool; it names the others, each with its server, and
says so in a `note`, so a client can tell whose tool it calls.

`call_tool {name, arguments}` is no second way to a backend: `route` rewrites it into the
`tools/call` it stands for, and the front carries on with that request exactly as if the client
had sent it — the barrier, the tool's reviewer at the gate, the approval ticket bound to the real
tool and arguments, the audit story under the real tool's name. What it refuses itself, as an
error result the client model can read: a malformed meta-call, a name that is not in the catalog,
and a held tool (changed or new since its server's first listing: search never offers one, and
neither this nor a direct `tools/call` runs it until `mcp-spec-proxy tools accept`).

`access:` sees both meta-tools as tools of the server `mcp-spec-proxy` (`config/identity.OWN_SERVER`):
one a rule hides is not listed to that principal, and its call is the call of a tool that does not exist.

In search mode `notifications/tools/list_changed` says nothing a client needs: its list (these
meta-tools) never changes, and every search reads the live catalog. The front does not send it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import mcp_types as types

from mcp_spec_proxy.calls.access import shown
from mcp_spec_proxy.config.identity import OWN_SERVER
from mcp_spec_proxy.errors import ToolNotFound
from mcp_spec_proxy.leash.encoders import Encoder, HashingEncoder
from mcp_spec_proxy.leash.local_model import local_encoder
from mcp_spec_proxy.proxy import Proxy
from mcp_spec_proxy.sessions.barrier import error_result
from mcp_spec_proxy.tools.catalog import CatalogTool, is_held
from mcp_spec_proxy.tools.lookalikes import preference
from mcp_spec_proxy.tools.search import SEARCH_HASH_DIM, Hit, ToolIndex

SEARCH = "search_tools"
CALL = "call_tool"
MAX_QUERY_CHARS = 1000
LOOKALIKE_DESCRIPTION_CHARS = 300
"""What of a look-alike's description a hit shows: enough to tell two tools apart, never a second listing."""
ACCEPT_RECHECK_S = 10.0
"""While some tool is held, a search rereads the operator's `tools accept` decisions at most this often."""


def search_tool(most: int) -> types.Tool:
    return types.Tool(
        name=SEARCH,
        title="Search the tools",
        description=(
            "Find tools for a task: describe it in plain words. Returns the best matches, each with its name,"
            " server, effect (read: runs at once; write: reviewed before it runs) and inputSchema. Then run one"
            f" with {CALL}."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you want to do, in words."},
                "limit": {"type": "integer", "minimum": 1, "maximum": most, "default": most},
            },
            "required": ["query"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )


CALL_TOOL = types.Tool(
    name=CALL,
    title="Call a tool found by search",
    description=(
        f"Run a tool that {SEARCH} found: `name` as it returned it, `arguments` as its inputSchema asks"
        " (a write tool's `intent` among them)."
    ),
    input_schema={
        "type": "object",
        "properties": {"name": {"type": "string"}, "arguments": {"type": "object"}},
        "required": ["name"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
)


def search_encoder(proxy: Proxy) -> Encoder:
    """LEASH's embedding encoder where one is configured (the same client); else the small model in
    process where the `embeddings` extra is installed (`leash/local_model.py`); else hashing."""
    leash = proxy.leash
    if leash is not None and leash.config.encoder == "embedding":
        return leash.encoder
    if proxy.config.catalog.rank != "words":
        local = local_encoder()
        if local is not None:
            return local
    return HashingEncoder(dim=SEARCH_HASH_DIM)


class CatalogSearch:
    """The meta-tools of search mode and the routing of their calls."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        config = proxy.config.catalog
        self.most = config.results
        trust = preference(proxy.config.servers)
        self.index = ToolIndex(proxy.catalog.tools, search_encoder(proxy), config.rank, trust)
        self._accepts_read = time.monotonic()

    def definitions(self) -> list[types.Tool]:
        """The meta-tools the client asking now is shown (`access:` may hide each)."""
        return [tool for tool in (search_tool(self.most), CALL_TOOL) if shown(OWN_SERVER, tool.name)]

    def owns(self, name: str) -> bool:
        """Whether `name` is a meta-tool's the client asking now may call: its calls are ours."""
        return name in (SEARCH, CALL) and shown(OWN_SERVER, name)

    async def route(self, params: types.CallToolRequestParams) -> types.CallToolResult | types.CallToolRequestParams:
        """A result for a search or a refused call; else the `tools/call` request to carry on with."""
        arguments = params.arguments or {}
        owned = self.owns(params.name)  # a meta-tool hidden from this client is no tool of its
        if owned and params.name == SEARCH:
            return await self._search(arguments)
        if owned and params.name == CALL:
            name, inner = arguments.get("name"), arguments.get("arguments", {})
            if not isinstance(name, str) or not name:
                return error_result(f"{CALL} needs `name`: a tool name that {SEARCH} returned")
            if not isinstance(inner, dict):
                return error_result(f"{CALL}: `arguments` must be an object, as {name}'s inputSchema describes")
            try:
                tool = self.proxy.catalog.lookup(name)
            except ToolNotFound:
                return error_result(f"{CALL}: there is no tool {name!r}; {SEARCH} finds the tools there are")
            refused = await self._held(tool)
            if refused is not None:
                return refused
            # The request this meta-call stands for: everything else (its approval answers) unchanged.
            return params.model_copy(update={"name": name, "arguments": inner})
        try:
            tool = self.proxy.catalog.lookup(params.name)
        except ToolNotFound:
            return params  # the barrier answers an unknown name as it always does
        return await self._held(tool) or params

    async def _reread_accepts(self) -> None:
        """A tool accepted since (`tools accept` in another process) becomes findable without a restart."""
        now = time.monotonic()
        if now - self._accepts_read >= ACCEPT_RECHECK_S and any(is_held(t) for t in self.proxy.catalog.tools()):
            self._accepts_read = now
            await self.proxy.catalog.refresh_fingerprints()

    async def _held(self, tool: CatalogTool) -> types.CallToolResult | None:
        """The refusal of a held tool, or None. `tools accept` may have run since: reread then."""
        if is_held(tool):
            await self.proxy.catalog.refresh_fingerprints()
            tool = self.proxy.catalog.lookup(tool.name)
        if not is_held(tool):
            return None
        return error_result(
            f"{tool.name} is held and cannot be called: {tool.why}. Until the operator accepts it"
            f" (`mcp-spec-proxy tools accept {tool.name}`), {SEARCH} does not offer it."
        )

    async def _search(self, arguments: dict[str, Any]) -> types.CallToolResult:
        query, limit = arguments.get("query"), arguments.get("limit", self.most)
        if not isinstance(query, str) or not query.strip():
            return error_result(f"{SEARCH} needs `query`: what you want to do, in words")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= self.most:
            return error_result(f"{SEARCH}: `limit` must be a whole number from 1 to {self.most}")
        await self._reread_accepts()
        hits = await self.index.search(query[:MAX_QUERY_CHARS], limit)
        return types.CallToolResult(content=[types.TextContent(type="text", text=results_text(hits))])


def results_text(hits: list[Hit]) -> str:
    """What a search answers: compact JSON of the hits, best first."""
    if not hits:
        return json.dumps({"tools": [], "note": "no tool matches; try other words"}, separators=(",", ":"))
    return json.dumps({"tools": [as_json(hit) for hit in hits]}, ensure_ascii=False, separators=(",", ":"))


def as_json(hit: Hit) -> dict[str, Any]:
    """One search hit as the client reads it."""
    tool = hit.tool
    definition = tool.definition
    found: dict[str, Any] = {"name": tool.name, "server": tool.server, "effect": tool.effect}
    if definition.title:
        found["title"] = definition.title
    found["description"] = definition.description or ""
    found["inputSchema"] = definition.input_schema
    if hit.also:
        found["also"] = [lookalike(other, tool) for other in hit.also]
        found["note"] = (
            f"Other servers offer a tool that looks like this one (also). This is the one of server {tool.server!r},"
            " the one your configuration trusts most; call another only if the task asks for its server."
        )
    return found


def lookalike(other: CatalogTool, hit: CatalogTool) -> dict[str, Any]:
    """A look-alike beside a hit: whose it is, and, unless it is an exact copy, what it says it does."""
    shown: dict[str, Any] = {"name": other.name, "server": other.server, "effect": other.effect}
    if other.fingerprint != hit.fingerprint:
        shown["description"] = (other.definition.description or "")[:LOOKALIKE_DESCRIPTION_CHARS]
    return shown
