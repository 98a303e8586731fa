"""An MCP client's own config file, read as a config: Claude Desktop's `claude_desktop_config.json`,
Cursor's `mcp.json` (both under `mcpServers`) and VS Code's `mcp.json` (`servers`, beside `inputs`).

A client's file holds more than its servers (Claude Desktop's `globalShortcut` and `preferences`,
VS Code's `inputs`); those keys are the client's, not mistakes, and are set aside here before the file
is validated, so a user can point `--config` at the file they already have. The proxy's own sections
(`review:`, `models:`, …) may sit beside the servers and are read as in servers.yaml. A file that is no
client's (a servers.yaml) keeps every unknown key an error.

Within a server, the keys only a client acts on are set aside too (VS Code's `dev` and `gallery`),
except `envFile`: its variables would be missing from the server's environment, so it is told.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcp_spec_proxy.config.file import parse, plain_json

# Keys whose presence marks a client's file: Claude Desktop and Cursor keep servers under `mcpServers`;
# VS Code's mcp.json keeps them under `servers`, with the prompts for `${input:…}` under `inputs`.
CLIENT_MARKERS = ("mcpServers", "inputs")
# A server's keys that only the client acts on: VS Code's development mode and its gallery metadata.
CLIENT_SERVER_KEYS = frozenset({"dev", "gallery", "version", "description"})


def is_client_file(data: Any) -> bool:
    """Whether `data` (a parsed file) is an MCP client's config rather than a servers.yaml."""
    return isinstance(data, dict) and any(marker in data for marker in CLIENT_MARKERS)


def client_keys(data: Any, proxy_keys: Iterable[str]) -> list[str]:
    """The top-level keys of a client's file the proxy does not read (none for a servers.yaml)."""
    if not is_client_file(data):
        return []
    known = {*proxy_keys, "mcpServers"}
    return [str(key) for key in data if key not in known]


def own_keys_of(path: Path, proxy_keys: Iterable[str]) -> list[str]:
    """The client's own keys in the (valid) config file at `path`: what `check` says it left alone."""
    text = path.read_text(encoding="utf-8")
    json_file = path.suffix.lower() == ".json"
    return client_keys(parse(str(path), plain_json(text) if json_file else text, json_file=json_file), proxy_keys)


def servers_of(data: Any) -> Any:
    """The servers of a parsed file as written: `mcpServers` (Claude Desktop, Cursor) or `servers`."""
    if not isinstance(data, dict):
        return None
    return data.get("mcpServers", data.get("servers"))


def as_config(data: dict[str, Any], proxy_keys: Iterable[str]) -> dict[str, Any]:
    """A client's file with the client's own keys set aside, top-level and within each server entry;
    any other file as it is."""
    if not is_client_file(data):
        return data
    ignored = set(client_keys(data, proxy_keys))
    kept = {key: value for key, value in data.items() if key not in ignored}
    for key in ("mcpServers", "servers"):
        servers = kept.get(key)
        if isinstance(servers, dict):
            kept[key] = {name: _server_entry(entry) for name, entry in servers.items()}
    return kept


def _server_entry(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    return {key: value for key, value in entry.items() if key not in CLIENT_SERVER_KEYS}
