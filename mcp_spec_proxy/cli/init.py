"""`mcp-spec-proxy init`: a starter servers.yaml from the MCP servers the user's clients already have.

It looks where Claude Desktop, Cursor and VS Code keep their servers on Linux and macOS (under $HOME,
and $XDG_CONFIG_HOME on Linux), gathers every server it finds into one `servers:` (the proxy's own
entry left out), adds the shipped review section (every write waits for the user) and says what it
found and what it wrote. It never overwrites a file without `--force`. The file is written readable by
its owner alone: a client's entries often carry tokens in their `env`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click
import yaml

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import file_options
from mcp_spec_proxy.config import CONFIG_REFERENCE
from mcp_spec_proxy.errors import ConfigError

_REVIEW = """\
review:
  default: human                        # ask the user (elicitation / input_required) before any write
  fallback: console                     # a client that cannot ask (Claude Desktop): the write waits on the
                                        # proxy's approval page; `mcp-spec-proxy console-url` prints its link
  intent: true                          # write tools take an `intent` argument the reviewer reads
"""
NEXT_STEP = "README.md#use-it-from-claude-desktop"


@main.command("init")
@file_options
@click.option("--force", is_flag=True, help="Overwrite the file --config names if it exists.")
@click.pass_context
def init(ctx: click.Context, force: bool) -> None:
    """Write a starter servers.yaml (--config, default ./servers.yaml) from the MCP servers your clients
    have: Claude Desktop, Cursor and VS Code, on Linux and macOS."""
    from mcp_spec_proxy.config.clients import client_files, entries_of, merged
    from mcp_spec_proxy.config.schema import load_config

    target = Path(ctx.obj["config_path"])
    if target.exists() and not force:
        raise click.ClickException(
            f"{target} exists — pass --force to overwrite it, or --config OTHER.yaml to write another file"
        )
    home = Path(os.environ.get("HOME") or Path.home())
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    found: list[tuple[str, dict[str, dict[str, object]]]] = []
    sources: list[str] = []
    for client, path in client_files(home, config_home, sys.platform):
        if not path.is_file():
            click.echo(f"{client}: no file at {path}")
            continue
        entries, note = entries_of(client, path)
        click.echo(note)
        if entries:
            found.append((client, entries))
            sources.append(f"{client} ({path})")
    servers, notes = merged(found)
    for note in notes:
        click.echo(f"note: {note}")
    if not servers:
        raise click.ClickException(
            f"no MCP client's servers found, so {target} was not written — write `servers:` by hand"
            f" ({CONFIG_REFERENCE}), or start from the servers.yaml the proxy ships"
        )
    header = (
        "# mcp-spec-proxy: the servers it wraps, and how their calls are reviewed.\n"
        "# Written by `mcp-spec-proxy init` from the servers of:\n"
        + "".join(f"#   {source}\n" for source in sources)
        + f"# Reference: {CONFIG_REFERENCE}. Check it with `mcp-spec-proxy --config {target} check`.\n\n"
    )
    body = yaml.safe_dump({"servers": servers}, sort_keys=False, allow_unicode=True, width=120)
    _write_private(target, f"{header}{body}\n{_REVIEW}")
    click.echo(f"wrote {target}: {len(servers)} servers ({', '.join(servers)}); every write waits for your approval")
    try:
        load_config(target, os.environ)
    except ConfigError as exc:
        click.echo(f"before it serves, edit {target}: {exc}")
        return
    click.echo(
        f"next: `mcp-spec-proxy --config {target} check`, then give your client the proxy in place of these"
        f" servers ({NEXT_STEP})"
    )


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, a new file readable by its owner alone (an existing one keeps its mode)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from None
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
