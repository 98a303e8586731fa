"""The command line: the only place that reads the environment and files into config.

mcp-spec-proxy --config servers.yaml                 serve on stdio (Claude Desktop, IDEs)
mcp-spec-proxy --config servers.yaml --http :8765    serve streamable HTTP on 127.0.0.1:8765
mcp-spec-proxy tools                                 every tool with its effect and why
mcp-spec-proxy tools accept NAME                     accept a tool's changed definition, or a new tool
mcp-spec-proxy check                                 validate the config and exit
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import click

from mcp_spec_proxy import __version__
from mcp_spec_proxy.catalog import public_name
from mcp_spec_proxy.config import ProxyConfig, load_config
from mcp_spec_proxy.engine import MODES, Mode, RunResult
from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.fingerprints import FingerprintStore
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.fronts.stdio import serve_stdio
from mcp_spec_proxy.leash.bank import Label
from mcp_spec_proxy.leash.calibrate import (
    MIN_HELD_OUT,
    Calibration,
    accept_curve,
    accept_table,
    curve,
    pick,
    pick_accept,
    table,
)
from mcp_spec_proxy.leash.layers import Leash, Score
from mcp_spec_proxy.proxy import Proxy, StatePaths, open_leash, running_proxy, validate
from mcp_spec_proxy.trajectory import Step

logger = logging.getLogger("mcp_spec_proxy")
T = TypeVar("T")


def _state_dir(option: str | None, config: ProxyConfig) -> Path:
    chosen = option or config.state_dir
    if chosen:
        return Path(os.path.expanduser(chosen))
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "mcp-spec-proxy"


def _load(path: str) -> ProxyConfig:
    try:
        return load_config(Path(path), os.environ)
    except ProxyError as exc:
        raise click.ClickException(str(exc)) from None


def _parse_http(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        raise click.BadParameter(f"{value!r}: use HOST:PORT or :PORT, e.g. 127.0.0.1:8765", param_hint="--http")
    return host, int(port)


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


LOG_LEVELS = click.Choice(["DEBUG", "INFO", "WARNING"])


def _file_options(command: Any) -> Any:
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


@click.group(invoke_without_command=True)
@config_option
@state_option
@click.option("--http", "http", metavar="HOST:PORT", help="Serve streamable HTTP instead of stdio.")
@click.option("--token-env", metavar="VAR", help="Require `Authorization: Bearer $VAR` on the HTTP front.")
@click.option("--allow-host", multiple=True, help="Extra Host header value the HTTP front accepts.")
@click.option("--telemetry", type=click.Path(dir_okay=False), help="Append one JSON line per decision to FILE.")
@click.option(
    "--log-level", type=LOG_LEVELS, help="Default: INFO when serving, WARNING for `tools`, `run` and the rest."
)
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
    log_level: str | None,
) -> None:
    """An MCP server in front of your MCP servers: reads pass, writes wait for a verdict."""
    ctx.ensure_object(dict)
    ctx.obj.update(config_path=config_path, state_dir=state_dir, log_level=log_level)
    if ctx.invoked_subcommand is not None:
        return
    token = _token(token_env)
    address = _parse_http(http) if http else None
    if address is not None:
        _bind_check(*address, option="--http")
    setup = _setup(ctx, telemetry=telemetry, log_level="INFO")

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            async with setup.running() as proxy:
                front = McpFront(proxy, version=__version__)
                if address is None:
                    await serve_stdio(front)
                else:
                    await tg.start(
                        lambda task_status: serve_http(
                            front, *address, token=token, allowed_hosts=list(allow_host), task_status=task_status
                        )
                    )
                    await anyio.sleep_forever()
            tg.cancel_scope.cancel()

    _run(serve)


@dataclass(frozen=True)
class _Setup:
    """What every command that runs the proxy needs, built in one place (`_setup`)."""

    config: ProxyConfig
    source: str
    state: StatePaths
    telemetry: Path | None

    def running(self) -> AbstractAsyncContextManager[Proxy]:
        """The proxy: models with their keys and LEASH are built from the config and the environment
        (`running_proxy`, the one place), before any backend starts."""
        return running_proxy(self.config, self.state, source=self.source, telemetry=self.telemetry, environ=os.environ)


def _setup(ctx: click.Context, *, telemetry: str | None = None, log_level: str = "WARNING") -> _Setup:
    """Logging (`--log-level`, else `log_level`), the config, the state directory and the telemetry file."""
    level = ctx.obj.get("log_level") or log_level
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    source = ctx.obj["config_path"]
    config = _load(source)
    telemetry_file = telemetry or config.telemetry
    return _Setup(
        config,
        source,
        StatePaths(_state_dir(ctx.obj["state_dir"], config)),
        Path(os.path.expanduser(telemetry_file)) if telemetry_file else None,
    )


def _bind_check(host: str, port: int, *, option: str) -> None:
    """Fail in one line, before any backend starts, when the address cannot be listened on."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            raise click.ClickException(
                f"{option}: cannot listen on {host}:{port}: {exc.strerror or exc}"
                " — stop what holds that port, or choose another"
            ) from None


