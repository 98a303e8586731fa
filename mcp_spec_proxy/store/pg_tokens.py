"""Remote backends' OAuth tokens in the Postgres store: every replica sees one login.

`PgTokens` keeps the `TokenStore` contract of `store/tokens.py` (`TokenFile`) in a row of
`backend_tokens` per (server, principal): bound to the backend's URL (a row kept for another URL
is nothing to this one, and writing replaces it whole), the access token's expiry kept beside the
tokens, the client registration kept across logouts, each principal's row keyed by the same digest
of issuer and subject as their file.

What is secret is encrypted before it leaves the process: the tokens and the client registration
(its secret with it) are Fernet ciphertexts under the key(s) in the variable `store.postgres.token_key_env`
names, newest first (`MultiFernet`: a rotated key still reads the rows the old one wrote, and
each write uses the newest). The plaintext names its server, principal and URL, so a row copied
onto another's place in the table is refused, not used. A row no key opens (the key changed) is
said in one line and read as no login: the person logs in again.

A refresh is held (`hold_refresh`) by a session-level advisory lock on the row's (server,
principal), on a connection of its own: the replica that takes it second re-reads the row and uses
the first one's new tokens instead of spending a refresh token the server has already rotated.
Each operation takes a short connection of its own: tokens are read at a connection's start and
written at a login or a refresh, never on a call's path.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import ValidationError

from mcp_spec_proxy.errors import ConfigError, StateError
from mcp_spec_proxy.store.pg_audit import DB_ERRORS, problem
from mcp_spec_proxy.store.tokens import LoginState, RefreshHold, login_state, person_digest

logger = logging.getLogger(__name__)

# The advisory-lock class of token refreshes: apart from the schema's own (replicas, migrations, keys).
REFRESH_LOCKS = 0x6D637374  # 'mcst'
REFRESH_WAIT_S = 60.0  # the longest one replica waits for another's refresh (a token endpoint's answer)
MAKE_KEY = "make one with `mcp-spec-proxy store token-key`"

UPSERT = """
INSERT INTO backend_tokens AS t (server, person, resource, {column}, expires_at)
VALUES (%(server)s, %(person)s, %(resource)s, %(value)s, %(expires_at)s)
ON CONFLICT (server, person) DO UPDATE SET
    {column} = EXCLUDED.{column},
    {other} = CASE WHEN t.resource = EXCLUDED.resource THEN t.{other} END,
    expires_at = CASE WHEN %(tokens)s THEN EXCLUDED.expires_at
                      WHEN t.resource = EXCLUDED.resource THEN t.expires_at END,
    resource = EXCLUDED.resource,
    updated_at = clock_timestamp()
