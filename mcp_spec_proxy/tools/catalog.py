"""The aggregated tool list: namespacing, effect classification, argument validation.

Every backend tool appears once, as `<server><separator><tool>`; a name that is not legal, is
longer than `max_name_length`, does not split back into its own server and tool, or ends like a
hash suffix (`-<6 hex>`) is cut and given a short stable hash of its identity instead. A public
name is a function of the configured servers and its own server and tool only, never of which
other tools exist or of listing order, and no two servers can ever produce the same one (see
`public_name`); two tools of one server whose hashed names collide are both left out. A server
under `namespace: false` keeps its tools' own names, save one that another server's tool also has
(that one is prefixed while both are listed).
Annotations, titles, output schemas and `_meta` pass through unchanged; only the name (and, for
writes, the optional `intent` argument) differ from what the backend listed.

Classification (read or write, and why) is `tools/classification.py`'s. Arguments are checked before
anything is reviewed or forwarded (`tools/arguments.py`); public names are made in `tools/names.py`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import mcp_types as types

from mcp_spec_proxy.backends.era import Era, seen_by_client
from mcp_spec_proxy.calls.access import shown
from mcp_spec_proxy.config.schema import OnReject, ProxyConfig, ReviewMode
from mcp_spec_proxy.errors import ToolNotFound
from mcp_spec_proxy.tools.arguments import check_arguments
from mcp_spec_proxy.tools.classification import HELD_REASONS, Reason, classify, included
from mcp_spec_proxy.tools.fingerprints import FingerprintStore, Status, fingerprint
from mcp_spec_proxy.tools.names import public_name
from mcp_spec_proxy.trajectory import Effect

if TYPE_CHECKING:
    import jsonschema  # loaded by the first call checked: a proxy starts without it

logger = logging.getLogger(__name__)

INTENT_ARGUMENT = "intent"
# Lean on purpose: it is repeated in every write tool a client lists (the server's instructions
# say the rest); `python -m bench.retrieval` counts the bytes it adds.
INTENT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "description": "What the user asked for and why this call serves it.",
}

_Named = TypeVar("_Named")


@dataclass(frozen=True)
class CatalogTool:
    name: str
    server: str
    original: str
    definition: types.Tool  # as the client sees it
    effect: Effect
    reason: Reason
    why: str
    review: ReviewMode | None
    on_reject: OnReject | None
    fingerprint: str
    wants_intent: bool
    era: Era | None = None  # listed on this era's backend leg only (None: on every leg)

    @property
    def input_schema(self) -> Mapping[str, Any]:
        return self.definition.input_schema

    @property
    def open_world(self) -> bool:
        """The backend says the tool reaches beyond its own closed domain (`openWorldHint: true`)."""
        annotations = self.definition.annotations
        return bool(annotations and annotations.open_world_hint)


@dataclass(frozen=True)
class CatalogEntry:
    """A namespaced prompt (resources keep their URIs; see `Catalog.resource_owner`)."""

    name: str
    server: str
    original: str
    era: Era | None = None  # listed on this era's backend leg only


class ToolSource(Protocol):
    """What reviewers and the engine need of a tool list: the catalog, or a view of it."""

    def tools(self) -> list[CatalogTool]: ...

    def lookup(self, name: str) -> CatalogTool: ...

    def validate(self, tool: CatalogTool, arguments: Mapping[str, Any]) -> None: ...


CLIENT = "client"
"""The `server` of a tool the gateway's client executes itself."""