def _token(token_env: str | None) -> str | None:
    """The bearer token an HTTP front requires: read here, at the edge, from the variable named."""
    if not token_env:
        return None
    token = os.environ.get(token_env)
    if not token:
        raise click.ClickException(f"--token-env {token_env}: that environment variable is empty or not set")
    return token


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """Run the event loop; a ProxyError, however deep in task groups, becomes a clean CLI error."""
    try:
        return anyio.run(main)
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


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            logger.info("stopping: closing backends")
            scope.cancel()
            return


@main.group(invoke_without_command=True)
@_file_options
@click.pass_context
def tools(ctx: click.Context) -> None:
    """List every tool with its effect (read/write) and why; open-world reads are marked."""
    if ctx.invoked_subcommand is not None:
        return
    setup = _setup(ctx)
    config = setup.config

    async def listing() -> list[Any]:
        async with setup.running() as proxy:
            unavailable = [
                f"{b.name}: {b.last_error}" for b in proxy.backends.backends.values() if b.status != "connected"
            ]
            return [proxy.catalog.tools(), unavailable]

    found, unavailable = _run(listing)
    width = max((len(t.name) for t in found), default=10)
    for tool in sorted(found, key=lambda t: t.name):
        review = f"  [review: {tool.review or config.review.default}]" if tool.effect == "write" else ""
        # A read that reaches the outside world runs unreviewed; `hold_open_world: true` holds it.
        world = "  [open world]" if tool.effect == "read" and tool.open_world else ""
        click.echo(f"{tool.name:<{width}}  {tool.effect:<5}  {tool.reason}: {tool.why}{world}{review}")
    for line in unavailable:
        click.echo(f"unavailable  {line}", err=True)


@tools.command("accept")
@_file_options
@click.argument("names", nargs=-1)
@click.option("--all", "accept_all", is_flag=True, help="Accept every changed definition and new tool.")
@click.pass_context
def tools_accept(ctx: click.Context, names: tuple[str, ...], accept_all: bool) -> None:
    """Accept the changed definition of NAME, or NAME as a new tool (its listed name, or server/tool)."""
    config = _load(ctx.obj["config_path"])
    store = FingerprintStore(StatePaths(_state_dir(ctx.obj["state_dir"], config)).fingerprints)
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
    if "/" in name:
        return name
    known = store.keys()
    for key in known:
        server, tool = key.split("/", 1)
        if server in config.servers and (
            public_name(server, tool, config.separator, config.max_name_length, config.servers) == name
        ):
            return key
    if not any(name.startswith(f"{server}{config.separator}") for server in config.servers):
        raise click.ClickException(f"{name!r} does not start with a configured server name and {config.separator!r}")
    raise click.ClickException(
        f"{name!r} is not a tool the proxy has seen; run `mcp-spec-proxy tools` for the listed names"
    )


