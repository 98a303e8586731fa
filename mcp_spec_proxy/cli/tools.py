"""`mcp-spec-proxy tools`: every tool with its effect and why; `tools accept` accepts changed definitions.

Accepting writes the fingerprint store only; a running proxy applies it at the tool's next call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import file_options, load, run_loop, setup
from mcp_spec_proxy.cli.store import fingerprint_store

if TYPE_CHECKING:  # the catalog and the config's models load when a command runs, not for `--help`
    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.tools.fingerprints import FingerprintStore


@main.group(invoke_without_command=True)
@file_options
@click.pass_context
def tools(ctx: click.Context) -> None:
    """List every tool with its effect (read/write) and why; open-world reads are marked."""
    if ctx.invoked_subcommand is not None:
        return
    built = setup(ctx)
    config = built.config

    async def listing() -> list[Any]:
        async with built.running() as proxy:
            await proxy.backends.settled()  # every backend's tools, or why it has none
            unavailable = [
                f"{b.name}: {b.last_error}" for b in proxy.backends.backends.values() if b.status != "connected"
            ]
            return [proxy.catalog.tools(), unavailable]

    found, unavailable = run_loop(listing)
    width = max((len(t.name) for t in found), default=10)
    for tool in sorted(found, key=lambda t: t.name):
        review = f"  [review: {tool.review or config.review.default}]" if tool.effect == "write" else ""
        # A read that reaches the outside world runs unreviewed; `hold_open_world: true` holds it.
        world = "  [open world]" if tool.effect == "read" and tool.open_world else ""
        click.echo(f"{tool.name:<{width}}  {tool.effect:<5}  {tool.reason}: {tool.why}{world}{review}")
    for line in unavailable:
        click.echo(f"unavailable  {line}", err=True)


@tools.command("accept")
@file_options
@click.argument("names", nargs=-1)
@click.option("--all", "accept_all", is_flag=True, help="Accept every changed definition and new tool.")
@click.pass_context
def tools_accept(ctx: click.Context, names: tuple[str, ...], accept_all: bool) -> None:
    """Accept the changed definition of NAME, or NAME as a new tool (its listed name, or server/tool)."""
    config = load(ctx.obj["config_path"])
    store = fingerprint_store(ctx, config)
    pending = store.pending()
    targets = pending if accept_all else [_store_key(name, config, store) for name in names]
    if accept_all and not pending:
        click.echo("no changed definitions to accept")
        return
    if not targets:
        raise click.ClickException("name a tool to accept, or pass --all; changed: " + (", ".join(pending) or "none"))
    for key in targets:
        new = store.is_new(key)
        if store.accept(key):
            click.echo(f"accepted the new tool {key}" if new else f"accepted the new definition of {key}")
        else:
            raise click.ClickException(
                f"{key} has no changed definition to accept; changed: {', '.join(pending) or 'none'}"
            )
    click.echo("a running proxy applies this at the tool's next call")


def _store_key(name: str, config: ProxyConfig, store: FingerprintStore) -> str:
    """The `server/tool` a listed name stands for, found the way the catalog names tools.

    Read back from the store, not cut at a separator: a hashed name (`bank___transfer-c317f1`)
    cannot be cut back into its tool, and `bank` + `__` + `_x` and `bank_` + `__` + `x` share a
    prefix, so only naming every known tool tells which one a name is.
    """
    from mcp_spec_proxy.tools.names import public_name

    if "/" in name:
        return name
    known = store.keys()
    for key in known:
        server, tool = key.split("/", 1)
        if server in config.servers and (
            public_name(
                server,
                tool,
                config.separator,
                config.max_name_length,
                config.servers,
                namespaced=config.servers[server].namespace,
            )
            == name
        ):
            return key
    if all(s.namespace for s in config.servers.values()) and not any(
        name.startswith(f"{server}{config.separator}") for server in config.servers
    ):
        raise click.ClickException(f"{name!r} does not start with a configured server name and {config.separator!r}")
    raise click.ClickException(
        f"{name!r} is not a tool the proxy has seen; run `mcp-spec-proxy tools` for the listed names"
    )
