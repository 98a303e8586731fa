"""The aggregated tool list: namespacing, effect classification, argument validation.

Every backend tool appears once, as `<server><separator><tool>`, cut to `max_name_length` with a
short stable hash suffix where it would be longer or would collide. Annotations, titles, output
schemas and `_meta` pass through unchanged; only the name (and, for writes, the optional
`intent` argument) differ from what the backend listed.

Classification, first rule that speaks wins:
  1. a definition that changed since it was first seen  → write, until `tools accept NAME`
  2. a config override with `hold: true`                → write
  3. a config override with `read_only: true|false`     → read / write
  4. `readOnlyHint: true` from a trusted server         → read
  5. anything else (unannotated, untrusted, false)      → write
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import jsonschema
import mcp_types as types

from mcp_spec_proxy.config import OnReject, ProxyConfig, ReviewMode, ServerConfig, ToolOverride
from mcp_spec_proxy.errors import InvalidArguments, ToolNotFound
from mcp_spec_proxy.fingerprints import FingerprintStore, fingerprint
from mcp_spec_proxy.trajectory import Effect

INTENT_ARGUMENT = "intent"
INTENT_SCHEMA: dict[str, Any] = {
    "type": "string",
    "description": (
        "What the user asked for and why this call serves it, in one or two sentences. "
        "A reviewer reads it before the call is allowed to change anything."
    ),
}

_ILLEGAL = re.compile(r"[^A-Za-z0-9_.-]")

Reason = Literal["changed-definition", "hold", "override", "annotation", "default"]


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

    @property
    def input_schema(self) -> Mapping[str, Any]:
        return self.definition.input_schema


@dataclass(frozen=True)
class CatalogEntry:
    """A namespaced prompt (resources keep their URIs; see `Catalog.resource_owner`)."""

    name: str
    server: str
    original: str


def public_name(server: str, tool: str, separator: str, limit: int) -> str:
    """`<server><sep><tool>`, legal characters only, at most `limit` long.

    A name that had to be changed (illegal characters, too long) or that does not split back at
    its first separator into this very server and tool (`a_` + `x` and `a` + `_x` both spell
    `a___x`) gets a short hash of its identity: a name never depends on which other tools exist,
    so it never moves to another server's tool when a backend comes or goes.
    """
    plain = f"{server}{separator}{tool}"
    name = _ILLEGAL.sub("_", plain)
    if len(name) <= limit and name == plain and plain.split(separator, 1) == [server, tool]:
        return name
    return _with_suffix(name, f"{server}/{tool}", limit)


def _with_suffix(name: str, identity: str, limit: int) -> str:
    suffix = hashlib.sha256(identity.encode()).hexdigest()[:6]
    return f"{name[: limit - 7]}-{suffix}"


def _override(server: ServerConfig, tool: str) -> tuple[str, ToolOverride] | None:
    for pattern, rule in server.tools.overrides.items():
        if fnmatch.fnmatchcase(tool, pattern):
            return pattern, rule
    return None


def included(server: ServerConfig, tool: str) -> bool:
    tools = server.tools
    return any(fnmatch.fnmatchcase(tool, p) for p in tools.include) and not any(
        fnmatch.fnmatchcase(tool, p) for p in tools.exclude
    )


def classify(
    server: ServerConfig, tool: types.Tool, *, changed: bool
) -> tuple[Effect, Reason, str, ToolOverride | None]:
    matched = _override(server, tool.name)
    rule = matched[1] if matched else None
    if changed:
        return "write", "changed-definition", "definition changed since first seen; accept it with `tools accept`", rule
    if matched and rule and rule.hold:
        return "write", "hold", f"override {matched[0]!r}: hold", rule
    if matched and rule and rule.read_only is not None:
        effect: Effect = "read" if rule.read_only else "write"
        return effect, "override", f"override {matched[0]!r}: read_only: {str(rule.read_only).lower()}", rule
    hint = tool.annotations.read_only_hint if tool.annotations else None
    if hint is True and server.trust_annotations:
        return "read", "annotation", "readOnlyHint: true", rule
    if hint is True:
        return "write", "default", "readOnlyHint ignored: trust_annotations is false", rule
    if hint is False:
        return "write", "annotation", "readOnlyHint: false", rule
    return "write", "default", "no readOnlyHint: unannotated tools are writes", rule


class ToolSource(Protocol):
    """What reviewers and the engine need of a tool list: the catalog, or a view of it."""

    def tools(self) -> list[CatalogTool]: ...

    def lookup(self, name: str) -> CatalogTool: ...

    def validate(self, tool: CatalogTool, arguments: Mapping[str, Any]) -> None: ...


CLIENT = "client"
"""The `server` of a tool the gateway's client executes itself."""