@main.command()
@_file_options
@click.argument("task")
@click.option("--mode", type=click.Choice(MODES), default="spec", show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), help="Override speculation.max_steps for this task.")
@click.option("--telemetry", type=click.Path(dir_okay=False), help="Append model calls and the summary to FILE.")
@click.pass_context
def run(ctx: click.Context, task: str, mode: Mode, max_steps: int | None, telemetry: str | None) -> None:
    """Run TASK with the SpecAgent engine over the configured servers; print the answer and a summary."""
    setup = _setup(ctx, telemetry=telemetry)
    problem = _engine_problem(setup.config, mode)
    if problem:
        raise click.ClickException(f"run --mode {mode}: {problem}")
    on_terminal = sys.stderr.isatty()

    async def progress(message: str) -> None:
        if on_terminal:
            click.echo(f"\r\033[K… {message}"[:200], nl=False, err=True)
        else:
            click.echo(f"… {message}", err=True)

    async def execute() -> RunResult:
        async with setup.running() as proxy:
            assert proxy.engine is not None
            return await proxy.engine.run(task, mode, progress=progress, max_steps=max_steps, baseline=True)

    result = _run(execute)
    if on_terminal:
        click.echo("\r\033[K", nl=False, err=True)
    click.echo(result.answer if result.answer is not None else f"(no answer: {result.status})")
    summary = result.summary()
    click.echo(
        "\n"
        + "  ".join(
            f"{key}={summary[key]}"
            for key in (
                "status",
                "mode",
                "steps",
                "segments",
                "acceptance",
                "strong_calls",
                "strong_decode_tokens",
                "strong_prefill_tokens",
                "weak_decode_tokens",
                "wall_s",
            )
        ),
        err=True,
    )
    if result.error:
        click.echo(f"error: {result.error}", err=True)
    if result.status != "answered":
        raise SystemExit(1)


@main.command()
@_file_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind (loopback unless told).")
@click.option("--port", default=18081, show_default=True, type=click.IntRange(0, 65535))
@click.option("--telemetry", type=click.Path(dir_okay=False), help="One JSON line per request to FILE.")
@click.option("--token-env", metavar="VAR", help="Require `Authorization: Bearer $VAR` on every request.")
@click.option("--allow-host", multiple=True, help="Extra Host header value (and Origin host) the gateway accepts.")
@click.pass_context
def gateway(
    ctx: click.Context,
    host: str,
    port: int,
    telemetry: str | None,
    token_env: str | None,
    allow_host: tuple[str, ...],
) -> None:
    """Serve an OpenAI-compatible /v1/chat/completions backed by the SpecAgent engine."""
    token = _token(token_env)
    _bind_check(host, port, option="--port")
    setup = _setup(ctx, telemetry=telemetry, log_level="INFO")
    problem = _engine_problem(setup.config, "strong-only")  # each request names its mode; `check` lists them
    if problem:
        raise click.ClickException(f"gateway: {problem}")

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            async with setup.running() as proxy:
                front = Gateway(proxy)
                bound = await tg.start(
                    lambda task_status: serve_gateway(
                        front, host, port, token=token, allowed_hosts=list(allow_host), task_status=task_status
                    )
                )
                click.echo(f"OpenAI-compatible gateway on http://{host}:{bound}/v1", err=True)
                await anyio.sleep_forever()

    _run(serve)


@main.command("report-outcome")
@_file_options
@click.argument("task_id")
@click.option("--success/--failure", required=True, help="Whether the run did what the user asked.")
@click.pass_context
def report_outcome(ctx: click.Context, task_id: str, success: bool) -> None:
    """Label a finished run (its task id is in the run's trace) for LEASH's task bank."""
    leash = _leash(ctx)

    async def label() -> bool:
        return await leash.report_outcome(task_id, success)

    if not _run(label):
        raise click.ClickException(f"no run {task_id!r} is remembered in {leash.config.bank_dir}")
    click.echo(f"recorded: run {task_id} {'succeeded' if success else 'failed'}")