class Catalog:
    """The tools, prompts and resources of every connected backend, under their public names."""

    def __init__(self, config: ProxyConfig, fingerprints: FingerprintStore) -> None:
        self._config = config
        self._fingerprints = fingerprints
        self._listings: dict[str, list[types.Tool]] = {}
        self._only: dict[str, Mapping[str, Era]] = {}  # by server: tools one era's leg alone lists
        self._only_prompts: dict[str, Mapping[str, Era]] = {}
        self._tools: dict[str, CatalogTool] = {}
        self._by_original: dict[str, list[CatalogTool]] = {}  # by the name its server lists it under
        # The entry last built for each listed tool, reused while the tool object, its fingerprint
        # status and so its classification are the same: a listing then costs its own tools, not
        # every server's again (start-up lists one backend after another).
        self._built: dict[tuple[str, str], tuple[types.Tool, Status, CatalogTool]] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._prompts: dict[str, CatalogEntry] = {}
        self._prompt_listings: dict[str, list[types.Prompt]] = {}
        self._resources: dict[str, str] = {}
        self._resource_listings: dict[str, list[types.Resource]] = {}
        self._templates: dict[str, list[types.ResourceTemplate]] = {}
        self._shared_resources: dict[str, set[str]] = {}  # a URI two servers list: served by neither
        self._template_patterns: dict[tuple[str, str], re.Pattern[str]] = {}
        # A shared store's copy changes off the request path (a merge may find a tool held that this
        # replica's rules accepted): its tools are classified again at once.
        fingerprints.subscribe(self._rebuild)
        # Where a call to a tool of a server waiting for its login is sent (the console's queue says).
        self.login_note: Callable[[str], str | None] = lambda server: None

    # -- updates -----------------------------------------------------------------------------

    def set_tools(self, server: str, tools: list[types.Tool] | None, only: Mapping[str, Era] | None = None) -> None:
        """Replace one backend's tools (`None`: gone); `only`: those one era's leg alone lists (`era.py`)."""
        printed: dict[int, str] = {}  # by the tool object's id: a listing may repeat a name
        self._only[server] = only or {}
        if tools is None:
            self._listings.pop(server, None)
        else:
            self._listings[server] = tools
            included_tools = [tool for tool in tools if self._included(server, tool.name)]
            printed = {id(tool): fingerprint(tool) for tool in included_tools}
            self._fingerprints.observe({f"{server}/{t.name}": printed[id(t)] for t in included_tools}, server=server)
        self._rebuild(printed)

    def set_prompts(
        self, server: str, prompts: list[types.Prompt] | None, only: Mapping[str, Era] | None = None
    ) -> None:
        self._only_prompts[server] = only or {}
        if prompts is None:
            self._prompt_listings.pop(server, None)
        else:
            self._prompt_listings[server] = prompts
        named: list[tuple[str, CatalogEntry]] = []
        for name, listing in sorted(self._prompt_listings.items()):
            for prompt in listing:
                public = self._public_name(name, prompt.name)
                era = self._only_prompts.get(name, {}).get(prompt.name)
                named.append((public, CatalogEntry(public, name, prompt.name, era)))
        self._prompts = _distinct(named, lambda e: (e.server, e.original), "prompt")

    def set_resources(
        self, server: str, resources: list[types.Resource] | None, templates: list[types.ResourceTemplate] | None
    ) -> None:
        if resources is None:
            self._resource_listings.pop(server, None)
            self._templates.pop(server, None)
        else:
            self._resource_listings[server] = resources
            self._templates[server] = templates or []
        listers: dict[str, set[str]] = {}
        for name, listing in self._resource_listings.items():
            for resource in listing:
                listers.setdefault(str(resource.uri), set()).add(name)
        self._resources = {uri: next(iter(owners)) for uri, owners in listers.items() if len(owners) == 1}
        shared = {uri: owners for uri, owners in listers.items() if len(owners) > 1}
        for uri, owners in sorted(shared.items()):
            if uri not in self._shared_resources:
                logger.warning(
                    "resource %s is listed by %s; it is served by neither (remove it from all but one backend)",
                    uri[:500],
                    " and ".join(sorted(owners)),
                )
        self._shared_resources = shared
        self._template_patterns = {
            (server, t.uri_template): _template_pattern(t.uri_template)
            for server, listing in self._templates.items()
            for t in listing
        }

    async def refresh_fingerprints(self, *, settle: bool = False) -> None:
        """Re-read acceptance decisions (after `tools accept`) and reclassify: a shared store waits
        a short bound for the database (`settle`: its timeout, at start-up), then keeps its last
        copy (a tool not known accepted stays held)."""
        await self._fingerprints.refresh(settle=settle)
        self._rebuild()

    # -- queries -----------------------------------------------------------------------------

    def tools(self) -> list[CatalogTool]:
        """The tools the current client is shown, by its era and its principal's `access:` (every
        tool where no client is asking)."""
        return [tool for tool in self._tools.values() if _seen(tool)]

    def servers(self) -> list[str]:
        return sorted(self._listings)

    def lookup(self, name: str) -> CatalogTool:
        """The tool listed as `name`, else the one whose own name (its server's) it is, as an MCP App's
        page calls them; a listed name always wins, and an own name two servers share names neither."""
        tool = self._tools.get(name)
        if tool is not None and _seen(tool):
            return tool  # a tool hidden from this client is unknown to it: the same error as none
        owners = [t for t in self._by_original.get(name, ()) if _seen(t)] if tool is None else []
        if len(owners) == 1:
            return owners[0]
        if owners:
            names = " or ".join(sorted(t.name for t in owners))
            raise ToolNotFound(f"unknown tool {name!r}: several servers have a tool of that name; call {names}")
        server = name.split(self._config.separator, 1)[0] if self._config.separator in name else ""
        note = self.login_note(server) if server else None
        raise ToolNotFound(note or f"unknown tool {name!r}: it is not in the catalog (is its backend running?)")

    def validate(self, tool: CatalogTool, arguments: Mapping[str, Any]) -> None:
        """Raise `InvalidArguments` naming every problem; nothing is forwarded or reviewed before this."""
        check_arguments(self._validators, tool, arguments)

    def prompts(self) -> list[tuple[CatalogEntry, types.Prompt]]:
        by_key = {(s, p.name): p for s, listing in self._prompt_listings.items() for p in listing}
        return [
            (entry, by_key[(entry.server, entry.original)])
            for entry in self._prompts.values()
            if seen_by_client(entry.era) and shown(entry.server)
        ]

    def prompt(self, name: str) -> CatalogEntry:
        entry = self._prompts.get(name)
        if entry is None or not seen_by_client(entry.era) or not shown(entry.server):
            raise ToolNotFound(f"unknown prompt {name!r}")
        return entry

    def resources(self) -> list[tuple[str, types.Resource]]:
        """The resources served, by server; a URI two servers list is served (and listed) by neither."""
        return [
            (server, r)
            for server, listing in sorted(self._resource_listings.items())
            for r in listing
            if self._resources.get(str(r.uri)) == server and shown(server)
        ]

    def resource_templates(self) -> list[tuple[str, types.ResourceTemplate]]:
        return [(server, t) for server, listing in sorted(self._templates.items()) if shown(server) for t in listing]

    def labelled(self, server: str, name: str) -> str:
        """A resource's name as listed: headed by its server's, unless that server keeps its own names."""
        return f"{server}{self._separator}{name}" if self._config.servers[server].namespace else name

    def resource_owner(self, uri: str) -> str:
        """The backend that serves `uri` (`_owner`); a server hidden from the client serves it none."""
        server = self._owner(uri)
        if not shown(server):
            raise ToolNotFound(f"no backend serves resource {uri!r}", data={"uri": uri})
        return server

    def _owner(self, uri: str) -> str:
        """The backend that serves `uri`: the one server that listed it, else the one server one of
        whose templates matches it whole.

        A URI is never served by a server that did not list it when another did (a broader
        template cannot capture it), a URI two servers list is refused, and so is one that
        templates of two servers match: which backend answers is never decided by listing
        order or the length of a prefix a backend chose.
        """
        if uri in self._resources:
            return self._resources[uri]
        if uri in self._shared_resources:
            listers = sorted(self._shared_resources[uri])
            why = f"resource {uri!r} is listed by {' and '.join(listers)}; it is refused for both"
            raise _refused(uri, listers, why)
        servers = sorted({server for (server, _), pattern in self._template_patterns.items() if pattern.fullmatch(uri)})
        if len(servers) > 1:
            why = f"resource {uri!r} matches resource templates of {' and '.join(servers)}; it is refused for both"
            raise _refused(uri, servers, why)
        if not servers:
            raise ToolNotFound(f"no backend serves resource {uri!r}", data={"uri": uri})
        return servers[0]

    def template_owner(self, uri_template: str) -> str:
        """The backend that listed this resource template (for completions); refused when two did."""
        servers = sorted({s for s, template in self._template_patterns if template == uri_template and shown(s)})
        if len(servers) > 1:
            owners = " and ".join(servers)
            raise ToolNotFound(f"resource template {uri_template!r} is listed by {owners}; it is refused for both")
        if not servers:
            raise ToolNotFound(f"no backend lists resource template {uri_template!r}")
        return servers[0]

    # -- internals ---------------------------------------------------------------------------

    @property
    def _separator(self) -> str:
        return self._config.separator

    @property
    def _limit(self) -> int:
        return self._config.max_name_length

    def _included(self, server: str, tool: str) -> bool:
        return included(self._config.servers[server], tool)

    def _public_name(self, server: str, tool: str, namespaced: bool | None = None) -> str:
        """`namespaced`: True to prefix it whatever the server's `namespace`; None: as configured."""
        namespaced = namespaced or self._config.servers[server].namespace
        return public_name(server, tool, self._separator, self._limit, self._config.servers, namespaced=namespaced)

    def _rebuild(self, printed: Mapping[int, str] | None = None) -> None:
        """Every entry, reusing those whose tool and status are unchanged; `printed`: fingerprints
        of a listing just observed, by tool object id (its listing holds them), not computed twice."""
        printed = printed or {}
        named: list[tuple[str, CatalogTool]] = []
        built: dict[tuple[str, str], tuple[types.Tool, Status, CatalogTool]] = {}
        owners: dict[str, set[str]] = {}  # by a tool's own name: the servers that list one so named
        for server, listing in self._listings.items():
            for tool in listing:
                owners.setdefault(tool.name, set()).add(server)
        for server, listing in sorted(self._listings.items()):
            for tool in listing:
                key = (server, tool.name)
                cached = self._built.get(key)
                if cached is not None and cached[0] is tool:
                    print_ = cached[2].fingerprint  # and included, or it would not have been built
                elif id(tool) in printed:
                    print_ = printed[id(tool)]
                elif included(self._config.servers[server], tool.name):
                    print_ = fingerprint(tool)
                else:
                    continue
                status = self._fingerprints.status(f"{server}/{tool.name}", print_)
                era = self._only.get(server, {}).get(tool.name)
                # An unprefixed server's tool keeps its own name only while no other server has a
                # tool of that name: else an App's call by that name could reach the wrong server.
                shared = len(owners.get(tool.name, ())) > 1
                name = self._public_name(server, tool.name, namespaced=shared or None)
                fresh = cached is None or cached[0] is not tool or cached[1] != status
                if not fresh and cached is not None and cached[2].era == era and cached[2].name == name:
                    entry = cached[2]
                else:
                    entry = self._entry(server, tool, print_, status, era, name)
                built[key] = (tool, status, entry)
                named.append((entry.name, entry))
        self._built = built
        self._tools = _distinct(named, lambda t: (t.server, t.original), "tool")
        self._by_original = {}
        for listed in self._tools.values():
            self._by_original.setdefault(listed.original, []).append(listed)
        self._validators = {}

    def _entry(
        self, server: str, tool: types.Tool, print_: str, status: Status, era: Era | None, name: str
    ) -> CatalogTool:
        config = self._config.servers[server]
        hold_open_world = config.hold_open_world if config.hold_open_world is not None else self._config.hold_open_world
        effect, reason, why, rule = classify(config, tool, status=status, hold_open_world=hold_open_world)
        wants_intent = (
            effect == "write"
            and self._config.review.intent
            and INTENT_ARGUMENT not in (tool.input_schema.get("properties") or {})
        )
        return CatalogTool(
            name=name,
            server=server,
            original=tool.name,
            definition=_public_definition(tool, name, wants_intent),
            effect=effect,
            reason=reason,
            why=why,
            review=rule.review if rule else None,
            on_reject=rule.on_reject if rule else None,
            fingerprint=print_,
            wants_intent=wants_intent,
            era=era,
        )


