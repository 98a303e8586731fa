"""The console script: start the stdio backends, then load the proxy while they boot.

Serving imports the `mcp` SDK, most of the proxy's own start (the command line loads without it,
so `--help` is quick; the serving command imports it once it has read its config). When the command
serves (no subcommand: stdio, or `--http`), this module first reads the config with the project's
loader and spawns its stdio backends (`early.spawn_early`), so their start overlaps ours; their
first connection adopts them. Anything else (a subcommand, `--help`, an option this module does
not know, a config that does not load, an address of `--http` or `--console` that cannot be
listened on: the command refuses it before any backend starts) goes straight to the command line,
which reports it. A failure here is one log line, and the backends start after the proxy loads.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp_spec_proxy.config import ProxyConfig

# The main command's options (cli/serve.py) and whether each takes a value.
_VALUED = {"--config", "-c", "--state-dir", "--http", "--token-env", "--allow-host", "--telemetry", "--console"}
_VALUED |= {"--log-level", "--log-format"}
_FLAGS = {"--no-console"}


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


def serving_files(argv: list[str]) -> tuple[str, str | None] | None:
    """(config path, --state-dir) when `argv` runs the serving command, else None (not sure is None)."""
    values: dict[str, str] = {}
    rest = iter(argv)
    for arg in rest:
        option, has_value, value = arg.partition("=")
        if has_value and option.startswith("--") and option in _VALUED:
            values[option] = value
        elif arg in _VALUED:
            found = next(rest, None)
            if found is None:
                return None
            values[arg] = found
        elif arg not in _FLAGS:
            return None  # a subcommand, --help, --version, or something click will explain
    if not all(_listenable(values[option]) for option in ("--http", "--console") if option in values):
        return None
    return values.get("--config", values.get("-c", "servers.yaml")), values.get("--state-dir")


def start_backends(argv: list[str]) -> None:
    """Spawn the serving command's stdio backends; nothing when `argv` does not serve."""
    files = serving_files(argv)
    if files is None:
        return
    from mcp_spec_proxy import early
    from mcp_spec_proxy.config import load_config
    from mcp_spec_proxy.errors import ProxyError

    config_path, state_option = files
    try:
        config = load_config(Path(config_path), os.environ)
    except ProxyError:
        return  # the command line reports it
    log_dir = state_dir_of(state_option, config) / "logs"  # as `StatePaths.logs`
    if early.spawn_early(config, log_dir):
        # Until the event loop takes SIGTERM over, it ends the process through the exit hook,
        # which stops the backends nobody adopted yet.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    try:
        start_backends(sys.argv[1:])
    except Exception as exc:
        logging.getLogger("mcp_spec_proxy").warning(
            "could not start the backends before the proxy loaded (%s: %s); they start once it has",
            type(exc).__name__,
            exc,
        )
    from mcp_spec_proxy.cli import main as cli

    cli(prog_name="mcp-spec-proxy")


if __name__ == "__main__":
    main()