"""


def token_cipher(keys: str | None, variable: str, source: str) -> MultiFernet:
    """The Fernet keys in `keys` (the variable's value: comma-separated, newest first), or a
    `ConfigError` that names the variable and how to make a key."""
    where = "store.postgres.token_key_env"
    if not keys:
        raise ConfigError(
            source,
            where,
            f"environment variable {variable} is not set: remote backends' OAuth tokens are encrypted with it"
            " in the database",
            f"{MAKE_KEY} and export it in every replica's environment",
        )
    try:
        return MultiFernet([Fernet(key.strip().encode()) for key in keys.split(",") if key.strip()])
    except ValueError:
        raise ConfigError(
            source,
            where,
            f"environment variable {variable} holds no Fernet key (32 url-safe base64 bytes; several:"
            " comma-separated, newest first)",
            MAKE_KEY,
        ) from None


@dataclass(frozen=True)
class PgTokens:
    """One backend's tokens (or one principal's) in the `backend_tokens` row (see the module docstring)."""

    dsn: str
    timeout: float
    cipher: MultiFernet
    server: str
    resource: str
    person: str = ""  # '' for the operator's own login, else `person_digest(issuer, subject)`
    key_env: str = "MCP_SPEC_PROXY_TOKEN_KEY"  # named in the line said of a row no key opens

    def of_principal(self, issuer: str, subject: str) -> PgTokens:
        return PgTokens(
            self.dsn,
            self.timeout,
            self.cipher,
            self.server,
            self.resource,
            person_digest(issuer, subject),
            self.key_env,
        )

    async def get_tokens(self) -> OAuthToken | None:
        return (await self.kept())[0]

    async def kept(self) -> tuple[OAuthToken | None, float | None]:
        row = await self._row()
        if row is None or row[0] is None:
            return None, None
        value = self._open(bytes(row[0]), "tokens")
        try:
            tokens = OAuthToken.model_validate(value) if value is not None else None
        except ValidationError:
            tokens = None
        return tokens, (float(row[2]) if tokens is not None and row[2] is not None else None)

    async def set_tokens(self, tokens: OAuthToken) -> None:
        expires_at = time.time() + tokens.expires_in if tokens.expires_in is not None else None
        await self._upsert("tokens", "client", self._seal(tokens.model_dump(mode="json"), "tokens"), expires_at)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        row = await self._row()
        if row is None or row[1] is None:
            return None
        value = self._open(bytes(row[1]), "client")
        try:
            return OAuthClientInformationFull.model_validate(value) if value is not None else None
        except ValidationError:
            return None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        sealed = self._seal(client_info.model_dump(mode="json", exclude_none=True), "client")
        await self._upsert("client", "tokens", sealed, None)

    async def state(self) -> LoginState:
        return login_state(*await self.kept())

    async def principals_logged_in(self) -> int:
        rows = await self._execute(
            "SELECT count(*) FROM backend_tokens WHERE server = %s AND person <> '' AND resource = %s"
            " AND tokens IS NOT NULL",
            (self.server, self.resource),
        )
        return int(rows[0][0]) if rows else 0

    async def forget_tokens(self) -> bool:
        rows = await self._execute(
            "UPDATE backend_tokens SET tokens = NULL, expires_at = NULL, updated_at = clock_timestamp()"
            " WHERE server = %s AND person = %s AND resource = %s AND tokens IS NOT NULL RETURNING 1",
            (self.server, self.person, self.resource),
        )
        return bool(rows)

    async def hold_refresh(self) -> RefreshHold:
        """This login's refresh lock, taken (waiting at most `REFRESH_WAIT_S` for another replica's)."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, round(self.timeout))
            )
        except DB_ERRORS as exc:
            raise StateError(f"cannot reach the tokens of {self._whose()} in Postgres: {problem(exc)}") from None
        try:
            with anyio.fail_after(REFRESH_WAIT_S):
                await conn.execute(
                    "SELECT pg_advisory_lock(%s, hashtext(%s))", (REFRESH_LOCKS, f"{self.server}\n{self.person}")
                )
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await conn.close()  # a lock taken as the wait was cancelled goes with its connection
            if isinstance(exc, DB_ERRORS):
                raise StateError(f"cannot hold the refresh of {self._whose()} in Postgres: {problem(exc)}") from None
            raise
        return _Held(conn)

    def _whose(self) -> str:
        return f"backend {self.server!r}" + (" (a principal's own login)" if self.person else "")

    def _seal(self, value: Any, kind: str) -> bytes:
        bound = {"server": self.server, "person": self.person, "resource": self.resource, "kind": kind, "value": value}
        return self.cipher.encrypt(json.dumps(bound).encode())

    def _open(self, sealed: bytes, kind: str) -> Any:
        """What a row's ciphertext holds, when it is this login's; None (log in again) when no key opens it."""
        try:
            bound = json.loads(self.cipher.decrypt(sealed))
        except InvalidToken:
            logger.warning(
                "the kept OAuth %s of %s cannot be decrypted with the key(s) in %s (the key changed?): it needs"
                " a login again — or put the old key after the new one, comma-separated",
                kind,
                self._whose(),
                self.key_env,
            )
            return None
        mine = {"server": self.server, "person": self.person, "resource": self.resource, "kind": kind}
        if not isinstance(bound, dict) or {k: bound.get(k) for k in mine} != mine:
            logger.warning("the kept OAuth %s of %s belong to another login: not used", kind, self._whose())
            return None
        return bound.get("value")

    async def _row(self) -> tuple[Any, ...] | None:
        rows = await self._execute(
            "SELECT tokens, client, expires_at FROM backend_tokens WHERE server = %s AND person = %s AND resource = %s",
            (self.server, self.person, self.resource),
        )
        return rows[0] if rows else None

    async def _upsert(self, column: str, other: str, value: bytes, expires_at: float | None) -> None:
        args: Mapping[str, Any] = {
            "server": self.server,
            "person": self.person,
            "resource": self.resource,
            "value": value,
            "expires_at": expires_at,
            "tokens": column == "tokens",
        }
        await self._execute(UPSERT.format(column=column, other=other), args)

    async def _execute(self, sql: str, args: Any) -> list[tuple[Any, ...]]:
        try:
            with anyio.fail_after(self.timeout):
                async with await psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(1, round(self.timeout))
                ) as conn:
                    cursor = await conn.execute(sql, args)
                    return await cursor.fetchall() if cursor.description is not None else []
        except psycopg.errors.UndefinedTable:
            raise StateError(
                "the Postgres store has no table of backend tokens yet: run `mcp-spec-proxy store migrate`"
                " (or start a replica, which applies it)"
            ) from None
        except DB_ERRORS as exc:
            raise StateError(f"cannot reach the tokens of {self._whose()} in Postgres: {problem(exc)}") from None


class _Held:
    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    async def release(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._conn.close()  # the session's advisory lock goes with it


__all__ = ["REFRESH_LOCKS", "PgTokens", "token_cipher"]