def _refused(uri: str, servers: list[str], why: str) -> ToolNotFound:
    """The refusal of a resource several servers claim: naming them only to a client that sees them all."""
    if not all(shown(server) for server in servers):
        why = f"no backend serves resource {uri!r}"  # a server hidden from this client is not named to it
    return ToolNotFound(why, data={"uri": uri})


def _seen(tool: CatalogTool) -> bool:
    """Whether the client asking now sees `tool`: its era lists it, and `access:` shows it to its principal."""
    return seen_by_client(tool.era) and shown(tool.server, tool.name)


def _distinct(
    named: list[tuple[str, _Named]], identity: Callable[[_Named], tuple[str, str]], kind: str
) -> dict[str, _Named]:
    """By public name, leaving out every name two identities share (only hashed names of one
    server can: a 6-hex hash collision). Dropping all of them, rather than keeping the first,
    keeps listing order out of it: a name is listed only while it stands for exactly one tool."""
    by_name: dict[str, list[_Named]] = {}
    for name, item in named:
        by_name.setdefault(name, []).append(item)
    chosen: dict[str, _Named] = {}
    for name, items in by_name.items():
        owners = sorted({identity(item) for item in items})
        if len(owners) > 1:
            logger.warning(
                "%s name %s is shared by %s; leaving them all out (rename one in its backend)",
                kind,
                name,
                ", ".join(f"{server}/{original}" for server, original in owners),
            )
            continue
        chosen[name] = items[0]
    return chosen


