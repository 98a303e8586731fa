"""`mcp-spec-proxy login SERVER` and `logout SERVER`: a remote backend's OAuth login, from a terminal.

`login` forgets the server's kept tokens (its client registration stays), connects to it as the
proxy does, and lets the SDK's OAuth client run the whole login (`backends/oauth.py`): it prints the
authorization URL, opens it with `webbrowser` (`BROWSER` picks the program) and takes the code on
the loopback redirect. The tokens land where the store keeps them (the state directory, or under
`store: postgres` the database every replica reads), where a running proxy's next connection attempt
or refresh finds them. `logout` forgets the tokens. `check` says each server's login state
(`login_lines`). None of them prints a token.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import click

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import Setup, file_options, run_loop, setup

if TYPE_CHECKING:
    from mcp_spec_proxy.backends.oauth import BackendAuth
    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.store import TokenStores


def _login_of(built: Setup, server: str) -> BackendAuth:
    """The OAuth client of `server`, or a one-line error naming what to change."""
    from mcp_spec_proxy.backends.oauth import backend_logins
    from mcp_spec_proxy.errors import ProxyError

    config = built.config.servers.get(server)
    if config is None:
        known = ", ".join(sorted(built.config.servers)) or "none"
        raise click.ClickException(f"no server {server!r} in {built.source} (servers: {known})")
    if config.auth is None:
        raise click.ClickException(f"server {server!r} has no `auth:` in {built.source}: add `auth: oauth` to log in")
    try:
        stores = _token_stores(built.config, built.state.root, os.environ, built.source)
        logins = backend_logins({server: config}, built.state.root, os.environ, built.source, stores)
    except ProxyError as exc:
        raise click.ClickException(str(exc)) from None
    return logins[server]


@main.command()
@click.argument("server")
@file_options
@click.pass_context
def login(ctx: click.Context, server: str) -> None:
    """Log in to SERVER (a URL backend with `auth:`): open its login page, keep the tokens it gives."""
    built = setup(ctx)
    auth = _login_of(built, server)
    config = built.config.servers[server]

    async def log_in() -> str:
        from mcp.client.client import Client

        from mcp_spec_proxy.backends.transports import open_transport

        await _migrated(built.config)
        await auth.tokens.forget_tokens()
        auth.renew()
        transport = open_transport(server, config, sys.stderr, on_end=lambda: None, auth=auth.provider)
        with anyio.fail_after(auth.settings.login_timeout + config.startup_timeout):
            async with Client(transport, mode=config.protocol) as client:
                await client.list_tools()
        return (await auth.tokens.state()).describe()

    try:
        said = run_loop(log_in)
    except click.ClickException:
        raise
    except Exception as exc:  # boundary: the flow's failure, told in one line
        raise click.ClickException(f"login to {server!r} failed: {_why(exc)}") from None
    click.echo(f"{server}: {said}")


@main.command()
@click.argument("server")
@file_options
@click.pass_context
def logout(ctx: click.Context, server: str) -> None:
    """Forget SERVER's tokens (its client registration stays, for the next login), on every replica."""
    from mcp_spec_proxy.errors import ProxyError

    built = setup(ctx)
    config = built.config.servers.get(server)
    if config is None or config.auth is None or config.url is None:
        _login_of(built, server)  # says which: no such server, or no `auth:`
        return
    try:  # no client secret needed to forget
        tokens = _token_stores(built.config, built.state.root, os.environ, built.source)(server, config.url)
    except ProxyError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{server}: logged out" if run_loop(tokens.forget_tokens) else f"{server}: was not logged in")


async def login_lines(
    config: ProxyConfig, state_root: Path, environ: Mapping[str, str] | None = None, source: str = "config"
) -> list[str]:
    """Each URL backend with `auth:`: its login state and token expiry, never the token."""
    from mcp_spec_proxy.errors import StateError

    stores = _token_stores(config, state_root, environ if environ is not None else {}, source)
    lines = []
    for name, server in config.active_servers().items():
        if server.auth is None or server.url is None:
            continue
        tokens = stores(name, server.url)
        try:
            state = await tokens.state()
            people = await tokens.principals_logged_in()
        except StateError as exc:
            lines.append(f"{name}: login unknown — {exc}")
            continue
        line = f"{name}: {state.describe()}"
        if not state.logged_in and server.auth.grant == "authorization_code":
            line += f" — run `mcp-spec-proxy login {name}` (or the proxy asks when it first connects)"
        if people:  # each person's own login, under `auth:` at the front
            line += f"; {people} principal{'s' if people != 1 else ''} logged in for themselves"
        lines.append(line)
    return lines


def _token_stores(config: ProxyConfig, state_root: Path, environ: Mapping[str, str], source: str) -> TokenStores:
    from mcp_spec_proxy.store import token_stores

    return token_stores(config, state_root, environ, source)


async def _migrated(config: ProxyConfig) -> None:
    """Under `store: postgres`, the schema this proxy needs (the tokens' table with it), as a replica applies it."""
    from mcp_spec_proxy.store import postgres_dsn

    dsn = postgres_dsn(config, os.environ, "config")
    if dsn is not None and config.store != "files":
        from mcp_spec_proxy.store.postgres import migrate_database

        await migrate_database(dsn, config.store.postgres.timeout, leash=config.leash is not None)


def _why(exc: BaseException) -> str:
    """The failure that matters, out of the task groups that wrap it."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, TimeoutError):
        return "no login in time"
    from mcp_spec_proxy.backends.oauth import login_failure

    return login_failure(exc) if isinstance(exc, Exception) else type(exc).__name__


__all__ = ["login_lines"]