class ClientToolView:
    """The catalog (optionally) plus tools an OpenAI-style client brought and will execute itself.

    A client tool is a read when its name matches one of `read_only` (globs), else a write; its
    name is used as given, so it must not collide with a catalog name (the catalog wins).
    """

    def __init__(self, catalog: Catalog | None, definitions: list[dict[str, Any]], read_only: list[str]) -> None:
        self._catalog = catalog
        self._client: dict[str, CatalogTool] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        for definition in definitions:
            function = definition.get("function") or {}
            name = function.get("name")
            if not isinstance(name, str) or (catalog is not None and name in {t.name for t in catalog.tools()}):
                continue
            schema = function.get("parameters") or {"type": "object", "properties": {}}
            read = any(fnmatch.fnmatchcase(name, pattern) for pattern in read_only)
            self._client[name] = CatalogTool(
                name=name,
                server=CLIENT,
                original=name,
                definition=types.Tool(name=name, description=function.get("description"), input_schema=schema),
                effect="read" if read else "write",
                reason="override" if read else "default",
                why="client tool " + ("matching a read-only pattern" if read else "not known to be read-only"),
                review=None,
                on_reject=None,
                fingerprint="",
                wants_intent=False,
            )

    def tools(self) -> list[CatalogTool]:
        return [*(self._catalog.tools() if self._catalog else []), *self._client.values()]

    def lookup(self, name: str) -> CatalogTool:
        if name in self._client:
            return self._client[name]
        if self._catalog is None:
            raise ToolNotFound(f"unknown tool {name!r}")
        return self._catalog.lookup(name)

    def validate(self, tool: CatalogTool, arguments: Mapping[str, Any]) -> None:
        if tool.server != CLIENT:
            assert self._catalog is not None
            self._catalog.validate(tool, arguments)
            return
        check_arguments(self._validators, tool, arguments)


