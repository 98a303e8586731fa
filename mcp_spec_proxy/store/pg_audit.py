"""The audit trail in one Postgres table, shared by every replica.

`record` commits its row before it returns (the gate forwards a write only after its `held` and
`verdict` rows are committed), and raises `StateError` with one line when the database cannot
take it: the write is then refused. A call marked abandoned (its replica died while it was held)
takes no verdict afterwards, so it is never forwarded by anyone. `note` (reads) never waits:
its rows are batched by `flush_notes`, and dropped with one warning while the database is away.
The gate says what a refused row means for its call (forwarded or not); this module only says
that the database could not take it.

`later` keeps a row `record` could not write about a call already settled (the `forwarded` of a
call that ran, a `blocked`, an `abandoned`): `flush_notes` writes it with the next batch, and
again until the database takes it, with one warning — so a live replica leaves no call `held`
for ever. `claim` binds an idempotency key to one call for every replica: a `claimed` row, taken
under a transaction-scoped advisory lock on the key, its `call` column the key's slot
(`key:<digest>`, so the call index finds it; the row's data names the call).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store.migrations import LOCK_NAMESPACE

logger = logging.getLogger(__name__)

MAX_NOTES = 10_000  # read rows waiting for the database; past this the oldest are dropped
DB_ERRORS = (psycopg.Error, PoolTimeout, TimeoutError)
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")

INSERT = "INSERT INTO audit (ts, event, call, session, replica, data) VALUES (%s, %s, %s, %s, %s, %s::jsonb)"
INSERT_VERDICT = (
    "INSERT INTO audit (ts, event, call, session, replica, data) SELECT %s, %s, %s, %s, %s, %s::jsonb"
    " WHERE NOT EXISTS (SELECT 1 FROM audit WHERE call = %s AND event = 'abandoned')"
)
KEY_LOCKS = LOCK_NAMESPACE + 1  # the advisory-lock class of idempotency keys: apart from replica locks
INSERT_LATE = (
    "INSERT INTO audit (ts, event, call, session, replica, data) SELECT %s, %s, %s, %s, %s, %s::jsonb"
    " WHERE NOT EXISTS (SELECT 1 FROM audit WHERE call = %s AND event = %s) ON CONFLICT DO NOTHING"
)  # a row whose first attempt timed out may have landed after all: it is not written twice
HOLDER = "SELECT data->>'call' FROM audit WHERE call = %s AND event = 'claimed' ORDER BY id LIMIT 1"


def json_text(value: Any) -> str:
    """`value` as JSON that jsonb accepts: no NUL escape, no lone surrogate (a hostile argument may hold both)."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    text = text.encode("utf-8", "replace").decode("utf-8")
    return _NUL.sub(r"\1\\ufffd", text)


