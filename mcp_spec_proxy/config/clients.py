"""An MCP client's own config file, read as a config: Claude Desktop's `claude_desktop_config.json`,
Cursor's `mcp.json` (both under `mcpServers`) and VS Code's `mcp.json` (`servers`, beside `inputs`).

A client's file holds more than its servers (Claude Desktop's `globalShortcut` and `preferences`,
VS Code's `inputs`); those keys are the client's, not mistakes, and are set aside here before the file
is validated, so a user can point `--config` at the file they already have. The proxy's own sections
(`review:`, `models:`, …) may sit beside the servers and are read as in servers.yaml. A file that is no
client's (a servers.yaml) keeps every unknown key an error.

Within a server, the keys only a client acts on are set aside too (VS Code's `dev` and `gallery`),
except `envFile`: its variables would be missing from the server's environment, so it is told. A client's
entry that starts mcp-spec-proxy itself (the user registered the proxy there) is left out: served, it
would start the proxy behind itself, again and again.

`init` finds the clients' files (`client_files`) and gathers their servers into one servers.yaml
(`entries_of`, `merged`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcp_spec_proxy.config.file import parse, plain_json
from mcp_spec_proxy.errors import ConfigError

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


def left_alone(path: Path, proxy_keys: Iterable[str]) -> tuple[list[str], list[str]]:
    """What of the (valid) client's file at `path` the proxy does not serve, for `check` to say: the
    client's own keys, and the servers that start mcp-spec-proxy itself."""
    text = path.read_text(encoding="utf-8")
    json_file = path.suffix.lower() == ".json"
    data = parse(str(path), plain_json(text) if json_file else text, json_file=json_file)
    return client_keys(data, proxy_keys), _proxies(data)


def _proxies(data: Any) -> list[str]:
    servers = servers_of(data) if is_client_file(data) else None
    if not isinstance(servers, dict):
        return []
    return [str(name) for name, entry in servers.items() if isinstance(entry, dict) and runs_this_proxy(entry)]


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
    proxies = set(_proxies(data))
    for key in ("mcpServers", "servers"):
        servers = kept.get(key)
        if isinstance(servers, dict):
            kept[key] = {name: _server_entry(entry) for name, entry in servers.items() if name not in proxies}
    return kept


def _server_entry(entry: Any) -> Any:
    if not isinstance(entry, dict):
        return entry
    return {key: value for key, value in entry.items() if key not in CLIENT_SERVER_KEYS}


# Where each client keeps its servers, under the user's home: (client, macOS path, Linux path), a Linux
# path under the XDG config directory when it starts with `$XDG_CONFIG_HOME/`.
CLIENT_FILES: tuple[tuple[str, str, str], ...] = (
    (
        "Claude Desktop",
        "Library/Application Support/Claude/claude_desktop_config.json",
        "$XDG_CONFIG_HOME/Claude/claude_desktop_config.json",
    ),
    ("Cursor", ".cursor/mcp.json", ".cursor/mcp.json"),
    ("VS Code", "Library/Application Support/Code/User/mcp.json", "$XDG_CONFIG_HOME/Code/User/mcp.json"),
)
_NAME_PART = re.compile(r"[^A-Za-z0-9_-]+")


def client_files(home: Path, config_home: Path, platform: str) -> list[tuple[str, Path]]:
    """Where each client's file would be on this machine: `home` is $HOME, `config_home` $XDG_CONFIG_HOME
    (or ~/.config), `platform` is `sys.platform`."""
    places: list[tuple[str, Path]] = []
    for client, mac, linux in CLIENT_FILES:
        written = mac if platform == "darwin" else linux
        xdg = written.removeprefix("$XDG_CONFIG_HOME/")
        places.append((client, config_home / xdg if xdg != written else home / written))
    return places


def entries_of(client: str, path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """The server entries of a client's file, each without the keys only the client reads, and a note:
    how many it holds, or why none could be read."""
    try:
        data = parse(str(path), plain_json(path.read_text(encoding="utf-8")), json_file=True)
    except ConfigError as exc:
        return {}, f"{client}: {exc} — left out"
    except OSError as exc:
        return {}, f"{client}: {path}: cannot read it ({exc.strerror}) — left out"
    servers = servers_of(data)
    if not isinstance(servers, dict) or not servers:
        return {}, f"{client}: {path}: no servers in it"
    entries = {str(name): _server_entry(entry) for name, entry in servers.items() if isinstance(entry, dict)}
    return entries, f"{client}: {path}: {len(entries)} servers ({', '.join(entries)})"


def runs_this_proxy(entry: dict[str, Any]) -> bool:
    """Whether a client's entry starts this proxy: wrapping it would put it in front of itself."""
    args = entry.get("args")
    words = [str(entry.get("command", "")), *(str(arg) for arg in (args if isinstance(args, list) else []))]
    return any(Path(word).name == "mcp-spec-proxy" or word == "mcp_spec_proxy" for word in words)


def merged(found: Iterable[tuple[str, dict[str, dict[str, Any]]]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every client's servers in one `servers:` mapping, and notes on what was left out or renamed.
    A name becomes a legal server name; one entry that two clients both have is kept once; two different
    entries of one name keep it apart with the client's name added."""
    servers: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for client, entries in found:
        for written, entry in entries.items():
            if runs_this_proxy(entry):
                notes.append(f"{client}: left out {written!r}: it runs mcp-spec-proxy itself")
                continue
            name = _server_name(written)
            if name in servers and servers[name] != entry:
                name = _server_name(f"{name}-{client}")
            if servers.get(name, entry) != entry:
                notes.append(f"{client}: left out {written!r}: another client's {name!r} differs from it")
                continue
            if name != written and name not in servers:
                notes.append(f"{client}: {written!r} is named {name!r} (a server name prefixes its tools)")
            servers[name] = entry
    return servers, notes


def _server_name(written: str) -> str:
    name = _NAME_PART.sub("-", written.strip()).strip("-").lower()
    while "__" in name:  # the separator between a server's name and its tools'
        name = name.replace("__", "_")
    return name[:40] or "server"
