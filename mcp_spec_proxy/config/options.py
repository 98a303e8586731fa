"""The serving command's options, declared once, and what reading them needs before the SDK loads.

`serving_options` decorates the main command (`cli/serve.py`); the console script (`launch.py`)
parses its argv with a command built from the same declarations (`serving_files`), before the
SDK and the rest of the command line are imported, to spawn the backends early. One table, one
parser: an option added to the command is known to the launcher as it is. Only click is imported
here (the launcher's budget is the SDK's import, not ours).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from mcp_spec_proxy.config.schema import ProxyConfig

F = TypeVar("F", bound=Callable[..., Any])

LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING"])
LOG_FORMATS = click.Choice(["text", "json"])

config_option = click.option(
    "--config",
    "-c",
    "config_path",
    default="servers.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="servers.yaml, or a Claude Desktop style JSON file with mcpServers.",
)
state_option = click.option(
    "--state-dir", type=click.Path(file_okay=False), help="Fingerprints, audit log and backend logs."
)

_SERVING = (
    config_option,
    state_option,
    click.option("--http", "http", metavar="HOST:PORT", help="Serve streamable HTTP instead of stdio."),
    click.option("--token-env", metavar="VAR", help="Require `Authorization: Bearer $VAR` on the HTTP front."),
    click.option("--allow-host", multiple=True, help="Extra Host header value the HTTP front accepts."),
    click.option("--telemetry", type=click.Path(dir_okay=False), help="Append one JSON line per decision to FILE."),
    click.option(
        "--console",
        "console",
        metavar="HOST:PORT",
        help="Serve the approval console there (loopback only). Default with stdio: 127.0.0.1 on a free port.",
    ),
    click.option(
        "--no-console", is_flag=True, help="Serve no approval console: writes that would wait there are refused."
    ),
    click.option(
        "--log-level", type=LOG_LEVELS, help="Default: INFO when serving, WARNING for `tools`, `run` and the rest."
    ),
    click.option(
        "--log-format",
        type=LOG_FORMATS,
        help="text (default), or json: one object a line, with the call id and session on each line about a call.",
    ),
)


def serving_options(command: F) -> F:
    """The main command's options, in the order `--help` lists them."""
    for option in reversed(_SERVING):
        command = option(command)
    return command


def _probe(**options: Any) -> None:
    """The serving command's options alone: what `serving_files` parses argv with."""


def serving_files(argv: list[str]) -> tuple[str, str | None] | None:
    """(config path, --state-dir) when `argv` runs the serving command, else None (not sure is None):
    a subcommand, `--help`, `--version`, an option it does not know or a value it refuses goes to
    the command line, which explains it, and so does an address of `--http` or `--console` that
    cannot be listened on (the command refuses it before any backend starts)."""
    probe = click.command(add_help_option=False)(serving_options(_probe))
    try:
        options = probe.make_context("mcp-spec-proxy", list(argv)).params
    except click.ClickException:
        return None
    if not all(_listenable(options[name]) for name in ("http", "console") if options[name]):
        return None
    return options["config_path"], options["state_dir"]


def state_dir_of(option: str | None, config: ProxyConfig) -> Path:
    """The state directory: `--state-dir`, else the config's `state_dir`, else under $XDG_STATE_HOME."""
    chosen = option or config.state_dir
    if chosen:
        return Path(os.path.expanduser(chosen))
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "mcp-spec-proxy"


def listen_problem(host: str, port: int) -> str | None:
    """Why `host:port` cannot be listened on, or None (port 0 always can)."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _listenable(value: str) -> bool:
    """Whether a HOST:PORT option's address parses and can be listened on (as cli/serve.py reads it)."""
    host, _, port = value.rpartition(":")
    return port.isdigit() and listen_problem(host.strip("[]") or "127.0.0.1", int(port)) is None


__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "config_option",
    "listen_problem",
    "serving_files",
    "serving_options",
    "state_dir_of",
    "state_option",
]
