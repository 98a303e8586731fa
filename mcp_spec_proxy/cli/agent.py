"""The SpecAgent engine from the command line: `run` a task, serve the OpenAI-compatible `gateway`,
and `report-outcome` of a finished run for LEASH's task bank.

`run` and `gateway` check the config can drive the engine (`engine_problem`) before any backend starts.
The engine and the gateway's web stack are imported inside the commands, not for every `--help`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import anyio
import click

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import (
    Stopping,
    bind_check,
    engine_problem,
    file_options,
    open_configured_leash,
    run_loop,
    setup,
    stop_on_signal,
    token_from_env,
)

if TYPE_CHECKING:
    from mcp_spec_proxy.engine import Mode, RunResult
    from mcp_spec_proxy.proxy import Proxy

# `engine.MODES`, written out: importing the engine costs the SDK (a test holds the two equal).
MODES: tuple[Mode, ...] = ("spec", "weak-only", "strong-only", "spec+leash")

# The summary line `run` prints on stderr, in this order.
_SUMMARY_KEYS = (
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


@main.command()
@file_options
@click.argument("task")
@click.option("--mode", type=click.Choice(MODES), default="spec", show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), help="Override speculation.max_steps for this task.")
@click.option("--telemetry", type=click.Path(dir_okay=False), help="Append model calls and the summary to FILE.")
@click.pass_context
def run(ctx: click.Context, task: str, mode: Mode, max_steps: int | None, telemetry: str | None) -> None:
    """Run TASK with the SpecAgent engine over the configured servers; print the answer and a summary."""
    built = setup(ctx, telemetry=telemetry)
    problem = engine_problem(built.config, mode)
    if problem:
        raise click.ClickException(f"run --mode {mode}: {problem}")
    on_terminal = sys.stderr.isatty()

    async def progress(message: str) -> None:
        if on_terminal:
            click.echo(f"\r\033[K… {message}"[:200], nl=False, err=True)
        else:
            click.echo(f"… {message}", err=True)

    async def execute() -> RunResult:
        async with built.running() as proxy:
            assert proxy.engine is not None
            await proxy.backends.settled()  # the task sees every backend's tools, not those ready first
            return await proxy.engine.run(task, mode, progress=progress, max_steps=max_steps, baseline=True)

    result = run_loop(execute)
    if on_terminal:
        click.echo("\r\033[K", nl=False, err=True)
    click.echo(result.answer if result.answer is not None else f"(no answer: {result.status})")
    summary = result.summary()
    click.echo("\n" + "  ".join(f"{key}={summary[key]}" for key in _SUMMARY_KEYS), err=True)
    if result.error:
        click.echo(f"error: {result.error}", err=True)
    if result.status != "answered":
        raise SystemExit(1)


@main.command()
@file_options
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
    from mcp_spec_proxy.calls.drain import SETTLE_S
    from mcp_spec_proxy.fronts.asgi import host_names
    from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
    from mcp_spec_proxy.fronts.probes import Door

    token = token_from_env(token_env)
    bind_check(host, port, option="--port")
    built = setup(ctx, telemetry=telemetry, log_level="INFO")
    problem = engine_problem(built.config, "strong-only")  # each request names its mode; `check` lists them
    if problem:
        raise click.ClickException(f"gateway: {problem}")
    if built.config.auth is not None and token:
        # `--token-env` is one person's shared secret; `auth:` knows each principal: one check, not two.
        raise click.ClickException(f"--token-env: {built.source} has `auth:`, which replaces it — drop --token-env")

    async def serve() -> None:
        door = Door(token=token, hosts=host_names(host, allow_host))
        running: list[Proxy] = []

        async def drain() -> None:
            for proxy in running:  # none while it starts: nothing is in flight then
                await proxy.gate.drain.run(proxy.config.drain_s, approvals=True)
            with anyio.move_on_after(SETTLE_S):
                await door.answered()

        def cut() -> None:
            for proxy in running:
                proxy.gate.drain.cut()

        async with anyio.create_task_group() as tg:
            tg.start_soon(stop_on_signal, tg.cancel_scope, drain, cut, stopping)
            listening = await tg.start(door.serve, host, port)  # `/readyz` says "starting" meanwhile
            async with built.running() as proxy:
                running.append(proxy)
                front = Gateway(proxy)
                bound = await tg.start(
                    lambda task_status: serve_gateway(
                        front,
                        host,
                        listening,
                        token=token,
                        allowed_hosts=list(allow_host),
                        door=door,
                        task_status=task_status,
                    )
                )
                click.echo(f"OpenAI-compatible gateway on http://{host}:{bound}/v1", err=True)
                await anyio.sleep_forever()

    stopping = Stopping()
    try:
        run_loop(serve)
    finally:
        stopping.after_loop()


@main.command("report-outcome")
@file_options
@click.argument("task_id")
@click.option("--success/--failure", required=True, help="Whether the run did what the user asked.")
@click.pass_context
def report_outcome(ctx: click.Context, task_id: str, success: bool) -> None:
    """Label a finished run (its task id is in the run's trace) for LEASH's task bank."""
    leash = open_configured_leash(ctx)

    async def label() -> bool:
        return await leash.report_outcome(task_id, success)

    if not run_loop(label):
        raise click.ClickException(f"no run {task_id!r} is remembered in {leash.config.bank_dir}")
    click.echo(f"recorded: run {task_id} {'succeeded' if success else 'failed'}")
