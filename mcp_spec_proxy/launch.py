"""The console script: start the stdio backends, then load the proxy while they boot.

Serving imports the `mcp` SDK, most of the proxy's own start (the command line loads without it,
so `--help` is quick; the serving command imports it once it has read its config). When the command
serves (no subcommand: stdio, or `--http`), `main` first reads the config with the project's
loader and spawns its stdio backends (`prespawn.Prespawned`), so their start overlaps ours; it
hands that object down the command line (click's `obj`) to the backend pool, whose first
connections adopt them, and stops what nobody adopted when the command ends. Whether argv
serves is read with the serving command's own options (`options.serving_files`): anything else
(a subcommand, `--help`, an option the command does not know, a config that does not load, an
address of `--http` or `--console` that cannot be listened on) goes straight to the command line,
which reports it. A failure here is one log line, and the backends start after the proxy loads.

This module is the top of the house: it imports the command line, never the other way round.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from mcp_spec_proxy.config.options import serving_files, state_dir_of
from mcp_spec_proxy.prespawn import Prespawned

COMPLETE_VAR = "_MCP_SPEC_PROXY_COMPLETE"
"""Set by the shell completion click generates for the command (docs/COMMANDS.md, "Shell completion")."""


def start_backends(argv: list[str], early: Prespawned) -> None:
    """Spawn the serving command's stdio backends into `early`; nothing when `argv` does not serve."""
    files = serving_files(argv)
    if files is None:
        return
    from mcp_spec_proxy.config.schema import load_config
    from mcp_spec_proxy.errors import ProxyError

    config_path, state_option = files
    try:
        config = load_config(Path(config_path), os.environ)
    except ProxyError:
        return  # the command line reports it
    log_dir = state_dir_of(state_option, config) / "logs"  # as `StatePaths.logs`
    if early.spawn(config, log_dir):
        # Until the event loop takes SIGTERM over, it ends the process through `main`'s `finally`,
        # which stops the backends nobody adopted yet.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def stop(early: Prespawned) -> None:
    """Stop what `early` spawned and nobody adopted, with the SDK's own bounded shutdown; then its logs."""
    leftover = early.leftover()
    if leftover:
        import anyio

        from mcp_spec_proxy.backends.stdio import stop_processes

        anyio.run(stop_processes, leftover)
    for log in early.logs:
        log.close()
    for log in early.logs:
        log.drain()  # the processes are stopped: their last lines reach the file
    early.logs.clear()


def main() -> None:
    early = Prespawned()
    try:
        try:
            if COMPLETE_VAR not in os.environ:  # a shell completing a word: nothing serves, nothing spawns
                start_backends(sys.argv[1:], early)
        except Exception as exc:
            logging.getLogger("mcp_spec_proxy").warning(
                "could not start the backends before the proxy loaded (%s: %s); they start once it has",
                type(exc).__name__,
                exc,
            )
        from mcp_spec_proxy.cli import main as cli

        cli(prog_name="mcp-spec-proxy", obj={"prespawned": early})
    finally:
        stop(early)


if __name__ == "__main__":
    main()
