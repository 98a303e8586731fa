"""What every command shares: the options naming the files, and building config, state and LEASH from them.

This module and its siblings are the only place that reads the environment and files into config
(`load`, `setup`, `open_configured_leash`, `token_from_env`); the rest of the package is handed
explicit objects. `run_loop` runs a command's event loop and turns a ProxyError, however deep in
task groups, into a one-line CLI error. The config's models and the proxy are imported
inside the functions that use them, so the command line (and every `--help`) loads without them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import click

from mcp_spec_proxy.config import CONFIG_REFERENCE, MODELS_REFERENCE
from mcp_spec_proxy.config.options import LOG_LEVELS, listen_problem
from mcp_spec_proxy.config.options import state_dir_of as state_dir_of
from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.observe import logs
from mcp_spec_proxy.prespawn import Prespawned

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.engine import Mode
    from mcp_spec_proxy.leash.layers import Leash
    from mcp_spec_proxy.proxy import Proxy, StatePaths

logger = logging.getLogger("mcp_spec_proxy")
T = TypeVar("T")


def load(path: str) -> ProxyConfig:
    """The config file at `path`, with the environment; a config error becomes a CLI error."""
    from mcp_spec_proxy.config.schema import load_config

    try:
        return load_config(Path(path), os.environ)
    except ProxyError as exc:
        raise click.ClickException(str(exc)) from None


def file_options(command: Any) -> Any:
    """--config, --state-dir and --log-level after a subcommand too (`mcp-spec-proxy tools --config x.yaml`)."""

    def remember(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            ctx.ensure_object(dict)[param.name or ""] = value

    command = click.option(
        "--log-level",
        "log_level",
        expose_value=False,
        callback=remember,
        type=LOG_LEVELS,
        help="As for the main command.",
    )(command)
    command = click.option(
        "--state-dir",
        "state_dir",
        expose_value=False,
        callback=remember,
        type=click.Path(file_okay=False),
        help="As for the main command.",
    )(command)
    return click.option(
        "--config",
        "-c",
        "config_path",
        expose_value=False,
        callback=remember,
        type=click.Path(dir_okay=False),
        help="As for the main command.",
    )(command)


@dataclass(frozen=True)
class Setup:
    """What every command that runs the proxy needs, built in one place (`setup`)."""

    config: ProxyConfig
    source: str
    state: StatePaths
    telemetry: Path | None
    early: Prespawned | None = None  # the launcher's stdio processes (`launch.main` hands them down in `obj`)

    def running(self, *, metered: bool = True) -> AbstractAsyncContextManager[Proxy]:
        """The proxy: models with their keys and LEASH are built from the config and the environment
        (`running_proxy`, the one place), before any backend starts. `metered`: counted for `/metrics`."""
        from mcp_spec_proxy.proxy import running_proxy

        return running_proxy(
            self.config,
            self.state,
            source=self.source,
            telemetry=self.telemetry,
            environ=os.environ,
            early=self.early,
            metered=metered,
        )


def setup(ctx: click.Context, *, telemetry: str | None = None, log_level: str = "WARNING") -> Setup:
    """Logging (`--log-level`, else `log_level`), the config, the state directory and the telemetry file."""
    level = ctx.obj.get("log_level") or log_level
    logs.configure(level, ctx.obj.get("log_format") or "text")
    from mcp_spec_proxy.proxy import StatePaths

    source = ctx.obj["config_path"]
    config = load(source)
    telemetry_file = telemetry or config.telemetry_file
    return Setup(
        config,
        source,
        StatePaths(state_dir_of(ctx.obj["state_dir"], config)),
        Path(os.path.expanduser(telemetry_file)) if telemetry_file else None,
        ctx.obj.get("prespawned"),
    )


def open_configured_leash(ctx: click.Context, *, strict: bool = False) -> Leash:
    """The configured Leash; `strict` for operator commands, where a LEASH failure must be an error."""
    from mcp_spec_proxy.proxy import open_leash

    source = ctx.obj["config_path"]
    config = load(source)
    try:
        leash = open_leash(config, os.environ, source, strict=strict)
    except ProxyError as exc:
        raise click.ClickException(str(exc)) from None
    if leash is None:
        raise click.ClickException("this config has no `leash:` section")
    return leash


def engine_problem(config: ProxyConfig, mode: Mode) -> str | None:
    """Why the SpecAgent engine cannot run `mode` with this config, or None (checked before backends start)."""
    missing = [config.review.model] if config.review.model not in config.models else []
    if mode != "strong-only" and "weak" not in config.models:
        missing.append("weak")
    if missing:
        return " and ".join(f"models.{name}" for name in missing) + f" must be configured ({MODELS_REFERENCE})"
    if mode == "spec+leash" and config.leash is None:
        return f"it needs a `leash:` section ({CONFIG_REFERENCE})"
    return None


def bind_check(host: str, port: int, *, option: str) -> None:
    """Fail in one line, before any backend starts, when the address cannot be listened on."""
    problem = listen_problem(host, port)
    if problem is not None:
        raise click.ClickException(
            f"{option}: cannot listen on {host}:{port}: {problem} — stop what holds that port, or choose another"
        )


def token_from_env(token_env: str | None) -> str | None:
    """The bearer token an HTTP front requires: read here, at the edge, from the variable named."""
    if not token_env:
        return None
    token = os.environ.get(token_env)
    if not token:
        raise click.ClickException(f"--token-env {token_env}: that environment variable is empty or not set")
    return token


def run_loop(main: Callable[[], Awaitable[T]]) -> T:
    """Run the event loop (uvloop's where it is installed: the `fast` extra); a ProxyError,
    however deep in task groups, becomes a clean CLI error."""
    try:
        return anyio.run(main, backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None})
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except BaseException as exc:
        found = _proxy_error(exc)
        if found is None:
            raise
        raise click.ClickException(str(found)) from None


def _proxy_error(exc: BaseException) -> ProxyError | None:
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _proxy_error(inner)) is not None:
                return found
    return None


@dataclass
class Stopping:
    """A serving command's stop, as signals drive it. Once a signal began it, later ones are ignored
    to the process's end: inside the event loop each is logged (`stop_on_signal`); after the loop,
    whose handlers end with it, the process ignores them outright (`after_loop`) — else SIGTERM's
    default would end it in the middle of its last closes (exit -15)."""

    begun: bool = False

    def after_loop(self) -> None:
        if self.begun:
            for number in (signal.SIGTERM, signal.SIGINT):
                signal.signal(number, signal.SIG_IGN)


async def stop_on_signal(
    scope: anyio.CancelScope,
    drain: Callable[[], Awaitable[None]] | None = None,
    cut: Callable[[], None] | None = None,
    stopping: Stopping | None = None,
) -> None:
    """Cancel `scope` at the first SIGTERM or SIGINT, so the backends close in order; with `drain`,
    only once it has returned (the calls in flight settled, or its grace ran out). A second signal
    `cut`s the drain short: the held calls are abandoned and their clients told so while the store
    still takes their lines (`Drain.cut`), then the stop goes on. Any later signal is logged and ignored."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            break
        if stopping is not None:
            stopping.begun = True
        if drain is not None:
            async with anyio.create_task_group() as tg:

                async def at_once() -> None:
                    second = True
                    async for number in signals:
                        if not second:
                            _ignored(number)
                            continue
                        second = False
                        logger.warning("a second signal: stopping without waiting for the calls in flight")
                        if cut is None:
                            tg.cancel_scope.cancel()
                        else:
                            cut()

                tg.start_soon(at_once)
                await drain()
                tg.cancel_scope.cancel()
        logger.info("stopping: closing backends")
        scope.cancel()
    _ignore_further_signals()


def _ignore_further_signals() -> None:
    """While the stop unwinds (the backends close in order, the fronts answer their last), a further
    signal is logged and ignored until the event loop ends: Python's default would raise
    KeyboardInterrupt through the unwinding (a traceback, exit 130), or end the process mid-close."""
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, _ignored, number)


def _ignored(number: int) -> None:
    logger.warning("%s while stopping: ignored, the stop is under way", signal.Signals(number).name)
