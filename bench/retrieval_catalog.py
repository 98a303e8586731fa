"""The catalog `bench/retrieval.py` searches: the real servers the tests use, padded with synthetic tools.

The real servers' tools/list is dumped into `bench/retrieval_servers.json` (`dump`, run by
`python -m bench.retrieval --dump`: npm filesystem, memory, everything; PyPI git, time; sqlite, as the
tests start them from `.backends/`). The padding simulates the many SaaS/API backends a team connects:
servers generated from domain templates in several accounts each, every tool a verb and an entity with
a one-sentence description and a small argument schema, read-only for list/get/search/count/export
verbs and a write otherwise; their words overlap the real tools' on purpose, so they are distractors.
`padded(size)` is the catalog of `size` tools as the proxy builds it in search mode.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore

SERVERS_FILE = Path(__file__).resolve().parent / "retrieval_servers.json"

# -- the real servers' listings ------------------------------------------------------------------


async def dump() -> dict[str, list[dict[str, Any]]]:
    """tools/list of each real test server, started from .backends as the tests start them."""
    from mcp import Client, StdioServerParameters

    from tests import backends

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "repo").mkdir()
        await anyio.run_process(["git", "init", "-q", str(root / "repo")])
        commands = {
            "fs": backends.filesystem(root),
            "memory": backends.memory(root / "memory.jsonl"),
            "everything": backends.everything(),
            "git": backends.git(root / "repo"),
            "time": backends.time(),
            "sqlite": backends.sqlite(root / "db.sqlite"),
        }
        listings: dict[str, list[dict[str, Any]]] = {}
        for name, command in commands.items():
            params = StdioServerParameters(command=command.command, args=command.args, env=command.env or None)
            async with Client(params, mode="legacy") as client:
                listed = await client.list_tools()
            listings[name] = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in listed.tools]
    return listings


# -- synthetic padding ---------------------------------------------------------------------------

DOMAINS: dict[str, tuple[str, list[str]]] = {
    # domain: (what the system is, its entities)
    "drive": ("cloud file storage", ["file", "folder", "shared link", "file version", "upload", "trash item"]),
    "objects": ("object storage", ["bucket", "object", "object tag", "lifecycle rule", "access policy"]),
    "code": (
        "code hosting",
        ["repository", "branch", "commit", "pull request", "merge request", "tag", "release", "code review"],
    ),
    "ci": ("continuous integration", ["pipeline", "build", "job", "artifact", "runner", "deployment"]),
    "pg": ("PostgreSQL database", ["table", "query", "index", "view", "row", "schema", "database user"]),
    "warehouse": ("data warehouse", ["dataset", "table", "saved query", "scheduled query", "column"]),
    "wiki": ("team wiki", ["page", "space", "page comment", "attachment", "page revision", "template"]),
    "notes": ("note-taking app", ["note", "notebook", "tag", "checklist", "reminder"]),
    "crm": ("CRM", ["contact", "company", "deal", "lead", "activity", "pipeline stage", "relationship"]),
    "tickets": ("issue tracker", ["ticket", "issue", "sprint", "board", "label", "comment", "epic"]),
    "calendar": ("calendar", ["event", "calendar", "meeting room", "time slot", "availability", "time zone"]),
    "chat": ("team chat", ["message", "channel", "thread", "reaction", "direct message", "user status"]),
    "mail": ("email", ["email", "draft", "mailbox folder", "attachment", "filter rule", "signature"]),
    "monitor": ("monitoring", ["alert", "metric", "dashboard", "log entry", "incident", "uptime check"]),
    "billing": ("billing", ["invoice", "payment", "subscription", "customer", "refund", "coupon"]),
    "hr": ("HR system", ["employee", "time off request", "team", "job posting", "candidate", "review cycle"]),
    "shop": ("online shop", ["product", "order", "cart", "shipment", "inventory item", "discount"]),
    "kb": ("knowledge base", ["article", "entity", "relation", "fact", "topic", "collection"]),
    "cloud": ("cloud infrastructure", ["virtual machine", "disk", "network", "firewall rule", "snapshot"]),
    "secrets": ("secrets manager", ["secret", "secret version", "access key", "environment variable"]),
    "analytics": ("product analytics", ["event", "funnel", "cohort", "report", "chart"]),
    "docs": ("document editor", ["document", "spreadsheet", "presentation", "comment", "revision"]),
}
ACCOUNTS = ["", "eu", "us", "staging", "sandbox", "prod", "legacy", "team2", "acme", "partner", "test", "archive"]
# verb: (read-only?, description templates; {e} entity, {es} plural, {s} system)
VERBS: dict[str, tuple[bool, list[str]]] = {
    "list": (True, ["List {es} in the {s}, newest first.", "Returns a page of {es} from the {s} with filters."]),
    "get": (True, ["Get one {e} from the {s} by its id.", "Fetch the details of a {e} in the {s}."]),
    "search": (True, ["Search {es} in the {s} by keywords.", "Find {es} in the {s} matching a text query."]),
    "count": (True, ["Count the {es} in the {s} that match a filter."]),
    "export": (True, ["Export {es} from the {s} as CSV or JSON."]),
    "history": (True, ["Show the change history of a {e} in the {s}."]),
    "create": (False, ["Create a new {e} in the {s}.", "Add a {e} to the {s} with the given fields."]),
    "update": (False, ["Update fields of an existing {e} in the {s}.", "Modify a {e} in the {s}."]),
    "delete": (False, ["Delete a {e} from the {s} permanently.", "Remove a {e} from the {s}."]),
    "archive": (False, ["Archive a {e} in the {s} so it is hidden but kept."]),
    "move": (False, ["Move a {e} to another place in the {s}.", "Rename or relocate a {e} in the {s}."]),
    "share": (False, ["Share a {e} in the {s} with a user or group."]),
}


def _plural(entity: str) -> str:
    if entity.endswith(("s", "x", "ch", "sh")):
        return entity + "es"
    if entity.endswith("y") and entity[-2:-1] not in "aeiou":
        return entity[:-1] + "ies"
    return entity + "s"


def _pick(options: Sequence[str], *key: str) -> str:
    index = int(hashlib.sha256("/".join(key).encode()).hexdigest()[:8], 16) % len(options)
    return options[index]


def synthetic(count: int) -> dict[str, list[types.Tool]]:
    """`count` synthetic tools on generated servers (see the module docstring); deterministic."""
    servers: dict[str, list[types.Tool]] = {}
    made = 0
    for account in ACCOUNTS:
        for domain, (system, entities) in DOMAINS.items():
            server = f"{domain}_{account}" if account else domain
            tools: list[types.Tool] = []
            for entity in entities:
                for verb, (read_only, templates) in VERBS.items():
                    if made == count:
                        break
                    slug = entity.replace(" ", "_")
                    name = f"{verb}_{slug}" if verb != "history" else f"get_{slug}_history"
                    words = {"e": entity, "es": _plural(entity), "s": system}
                    description = _pick(templates, server, name).format(**words)
                    properties: dict[str, Any] = {}
                    if verb in ("list", "search", "count", "export"):
                        properties["query"] = {"type": "string", "description": f"Text to match in {words['es']}."}
                        properties["limit"] = {"type": "integer"}
                    else:
                        properties[f"{slug}_id"] = {"type": "string", "description": f"The {entity}'s id."}
                    if verb in ("create", "update"):
                        properties["fields"] = {"type": "object", "description": f"The {entity}'s fields."}
                    if verb in ("move", "share"):
                        properties["target"] = {"type": "string"}
                    annotations = types.ToolAnnotations(read_only_hint=read_only, destructive_hint=verb == "delete")
                    schema = {"type": "object", "properties": properties, "required": list(properties)[:1]}
                    tools.append(
                        types.Tool(name=name, description=description, input_schema=schema, annotations=annotations)
                    )
                    made += 1
            if tools:
                servers[server] = tools
            if made == count:
                return servers
    raise ValueError(f"the templates make at most {made} synthetic tools, asked for {count}")


# -- the catalog as the proxy builds it ----------------------------------------------------------


def real_listings() -> dict[str, list[types.Tool]]:
    raw = json.loads(SERVERS_FILE.read_text())
    return {server: [types.Tool.model_validate(t) for t in tools] for server, tools in raw.items()}


def build_catalog(listings: dict[str, list[types.Tool]]) -> Catalog:
    config = ProxyConfig.model_validate(
        {"servers": {name: {"command": "unused"} for name in listings}, "catalog": {"mode": "search"}}
    )
    catalog = Catalog(config, FingerprintStore(None))
    for server, tools in listings.items():
        catalog.set_tools(server, tools)
    return catalog


def padded(size: int) -> Catalog:
    real = real_listings()
    count = sum(map(len, real.values()))
    return build_catalog({**real, **synthetic(max(0, size - count))})


__all__ = ["SERVERS_FILE", "build_catalog", "dump", "padded", "real_listings", "synthetic"]