@main.group()
def bank() -> None:
    """LEASH's banks: stats, import, calibrate."""


@bank.command("stats")
@_file_options
@click.pass_context
def bank_stats(ctx: click.Context) -> None:
    """Print what each bank holds."""
    leash = _leash(ctx, strict=True)
    for name, store in (("task", leash.tasks), ("step", leash.steps)):
        click.echo(f"{name}: " + json.dumps(store.stats(), default=str))


@bank.command("import")
@_file_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.pass_context
def bank_import(ctx: click.Context, file: str) -> None:
    """Add labelled examples from a JSONL FILE.

    Each line: {"kind": "task", "text": "...", "label": "success"|"failure"} or
    {"kind": "step", "tool": "...", "arguments": {...}, "observation": "...", "label": ...}.
    """
    leash = _leash(ctx, strict=True)  # a label not stored is an error here
    tasks, steps = _examples(Path(file))

    async def add() -> None:
        for text, label in tasks:
            await leash.label_task(text, label == "success", source="import")
        if steps:
            await leash.label_steps([s for s, _ in steps], [label for _, label in steps], source="import")

    _run(add)
    click.echo(f"imported {len(tasks)} tasks and {len(steps)} steps")


@bank.command("calibrate")
@_file_options
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--target-rate", type=click.FloatRange(0, 1), help="Escalate at most this share of steps.")
@click.option("--target-precision", type=click.FloatRange(0, 1), help="Escalations must be failures this often.")
@click.option(
    "--max-false-accept",
    type=click.FloatRange(0, 1),
    help="For `review: leash`: pick accept_threshold so at most this share of accepted steps failed, and record it.",
)
@click.pass_context
def bank_calibrate(
    ctx: click.Context,
    file: str,
    target_rate: float | None,
    target_precision: float | None,
    max_false_accept: float | None,
) -> None:
    """Pick a step threshold on labelled held-out steps (FILE, as for import, but NOT imported); print the curve.

    With --max-false-accept, pick leash.accept_threshold and write the calibration record
    (`calibration.json` in bank_dir) without which `review: leash` forwards nothing on its own.
    """
    if sum(option is not None for option in (target_rate, target_precision, max_false_accept)) != 1:
        raise click.BadParameter("give one of --target-rate, --target-precision and --max-false-accept")
    leash = _leash(ctx, strict=True)
    _, steps = _examples(Path(file))
    if not steps:
        raise click.ClickException(f"{file}: no step examples to calibrate on")
    failed = [label == "failure" for _, label in steps]

    async def scores() -> list[Score]:
        return [await leash.step_score(step) for step, _ in steps]

    found = _run(scores)
    if max_false_accept is not None:
        _calibrate_accept(leash, file, found, failed, max_false_accept)
        return
    points = curve([score.value if score.value is not None else 0.5 for score in found], failed)
    click.echo(table(points))
    chosen = pick(points, target_rate=target_rate, target_precision=target_precision)
    click.echo(
        f"\nthreshold {chosen.threshold:.2f}: escalates {chosen.escalation_rate:.1%}, precision"
        f" {chosen.precision:.1%}, recall {chosen.recall:.1%} — set leash.escalate_threshold and"
        " leash.observe_threshold to it"
    )