class Catalog:
    """The tools, prompts and resources of every connected backend, under their public names."""

    def __init__(self, config: ProxyConfig, fingerprints: FingerprintStore) -> None:
        self._config = config
        self._fingerprints = fingerprints
        self._listings: dict[str, list[types.Tool]] = {}
        self._tools: dict[str, CatalogTool] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._prompts: dict[str, CatalogEntry] = {}
        self._prompt_listings: dict[str, list[types.Prompt]] = {}
        self._resources: dict[str, str] = {}
        self._resource_listings: dict[str, list[types.Resource]] = {}
        self._templates: dict[str, list[types.ResourceTemplate]] = {}

    # -- updates -----------------------------------------------------------------------------

    def set_tools(self, server: str, tools: list[types.Tool] | None) -> None:
        """Replace one backend's tools (`None`: the backend is gone)."""
        if tools is None:
            self._listings.pop(server, None)
        else:
            self._listings[server] = tools
            self._fingerprints.observe(
                {f"{server}/{tool.name}": fingerprint(tool) for tool in tools if self._included(server, tool.name)}
            )
        self._rebuild()

    def set_prompts(self, server: str, prompts: list[types.Prompt] | None) -> None:
        if prompts is None:
            self._prompt_listings.pop(server, None)
        else:
            self._prompt_listings[server] = prompts
        self._prompts = {}
        for name, listing in sorted(self._prompt_listings.items()):
            for prompt in listing:
                public = self._unique(
                    public_name(name, prompt.name, self._separator, self._limit), self._prompts, self._limit
                )
                self._prompts[public] = CatalogEntry(public, name, prompt.name)

    def set_resources(
        self, server: str, resources: list[types.Resource] | None, templates: list[types.ResourceTemplate] | None
    ) -> None:
        if resources is None:
            self._resource_listings.pop(server, None)
            self._templates.pop(server, None)
        else:
            self._resource_listings[server] = resources
            self._templates[server] = templates or []
        self._resources = {}
        for name, listing in sorted(self._resource_listings.items()):
            for resource in listing:
                self._resources.setdefault(str(resource.uri), name)

    def refresh_fingerprints(self) -> None:
        """Re-read acceptance decisions (after `tools accept`) and reclassify."""
        self._fingerprints.reload()
        self._rebuild()

    # -- queries -----------------------------------------------------------------------------

    def tools(self) -> list[CatalogTool]:
        return list(self._tools.values())

    def servers(self) -> list[str]:
        return sorted(self._listings)

    def lookup(self, name: str) -> CatalogTool:
        try:
            return self._tools[name]
        except KeyError:
            raise ToolNotFound(f"unknown tool {name!r}: it is not in the catalog (is its backend running?)") from None

    def validate(self, tool: CatalogTool, arguments: Mapping[str, Any]) -> None:
        """Raise `InvalidArguments` naming every problem; nothing is forwarded or reviewed before this."""
        check_arguments(self._validators, tool, arguments)

    def prompts(self) -> list[tuple[CatalogEntry, types.Prompt]]:
        by_key = {(s, p.name): p for s, listing in self._prompt_listings.items() for p in listing}
        return [(entry, by_key[(entry.server, entry.original)]) for entry in self._prompts.values()]

    def prompt(self, name: str) -> CatalogEntry:
        try:
            return self._prompts[name]
        except KeyError:
            raise ToolNotFound(f"unknown prompt {name!r}") from None

    def resources(self) -> list[tuple[str, types.Resource]]:
        return [(server, r) for server, listing in sorted(self._resource_listings.items()) for r in listing]

    def resource_templates(self) -> list[tuple[str, types.ResourceTemplate]]:
        return [(server, t) for server, listing in sorted(self._templates.items()) for t in listing]

    def resource_owner(self, uri: str) -> str:
        """The backend that serves `uri`: an exact listing first, then a template's literal prefix."""
        if uri in self._resources:
            return self._resources[uri]
        best: tuple[int, str] | None = None
        for server, template in self.resource_templates():
            prefix = template.uri_template.split("{", 1)[0]
            if uri.startswith(prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), server)
        if best is None:
            raise ToolNotFound(f"no backend serves resource {uri!r}")
        return best[1]

    # -- internals ---------------------------------------------------------------------------

    @property
    def _separator(self) -> str:
        return self._config.separator

    @property
    def _limit(self) -> int:
        return self._config.max_name_length

    def _included(self, server: str, tool: str) -> bool:
        return included(self._config.servers[server], tool)

    @staticmethod
    def _unique(name: str, taken: Mapping[str, object], limit: int) -> str:
        candidate, n = name, 1
        while candidate in taken:
            n += 1
            candidate = _with_suffix(name, f"{name}#{n}", min(len(name) + 7, limit))
        return candidate

    def _rebuild(self) -> None:
        tools: dict[str, CatalogTool] = {}
        for server, listing in sorted(self._listings.items()):
            config = self._config.servers[server]
            for tool in listing:
                if not included(config, tool.name):
                    continue
                key = f"{server}/{tool.name}"
                print_ = fingerprint(tool)
                effect, reason, why, rule = classify(config, tool, changed=self._fingerprints.changed(key, print_))
                name = self._unique(public_name(server, tool.name, self._separator, self._limit), tools, self._limit)
                wants_intent = (
                    effect == "write"
                    and self._config.review.intent
                    and INTENT_ARGUMENT not in (tool.input_schema.get("properties") or {})
                )
                tools[name] = CatalogTool(
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
                )
        self._tools = tools
        self._validators = {}


def _public_definition(tool: types.Tool, name: str, wants_intent: bool) -> types.Tool:
    update: dict[str, Any] = {"name": name}
    if wants_intent:
        schema = dict(tool.input_schema)
        properties = dict(schema.get("properties") or {})
        properties[INTENT_ARGUMENT] = INTENT_SCHEMA
        schema.update(properties=properties, required=[*schema.get("required", []), INTENT_ARGUMENT])
        update["input_schema"] = schema
    return tool.model_copy(update=update)


def check_arguments(
    validators: dict[str, jsonschema.protocols.Validator], tool: CatalogTool, arguments: Mapping[str, Any]
) -> None:
    """Raise `InvalidArguments` naming every problem, with the tool's validator built once and cached."""
    validator = validators.get(tool.name)
    if validator is None:
        schema = dict(tool.input_schema)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError:
            # A tool with a broken schema still gets its calls: its server will judge them itself.
            cls = jsonschema.Draft202012Validator
            schema = {"type": "object"}
        validator = validators[tool.name] = cls(schema)
    errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
    if errors:
        problems = "; ".join(_describe(error) for error in errors[:5])
        raise InvalidArguments(f"invalid arguments for {tool.name}: {problems}")


def _describe(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    return f"{path}: {error.message}" if path else error.message


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def strip_intent(tool: CatalogTool, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The arguments the backend gets, and the intent the reviewer gets."""
    args = dict(arguments)
    if not tool.wants_intent:
        return args, None
    intent = args.pop(INTENT_ARGUMENT, None)
    return args, str(intent) if intent is not None else None