def problem(exc: BaseException) -> str:
    """The first line of a database error, never the DSN."""
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class PgAudit:
    def __init__(self, pool: AsyncConnectionPool[Any], replica: int, timeout: float) -> None:
        self._pool = pool
        self._replica = replica
        self._timeout = timeout
        self._notes: list[tuple[Any, ...]] = []
        self._wake = anyio.Event()
        self._failing = False
        self._late: list[tuple[Any, ...]] = []

    def _row(self, kind: str, fields: dict[str, Any]) -> tuple[Any, ...]:
        call, session = fields.get("call"), fields.get("session")
        return (round(time.time(), 6), kind, call, session, self._replica, json_text(fields))

    async def record(self, kind: str, **fields: Any) -> None:
        row = self._row(kind, fields)
        try:
            with anyio.fail_after(self._timeout):
                async with self._pool.connection() as conn:
                    if kind == "verdict" and row[2] is not None:
                        cursor = await conn.execute(INSERT_VERDICT, (*row, row[2]))
                        if cursor.rowcount == 0:
                            raise StateError(
                                f"call {row[2]} was marked abandoned while it was held (its replica was"
                                " presumed stopped): it is not forwarded"
                            )
                    else:
                        await conn.execute(INSERT + " ON CONFLICT DO NOTHING", row)
        except DB_ERRORS as exc:
            raise StateError(f"cannot write the audit trail to Postgres ({problem(exc)})") from None
        if self._late:
            self._wake.set()  # the database takes rows again: the kept ones go with the next batch

    def later(self, kind: str, **fields: Any) -> None:
        if not self._late:
            logger.warning("audit rows of settled calls are kept in memory until Postgres takes them")
        self._late.append(self._row(kind, {**fields, "late": True}))
        self._wake.set()

    async def holder(self, session: str, key: str) -> str | None:
        try:
            with anyio.fail_after(self._timeout):
                async with self._pool.connection() as conn:
                    held = await (await conn.execute(HOLDER, (_key_slot(session, key),))).fetchone()
        except DB_ERRORS:
            return None
        return None if held is None else str(held[0])

    async def claim(self, session: str, key: str, call: str, **fields: Any) -> str | None:
        slot = _key_slot(session, key)
        try:
            with anyio.fail_after(self._timeout):
                async with self._pool.connection() as conn, conn.transaction():
                    await conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (KEY_LOCKS, slot))
                    cursor = await conn.execute(HOLDER, (slot,))
                    held = await cursor.fetchone()
                    if held is not None:
                        return str(held[0])
                    row = self._row("claimed", {"call": call, "session": session, "key": key, **fields})
                    await conn.execute(INSERT, (row[0], row[1], slot, *row[3:]))
        except DB_ERRORS as exc:
            raise StateError(f"cannot write the audit trail to Postgres ({problem(exc)})") from None
        return None

    def note(self, kind: str, **fields: Any) -> None:
        self._notes.append(self._row(kind, fields))
        if len(self._notes) > MAX_NOTES:
            del self._notes[: len(self._notes) - MAX_NOTES]
        self._wake.set()

    async def flush_notes(self) -> None:
        """Write the read rows noted so far in one batch; a failure drops them with one warning.
        Then the kept rows of settled calls (`later`), which a failure keeps for the next flush."""
        batch, self._notes = self._notes, []
        self._wake = anyio.Event()
        if batch:
            await self._write_notes(batch)
        if self._late:
            await self._write_late()

    async def _write_late(self) -> None:
        late = list(self._late)
        try:
            with anyio.fail_after(self._timeout):
                async with self._pool.connection() as conn, conn.cursor() as cursor:
                    await cursor.executemany(INSERT_LATE, [(*row, row[2], row[1]) for row in late])
        except DB_ERRORS:
            return  # kept: retried with the next batch, or the next sweep's
        del self._late[: len(late)]
        logger.warning("the kept audit rows of settled calls are written to Postgres")

    async def _write_notes(self, batch: list[tuple[Any, ...]]) -> None:
        try:
            with anyio.fail_after(self._timeout):
                async with self._pool.connection() as conn, conn.cursor() as cursor:
                    await cursor.executemany(INSERT, batch)
        except DB_ERRORS as exc:
            if not self._failing:
                logger.warning("audit rows of reads are dropped while Postgres is unreachable: %s", problem(exc))
            self._failing = True
            return
        if self._failing:
            logger.warning("Postgres is reachable again: audit rows of reads are written again")
        self._failing = False

    async def wait_for_notes(self) -> None:
        await self._wake.wait()

    def retry_late(self) -> None:
        """Wake the writer for the kept rows of settled calls, if any (the store's timer calls this)."""
        if self._late:
            self._wake.set()

    def close(self) -> None:
        # The store flushes the notes (and the kept rows) and closes the pool as it closes (`PgStore.open`).
        for row in self._late:
            logger.error("audit row never written (the proxy stopped first): %s", row[5])
        self._late.clear()


async def read_rows(
    pool: AsyncConnectionPool[Any],
    *,
    session: str | Sequence[str] | None = None,
    tail: int | None = None,
    principal: str | None = None,
) -> list[dict[str, Any]]:
    """The audit rows in order (the last `tail` of them), as the file's lines read: `{"ts", "event", **fields}`;
    `principal`: only the rows that name that subject (`principal.sub`)."""
    conditions: list[str] = []
    args: list[Any] = []
    if session:
        sessions = [session] if isinstance(session, str) else list(session)  # any of them: a name's ids
        conditions, args = [*conditions, "session = ANY(%s)"], [*args, sessions]
    if principal is not None:
        conditions, args = [*conditions, "data->'principal'->>'sub' = %s"], [*args, principal]
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    limit = ""
    if tail is not None:
        limit, args = "LIMIT %s", [*args, tail]
    sql = f"SELECT * FROM (SELECT id, ts, event, data FROM audit {where} ORDER BY id DESC {limit}) last ORDER BY id"
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, args)
        return [{"ts": ts, "event": event, **data} for _, ts, event, data in await cursor.fetchall()]


def _key_slot(session: str, key: str) -> str:
    """The row a session's idempotency key is claimed under (its `call` column), shared by every replica."""
    return "key:" + hashlib.sha256(f"{session}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()[:32]


async def read_principals(pool: AsyncConnectionPool[Any]) -> list[tuple[str, str | None]]:
    """Every (subject, client) the audit rows name, once each."""
    sql = (
        "SELECT DISTINCT data->'principal'->>'sub', data->'principal'->>'client_id' FROM audit"
        " WHERE data->'principal'->>'sub' IS NOT NULL"
    )
    async with pool.connection() as conn:
        cursor = await conn.execute(sql)
        return [(str(sub), client) for sub, client in await cursor.fetchall()]
