"""`mcp-spec-proxy explain TOOL --args JSON [--principal JSON]`: which rule of `rules:` a call
would meet, and which reviewer — without running it; or that `access:` hides the tool from that
principal (to them it does not exist).

The backends are reached (as `tools` reaches them) so the tool is the one the proxy lists: its
server, its annotations, its effect and its own reviewer are what a real call meets.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import file_options, run_loop, setup

if TYPE_CHECKING:  # the catalog and the config's models load when the command runs, not for `--help`
    from mcp_spec_proxy.calls.rules import Decision
    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.tools.catalog import CatalogTool


def _json_object(option: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        why = f"not JSON ({exc.msg} at column {exc.colno}) — write an object, e.g. '{{\"amount\": 250}}'"
        raise click.BadParameter(why, param_hint=option) from None
    if not isinstance(value, dict):
        raise click.BadParameter("not a JSON object — write one, e.g. '{\"amount\": 250}'", param_hint=option)
    return value


@main.command("explain")
@file_options
@click.argument("tool")
@click.option("--args", "arguments", default="{}", show_default=True, help="The call's arguments, a JSON object.")
@click.option(
    "--principal",
    default=None,
    help='Who asks, a JSON object: {"sub": ..., "client_id": ..., "scopes": [...], "groups": [...]}.',
)
@click.option("--session", default="explain", show_default=True, help="The session id rules see.")
@click.pass_context
def explain(ctx: click.Context, tool: str, arguments: str, principal: str | None, session: str) -> None:
    """Print which rule of `rules:` a call of TOOL would meet, and which reviewer (nothing runs)."""
    args = _json_object("--args", arguments)
    who = _json_object("--principal", principal) if principal is not None else None
    built = setup(ctx)

    async def find() -> tuple[CatalogTool, Decision, str | None] | str | None:
        from mcp_spec_proxy.errors import InvalidArguments, ToolNotFound
        from mcp_spec_proxy.tools.catalog import strip_intent

        async with built.running() as proxy:
            await proxy.backends.settled()
            try:
                listed = proxy.catalog.lookup(tool)
            except ToolNotFound:
                return None  # told outside the proxy's task group, which would wrap an exception
            if not proxy.access.sees(who, listed.server, listed.name):
                return listed.name
            try:
                proxy.catalog.validate(listed, args)
                refused = None
            except InvalidArguments as exc:
                refused = str(exc)
            forwarded, _ = strip_intent(listed, args)
            met, decision = proxy.gate.policy.decide(listed, forwarded, who, session)
            return met, decision, refused

    found = run_loop(find)
    if found is None:
        raise click.ClickException(f"{tool!r} is not a tool the proxy lists — run `mcp-spec-proxy tools` for the names")
    if isinstance(found, str):
        click.echo(f"tool: {found}")
        click.echo("access: hidden from this principal by `access:` — to them it is an unknown tool; nothing runs")
        return
    met, decision, refused = found
    for line in describe(built.config, met, decision, refused):
        click.echo(line)


def describe(config: ProxyConfig, tool: CatalogTool, decision: Decision, refused: str | None) -> list[str]:
    """What `explain` prints: the tool, the rule and the reviewer, one line each."""
    from mcp_spec_proxy.tools.classification import HELD_REASONS

    lines = [f"tool: {tool.name} ({tool.effect}; {tool.reason}: {tool.why})"]
    if decision.rule is None:
        lines.append("rule: none matched — the tool's own reviewer decides")
    else:
        number = decision.rule if isinstance(decision.rule, int) else _number(config, decision.rule)
        lines.append(f"rule: {decision.rule} — when: {config.rules[number - 1].when}")
    if decision.failed is not None:
        lines.append(f"failed closed: {decision.failed}")
    if refused is not None:
        lines.append(f"reviewer: none — the proxy refuses these arguments: {refused}")
    elif tool.reason in HELD_REASONS:
        lines.append(f"reviewer: none — the tool is held until `mcp-spec-proxy tools accept {tool.name}`")
    elif decision.deny is not None:
        lines.append(f"reviewer: deny — {decision.deny}")
    elif tool.effect == "read":
        lines.append("reviewer: none — a read runs at once")
    else:
        lines.append(f"reviewer: {decision.review or tool.review or config.review.default}")
    return lines


def _number(config: ProxyConfig, name: str) -> int:
    return next(n for n, rule in enumerate(config.rules, 1) if rule.name == name)
