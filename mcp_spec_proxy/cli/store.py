"""`mcp-spec-proxy store migrate` (the Postgres schema), `store token-key` (a key for the OAuth tokens
kept there) and `mcp-spec-proxy audit` (the audit trail).

Both read the configured `store:`: for `files`, the state directory; for `postgres`, the database
named by `store.postgres.dsn_env`. psycopg is imported only when the config names Postgres.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from mcp_spec_proxy.cli.serve import main
from mcp_spec_proxy.cli.setup import file_options, load, run_loop, state_dir_of
from mcp_spec_proxy.errors import ConfigError

if TYPE_CHECKING:  # the store and the config's models load when a command runs, not for `--help`
    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.tools.fingerprints import FingerprintStore


def _dsn(ctx: click.Context, config: ProxyConfig) -> str | None:
    from mcp_spec_proxy.store import postgres_dsn

    try:
        return postgres_dsn(config, os.environ, ctx.obj["config_path"])
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _postgres(ctx: click.Context) -> Any:
    """The Postgres module, or one clear line when its extra is not installed."""
    try:
        from mcp_spec_proxy.store import postgres
    except ImportError as exc:
        raise click.ClickException(f"store.postgres needs {exc.name}: pip install 'mcp-spec-proxy[postgres]'") from None
    return postgres


def fingerprint_store(ctx: click.Context, config: ProxyConfig) -> FingerprintStore:
    """The configured fingerprint store (`tools accept` writes it; running replicas read it)."""
    from mcp_spec_proxy.store import StatePaths
    from mcp_spec_proxy.tools.fingerprints import FingerprintStore

    dsn = _dsn(ctx, config)
    if dsn is None or config.store == "files":
        return FingerprintStore(StatePaths(state_dir_of(ctx.obj["state_dir"], config)).fingerprints)
    found: FingerprintStore = _postgres(ctx).PgFingerprints(dsn, config.store.postgres.timeout)
    return found


@main.group()
def store() -> None:
    """The state store named by `store:` in the config."""


@store.command("migrate")
@file_options
@click.option(
    "--to",
    "to",
    type=click.IntRange(min=1),
    help="Apply the steps up to this version only (and breaking steps up to it, which replicas never apply).",
)
@click.pass_context
def store_migrate(ctx: click.Context, to: int | None) -> None:
    """Create or upgrade the Postgres schema (replicas also apply its additive steps when they start)."""
    config = load(ctx.obj["config_path"])
    dsn = _dsn(ctx, config)
    if dsn is None or config.store == "files":
        click.echo("store: files — nothing to migrate")
        return
    postgres = _postgres(ctx)
    timeout = config.store.postgres.timeout

    async def migrate() -> list[int]:
        applied: list[int] = await postgres.migrate_database(dsn, timeout, leash=config.leash is not None, to=to)
        return applied

    applied = run_loop(migrate)
    # The newest step this config's part of the schema has (a leash-only step is not a core database's).
    from mcp_spec_proxy.store.migrations import versions_wanted

    newest = max(versions_wanted(leash=config.leash is not None))
    latest = newest if to is None else min(to, newest)
    if applied:
        click.echo(f"applied migration(s) {', '.join(map(str, applied))}: schema at version {latest}")
    else:
        click.echo(f"schema is current (version {latest})")


@store.command("token-key")
def store_token_key() -> None:
    """Print a new key for the remote backends' OAuth tokens kept in Postgres (`store.postgres.token_key_env`).

    To rotate: set the variable to the new key, a comma, then the old one, on every replica; the
    old key may go once every login has been refreshed or made again."""
    from cryptography.fernet import Fernet

    click.echo(Fernet.generate_key().decode())


@main.command("audit")
@file_options
@click.option(
    "--session",
    help="Only the rows of this session: its id, or the name a client gave it (the Mcp-Spec-Proxy-Session header).",
)
@click.option("--tail", type=click.IntRange(min=1), help="Only the last N rows.")
@click.option("--principal", metavar="SUB", help="Only the rows of this principal's calls (its token's `sub`).")
@click.pass_context
def audit(ctx: click.Context, session: str | None, tail: int | None, principal: str | None) -> None:
    """Print the audit trail as JSON lines, oldest first (from the files or from Postgres)."""
    from mcp_spec_proxy.store import FileStore, StatePaths

    config = load(ctx.obj["config_path"])
    dsn = _dsn(ctx, config)

    async def rows() -> list[dict[str, Any]]:
        if dsn is None or config.store == "files":
            lines = await FileStore(StatePaths(state_dir_of(ctx.obj["state_dir"], config))).read_audit(None)
            if session is not None:
                pairs = {(str(_sub(line)), _client(line)) for line in lines if _sub(line) is not None}
                wanted = set(_session_ids(session, config, pairs))
                lines = [line for line in lines if line.get("session") in wanted]
            return lines if principal is None else [line for line in lines if _sub(line) == principal]
        timeout = config.store.postgres.timeout
        postgres = _postgres(ctx)
        ids: list[str] | None = None
        if session is not None:
            pairs = await postgres.read_audit_principals_once(dsn, timeout) if config.auth is not None else []
            ids = _session_ids(session, config, pairs)
        found: list[dict[str, Any]] = await postgres.read_audit_once(dsn, timeout, ids, tail, principal)
        return found

    found = run_loop(rows)
    for row in found[-tail:] if tail else found:
        click.echo(json.dumps(row, ensure_ascii=False, default=str))


def _session_ids(session: str, config: ProxyConfig, principals: Iterable[tuple[str, str | None]]) -> list[str]:
    """The ids `--session` may mean: the id itself, or those of the session a client named so — with no
    principal, or (under `auth:`) named by each (subject, client) on the trail, as the front keys it."""
    from mcp_spec_proxy.principal import Principal
    from mcp_spec_proxy.sessions.named_sessions import keys_of_name

    issuer = config.auth.issuer if config.auth is not None else None
    named = [Principal(issuer, sub, client) for sub, client in principals] if issuer is not None else []
    return [session, *keys_of_name(session, named)]


def _client(line: dict[str, Any]) -> str | None:
    named = line.get("principal")
    client = named.get("client_id") if isinstance(named, dict) else None
    return client if isinstance(client, str) else None


def _sub(line: dict[str, Any]) -> object:
    """The subject an audit line names (`principal.sub`), if it names one."""
    named = line.get("principal")
    return named.get("sub") if isinstance(named, dict) else None