def _calibrate_accept(leash: Leash, file: str, found: list[Score], failed: list[bool], bound: float) -> None:
    if leash.encoder.info.name == "hashing":
        raise click.ClickException(
            "the hashing encoder cannot back `review: leash`: set leash.encoder to embedding (or hidden) first"
        )
    if len(found) < MIN_HELD_OUT:
        raise click.ClickException(
            f"{file}: {len(found)} held-out steps say too little about a false-accept rate;"
            f" give at least {MIN_HELD_OUT}"
        )
    # A held-out step whose twin is in the bank scores itself: its figure says nothing about new steps.
    twins = sum(1 for score in found if score.neighbours and score.neighbours[0].score >= 0.9999)
    points = accept_curve([score.value for score in found], failed)
    click.echo(accept_table(points))
    chosen = pick_accept(points, bound)
    if chosen is None:
        raise click.ClickException(
            f"no threshold accepts any held-out step with at most {bound:.1%} false accepts; nothing recorded"
        )
    record = Calibration.measured(
        leash.encoder.info, chosen, failed, max_false_accept=bound, bank_steps=len(leash.steps), source=file
    )
    path = record.save(Path(leash.config.bank_dir))
    if twins:
        click.echo(
            f"\nwarning: {twins} of {len(found)} held-out steps have an identical step in the bank; hold them out"
            " (do not import them) for honest figures",
            err=True,
        )
    click.echo(
        f"\naccept_threshold {chosen.threshold:.2f}: accepts {chosen.accept_rate:.1%} of {len(found)} held-out steps,"
        f" {chosen.false_accepts} of {chosen.accepted} accepted failed ({chosen.false_accept_rate:.1%}) —"
        f" recorded in {path}; set leash.accept_threshold to {chosen.threshold:.2f} or lower"
    )


def _leash(ctx: click.Context, *, strict: bool = False) -> Leash:
    """The configured Leash; `strict` for operator commands, where a LEASH failure must be an error."""
    source = ctx.obj["config_path"]
    config = _load(source)
    try:
        leash = open_leash(config, os.environ, source, strict=strict)
    except ProxyError as exc:
        raise click.ClickException(str(exc)) from None
    if leash is None:
        raise click.ClickException("this config has no `leash:` section")
    return leash


def _examples(path: Path) -> tuple[list[tuple[str, str]], list[tuple[Step, Label]]]:
    tasks: list[tuple[str, str]] = []
    steps: list[tuple[Step, Label]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            label = item["label"]
            if label not in ("success", "failure"):
                raise ValueError("label must be success or failure")
            if item.get("kind", "step") == "task":
                tasks.append((str(item["text"]), label))
            else:
                step = Step(str(item["tool"]), dict(item.get("arguments") or {}), "read", item.get("observation"))
                steps.append((step, label))
        except (ValueError, KeyError, TypeError) as exc:
            raise click.ClickException(f"{path}:{number}: {exc} — see `mcp-spec-proxy bank import --help`") from None
    return tasks, steps


@main.command()
@_file_options
@click.pass_context
def check(ctx: click.Context) -> None:
    """Validate the config file as the proxy does (keys, LEASH, reviewers) without starting a backend."""
    setup = _setup(ctx)
    config = setup.config

    async def validated() -> None:
        await validate(config, os.environ, setup.source)

    _run(validated)
    click.echo(f"{setup.source}: ok ({len(config.active_servers())} servers enabled)")
    if not config.models and config.leash is None:
        return  # a plain MCP proxy: `run` and the gateway are not what this config is for
    for mode in MODES:
        problem = _engine_problem(config, mode)
        if problem:
            click.echo(f"note: `run --mode {mode}` and the gateway's {mode!r} model are unavailable: {problem}")


def _engine_problem(config: ProxyConfig, mode: Mode) -> str | None:
    """Why the SpecAgent engine cannot run `mode` with this config, or None (checked before backends start)."""
    missing = [config.review.model] if config.review.model not in config.models else []
    if mode != "strong-only" and "weak" not in config.models:
        missing.append("weak")
    if missing:
        return " and ".join(f"models.{name}" for name in missing) + " must be configured (see the README)"
    if mode == "spec+leash" and config.leash is None:
        return "it needs a `leash:` section (see the README)"
    return None
