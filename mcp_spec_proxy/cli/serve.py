"""The main command: serve the proxy on stdio or streamable HTTP; and `check`, which validates the config.

`main` is the click group the other command modules (tools, agent, bank) add their commands to.
The SDK, the config's models and the fronts are imported inside the commands that use them: a
`--help` page needs none of them, and importing them costs more than a second of CPU.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import click
from click.core import ParameterSource

from mcp_spec_proxy import __version__
from mcp_spec_proxy.cli.setup import (
    Stopping,
    bind_check,
    engine_problem,
    file_options,
    load,
    logger,
    run_loop,
    setup,
    stop_on_signal,
    token_from_env,
)
from mcp_spec_proxy.config.commands import resolve_command
from mcp_spec_proxy.config.options import serving_options, state_dir_of
from mcp_spec_proxy.errors import ProxyError

if TYPE_CHECKING:
    from mcp_spec_proxy.proxy import Proxy, StatePaths


def _parse_http(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        raise click.BadParameter(f"{value!r}: use HOST:PORT or :PORT, e.g. 127.0.0.1:8765", param_hint="--http")
    return host, int(port)


@click.group(invoke_without_command=True)
@serving_options
@click.version_option(__version__, prog_name="mcp-spec-proxy")
@click.pass_context
def main(
    ctx: click.Context,
    config_path: str,
    state_dir: str | None,
    http: str | None,
    token_env: str | None,
    allow_host: tuple[str, ...],
    telemetry: str | None,
    console: str | None,
    no_console: bool,
    log_level: str | None,
    log_format: str | None,
) -> None:
    """An MCP server in front of your MCP servers: reads pass, writes wait for a verdict."""
    ctx.ensure_object(dict)
    ctx.obj.update(config_path=config_path, state_dir=state_dir, log_level=log_level, log_format=log_format)
    if ctx.invoked_subcommand is not None:
        return
    token = token_from_env(token_env)
    address = _parse_http(http) if http else None
    if address is not None:
        bind_check(*address, option="--http")
    console_at = _console_address(console, no_console, stdio=address is None)
    built = setup(ctx, telemetry=telemetry, log_level="INFO")
    if address is None and sys.stdin is not None and sys.stdin.isatty():  # a person ran it: silence looks like a hang
        logger.info(
            "serving MCP on stdin and stdout: waiting for an MCP client to speak on stdin — register this command"
            " in your client (README.md#use-it-from-claude-desktop), or serve HTTP with --http :8765; Ctrl-C stops it"
        )
    if built.config.auth is not None and token:
        # `--token-env` is one person's shared secret; `auth:` knows each principal: one check, not two.
        raise click.ClickException(f"--token-env: {built.source} has `auth:`, which replaces it — drop --token-env")
    if built.config.auth is not None and address is None:
        logger.info("`auth:` applies to the HTTP front (--http); on stdio the one local client is served as before")
    from mcp_spec_proxy.calls.drain import SETTLE_S, Answering
    from mcp_spec_proxy.fronts.asgi import host_names
    from mcp_spec_proxy.fronts.logins import LoginAsks
    from mcp_spec_proxy.fronts.mcp import McpFront
    from mcp_spec_proxy.fronts.probes import Door
    from mcp_spec_proxy.fronts.stdio import serve_stdio

    async def serve() -> None:
        running: list[Proxy] = []
        answering = Answering()  # the requests the front is answering: the door's on HTTP, stdio's
        door: Door | None = None

        async def drain() -> None:
            for proxy in running:  # none while it starts: nothing is in flight then
                await proxy.gate.drain.run(proxy.config.drain_s, approvals=True)
            with anyio.move_on_after(SETTLE_S):
                # The results of the calls that finished reach their clients, and what those clients ask
                # next (the SDK's tools/list to check a result) is answered: until the front is quiet.
                await answering.quiet()

        def cut() -> None:
            for proxy in running:
                proxy.gate.drain.cut()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_signal, tg.cancel_scope, drain, cut, stopping)
            if address is not None:  # the probes answer while the backends start (`/readyz`: starting)
                door = Door(token=token, hosts=host_names(address[0], allow_host), answering=answering)
                port = await tg.start(door.serve, *address)
            async with built.running(metered=address is not None) as proxy:  # stdio serves no `/metrics`
                running.append(proxy)
                await _start_console(tg, proxy, built.state, console_at)
                front = McpFront(proxy, version=__version__)
                tg.start_soon(LoginAsks(front).run)  # a backend's login, asked of the clients that take a URL
                if address is None:
                    await serve_stdio(front, answering)
                else:
                    # Here, not above: the HTTP front loads its identity (httpx, PyJWT), which stdio never needs.
                    from mcp_spec_proxy.fronts.http import serve_http

                    await tg.start(
                        lambda task_status: serve_http(
                            front,
                            address[0],
                            port,
                            token=token,
                            allowed_hosts=list(allow_host),
                            door=door,
                            task_status=task_status,
                        )
                    )
                    await anyio.sleep_forever()
            tg.cancel_scope.cancel()

    stopping = Stopping()
    try:
        run_loop(serve)
    finally:
        stopping.after_loop()


def _console_address(console: str | None, no_console: bool, *, stdio: bool) -> tuple[str, int] | None:
    """Where the approval console listens: `--console`, else a free loopback port when serving stdio."""
    if no_console:
        if console:
            raise click.UsageError("--console and --no-console contradict each other; give one")
        return None
    if console is None:
        return ("127.0.0.1", 0) if stdio else None
    host, port = _parse_http(console)
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise click.BadParameter(
            f"{console!r}: the approval console listens on loopback only (127.0.0.1, localhost or [::1])",
            param_hint="--console",
        )
    bind_check(host, port, option="--console")
    return host, port


async def _start_console(
    tg: anyio.abc.TaskGroup, proxy: Proxy, state: StatePaths, address: tuple[str, int] | None
) -> None:
    """Serve the approval console beside the front, or say once what its absence means."""
    from mcp_spec_proxy.fronts.console import CONSOLE_PORT_FILE, CONSOLE_URL_FILE, Console, serve_console
    from mcp_spec_proxy.fronts.console.overwrite import OldContent

    if proxy.console is None:
        return
    if address is None:
        if _waits_on_console(proxy):
            logger.warning(
                "no approval console is served (--no-console, or --http without --console): writes whose review"
                " would wait there are refused; add --console 127.0.0.1:PORT to serve it"
            )
        return
    proxy.console.link_command = link_command(state.root)
    site = Console(
        proxy.console,
        proxy.store.read_audit,
        proxy.leash,
        OldContent(proxy.gate, proxy.catalog),
        stopping=lambda: proxy.gate.drain.ending,
    )
    url_file, port_file = state.root / CONSOLE_URL_FILE, state.root / CONSOLE_PORT_FILE
    await tg.start(
        lambda task_status: serve_console(
            site, *address, url_file=url_file, port_file=port_file, notify=True, task_status=task_status
        )
    )


def _waits_on_console(proxy: Proxy) -> bool:
    review = proxy.config.review
    modes = set(proxy.config.review_modes().values())
    return "console" in modes or (review.fallback == "console" and bool(modes & {"human", "strong_then_human"}))


def link_command(state_root: Path) -> str:
    """`console-url` as a command line that works from any folder and any PATH: this command's own
    path (a client such as Claude Desktop starts it from .venv/bin, which is rarely on the user's
    PATH) and the state directory, which alone finds the running console."""
    here = Path(sys.argv[0])
    if here.name != "mcp-spec-proxy" or not here.is_file():
        here = Path(sys.executable).parent / "mcp-spec-proxy"
    program = str(here.absolute()) if here.is_file() else "mcp-spec-proxy"
    return f"{shlex.join([program, 'console-url', '--state-dir', str(state_root.absolute())])}"


@main.command("serve", hidden=True, context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
def serve_command() -> None:
    """Not a command: the proxy serves when given none (else click suggests `store`)."""
    raise click.UsageError(
        "there is no `serve` command: the proxy serves when given no command —"
        " `mcp-spec-proxy --config servers.yaml` (stdio) or `mcp-spec-proxy --config servers.yaml --http :8765`"
    )


@main.command("console-url")
@file_options
@click.pass_context
def console_url(ctx: click.Context) -> None:
    """Print the link to the running proxy's approval console (it holds the console's secret).

    The state directory alone finds it: `--state-dir`, else the config's `state_dir` (when
    `--config` is given, or ./servers.yaml exists), else the default state directory."""
    from mcp_spec_proxy.fronts.console import CONSOLE_URL_FILE

    state_dir = ctx.obj.get("state_dir")
    config_path = ctx.obj["config_path"]
    given = {ctx.get_parameter_source("config_path"), ctx.find_root().get_parameter_source("config_path")}
    if state_dir is None and (given - {None, ParameterSource.DEFAULT} or Path(config_path).is_file()):
        root = state_dir_of(None, load(config_path))
    else:
        from mcp_spec_proxy.config.schema import ProxyConfig

        root = state_dir_of(state_dir, ProxyConfig())
    path = root / CONSOLE_URL_FILE
    try:
        click.echo(path.read_text(encoding="utf-8").strip())
    except OSError:
        raise click.ClickException(
            f"no approval console is running for the state directory {path.parent} (no {path.name} there):"
            " start the proxy (it serves the console with stdio, or with --console HOST:PORT), and pass its"
            " --state-dir here (or its --config, when that sets state_dir)"
        ) from None


@main.command("shipped-config")
def shipped_config() -> None:
    """Print the servers.yaml shipped with the proxy: `mcp-spec-proxy shipped-config > servers.yaml`."""
    from mcp_spec_proxy.config.shipped import shipped_config_text

    click.echo(shipped_config_text(), nl=False)


@main.command()
@file_options
@click.pass_context
def check(ctx: click.Context) -> None:
    """Validate the config file as the proxy does (keys, LEASH, reviewers) without starting a backend."""
    from mcp_spec_proxy.config import CONFIG_REFERENCE
    from mcp_spec_proxy.config.clients import left_alone
    from mcp_spec_proxy.engine import MODES
    from mcp_spec_proxy.proxy import validate

    built = setup(ctx)
    config = built.config

    async def validated() -> None:
        await validate(config, os.environ, built.source)

    run_loop(validated)
    missing = []
    for name, server in config.active_servers().items():
        if server.command is not None:  # the backend would fail to start, and be retried, for ever
            try:
                resolve_command(name, server.command)
            except ProxyError as exc:
                missing.append(str(exc))
    if missing:
        raise click.ClickException("\n".join(missing))
    if not config.active_servers() and config.gateway.backend_tools:
        raise click.ClickException(
            f"{built.source}: no server is configured{' or enabled' if config.servers else ''} — add one under"
            f" `servers:` ({CONFIG_REFERENCE}), or write a servers.yaml from your MCP clients' configs with"
            " `mcp-spec-proxy init`"
        )
    click.echo(f"{built.source}: ok ({len(config.active_servers())} servers enabled)")
    keys, proxies = left_alone(Path(built.source), type(config).model_fields)
    if keys:
        click.echo(f"note: the client's own keys, left alone: {', '.join(keys)}")
    for name in proxies:
        click.echo(f"note: server {name!r} is left out: it starts mcp-spec-proxy itself")
    from mcp_spec_proxy.cli.login import login_lines

    for line in run_loop(lambda: login_lines(config, built.state.root, os.environ, built.source)):
        click.echo(line)
    if not config.models and config.leash is None:
        return  # a plain MCP proxy: `run` and the gateway are not what this config is for
    for mode in MODES:
        problem = engine_problem(config, mode)
        if problem:
            click.echo(f"note: `run --mode {mode}` and the gateway's {mode!r} model are unavailable: {problem}")