def _template_pattern(uri_template: str) -> re.Pattern[str]:
    """A regex matching the URIs a template stands for, whole: literal text as written, each
    `{...}` expression one or more characters (slashes too: servers write `{path}` for deep
    paths), a query-style expression (`{?q}`, `{&q}`) possibly none."""
    parts: list[str] = []
    for literal, expression in re.findall(r"([^{]*)(\{[^}]*\}|$)", uri_template):
        parts.append(re.escape(literal))
        if expression:
            parts.append(".*" if expression[1:2] in ("?", "&") else ".+")
    return re.compile("".join(parts), re.DOTALL)


def _public_definition(tool: types.Tool, name: str, wants_intent: bool) -> types.Tool:
    """The definition a client lists: the public name, and for a write the optional `intent`.

    `intent` is never required: a call that is valid for the backend is valid for the proxy
    (the reviewer is told when none was given)."""
    update: dict[str, Any] = {"name": name}
    if wants_intent:
        schema = dict(tool.input_schema)
        properties = dict(schema.get("properties") or {})
        properties[INTENT_ARGUMENT] = INTENT_SCHEMA
        schema["properties"] = properties
        update["input_schema"] = schema
    return tool.model_copy(update=update)


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest(value: Any) -> str:
    # surrogatepass: a lone surrogate (text that is not valid Unicode) still hashes, never raises.
    return hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def is_held(tool: CatalogTool) -> bool:
    """A tool whose definition changed or that is new: nobody's call of it runs until accepted."""
    return tool.reason in HELD_REASONS


def strip_intent(tool: CatalogTool, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The arguments the backend gets, and the intent the reviewer gets."""
    args = dict(arguments)
    if not tool.wants_intent:
        return args, None
    intent = args.pop(INTENT_ARGUMENT, None)
    return args, str(intent) if intent is not None else None
