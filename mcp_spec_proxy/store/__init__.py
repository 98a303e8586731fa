"""The state floor: where the audit trail, sessions, approval tickets and fingerprints live.

One seam, two stores (`store:` in servers.yaml):

* `files` (the default): the state directory of one process — the audit log and fingerprints
  in files, sessions and tickets in memory. Nothing to install.
* `postgres`: one database shared by many replicas behind a load balancer (`postgres.py`); a
  session's next request may land on any replica. psycopg is imported only there, so a user who
  never configures `store:` never needs it.

Remote backends' OAuth tokens follow the same choice (`token_stores`): a file per login in the
state directory (`tokens.py`), or under `postgres` a row per login in the database, encrypted with
the key in `store.postgres.token_key_env`, which every replica reads and refreshes (`pg_tokens.py`).

`open_store(config, state, environ)` is an async context manager yielding a `Store`; `run` is
its background work (both write the audit lines of settled calls that could not be written at
once; the Postgres store also batches read rows, sweeps the held calls of replicas that
died, and merges and refreshes the fingerprints off the request path), started in the proxy's
task group.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc

from mcp_spec_proxy.calls.audit import AuditLog, AuditSink, read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.store.sessions import ApprovalStore, LocalApprovals, LocalSessions, SessionStore, Ticket
from mcp_spec_proxy.store.tokens import TokenFile, TokenStore
from mcp_spec_proxy.tools.fingerprints import FingerprintStore

__all__ = [
    "ApprovalStore",
    "FileStore",
    "SessionStore",
    "StatePaths",
    "Store",
    "Ticket",
    "TokenStores",
    "open_store",
    "postgres_dsn",
    "token_stores",
]

TokenStores = Callable[[str, str], TokenStore]  # (server, its URL) -> where its OAuth tokens live


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def fingerprints(self) -> Path:
        return self.root / "fingerprints.json"

    @property
    def audit(self) -> Path:
        return self.root / "audit.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


class Store(Protocol):
    audit: AuditSink
    fingerprints: FingerprintStore
    sessions: SessionStore
    approvals: ApprovalStore

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None: ...

    async def read_audit(self, session: str | None = None) -> list[dict[str, Any]]: ...

    async def health(self) -> list[str]:
        """Why the store cannot serve now (unreachable, schema behind): empty when it can. Never raises."""
        ...


class FileStore:
    """Today's state of one process: files in the state directory, sessions and tickets in memory."""

    def __init__(self, state: StatePaths | None) -> None:
        self._state = state
        self.log = AuditLog(state.audit if state else None)
        self.audit: AuditSink = self.log
        self.fingerprints = FingerprintStore(state.fingerprints if state else None)
        self.sessions: SessionStore = LocalSessions()
        self.approvals: ApprovalStore = LocalApprovals()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write the audit lines of settled calls that the disk refused once (`AuditLog.later`)."""
        task_status.started()
        await self.log.run()

    async def read_audit(self, session: str | None = None) -> list[dict[str, Any]]:
        if self._state is None or not self._state.audit.exists():
            return []
        rows = await anyio.to_thread.run_sync(read_audit, self._state.audit)
        return [row for row in rows if session is None or row.get("session") == session]

    async def health(self) -> list[str]:
        return []  # files in this process's state directory: a failing disk shows as refused writes

    def close(self) -> None:
        self.log.close()


def postgres_dsn(config: ProxyConfig, environ: Mapping[str, str], source: str) -> str | None:
    """The DSN of `store.postgres`, read from the variable it names; None for the files store."""
    if config.store == "files":
        return None
    variable = config.store.postgres.dsn_env
    dsn = environ.get(variable)
    if not dsn:
        raise ConfigError(
            source,
            "store.postgres.dsn_env",
            f"environment variable {variable} is not set",
            "export it with the database's DSN (postgresql://user:password@host/db), or remove `store:`",
        )
    return dsn


def token_stores(config: ProxyConfig, state_root: Path, environ: Mapping[str, str], source: str) -> TokenStores:
    """Where each URL backend's OAuth tokens live: its file in the state directory, or under
    `store: postgres` its row in the database — with the key read from the variable that
    `store.postgres.token_key_env` names (a `ConfigError` naming it, when a backend has `auth:` and
    the variable is unset or holds no key)."""
    dsn = postgres_dsn(config, environ, source)
    if dsn is None or config.store == "files":
        return lambda server, url: TokenFile.of(state_root, server, url)
    settings = config.store.postgres
    if not any(server.auth is not None and server.url is not None for server in config.active_servers().values()):
        return lambda server, url: TokenFile.of(state_root, server, url)  # asked of no server: no key needed
    try:
        from mcp_spec_proxy.store.pg_tokens import PgTokens, token_cipher  # psycopg is needed only here
    except ImportError as exc:
        raise ConfigError(
            source, "store.postgres", f"{exc.name} is not installed", "pip install 'mcp-spec-proxy[postgres]'"
        ) from None
    cipher = token_cipher(environ.get(settings.token_key_env), settings.token_key_env, source)
    return lambda server, url: PgTokens(dsn, settings.timeout, cipher, server, url, key_env=settings.token_key_env)


@asynccontextmanager
async def open_store(
    config: ProxyConfig, state: StatePaths | None, environ: Mapping[str, str], source: str = "config"
) -> AsyncIterator[Store]:
    """The configured store, open: for Postgres, reached, migrated and registered as a live replica."""
    dsn = postgres_dsn(config, environ, source)
    if dsn is None or config.store == "files":
        files = FileStore(state)
        try:
            yield files
        finally:
            files.close()
        return
    try:
        from mcp_spec_proxy.store.postgres import PgStore  # psycopg is needed only here
    except ImportError as exc:
        raise ConfigError(
            source, "store.postgres", f"{exc.name} is not installed", "pip install 'mcp-spec-proxy[postgres]'"
        ) from None
    async with PgStore.open(dsn, config.store.postgres, leash=config.leash is not None) as store:
        yield store
