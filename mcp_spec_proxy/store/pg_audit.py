"""The audit trail in one Postgres table, shared by every replica.

`record` commits its row before it returns (the gate forwards a write only after its `held` and
`verdict` rows are committed), and raises `StateError` with one line when the database cannot
take it: the write is then refused. A call marked abandoned (its replica died while it was held)
takes no verdict afterwards, so it is never forwarded by anyone. `note` (reads) never waits:
its rows are batched by `flush_notes`, and dropped with one warning while the database is away.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mcp_spec_proxy.errors import StateError

logger = logging.getLogger(__name__)

MAX_NOTES = 10_000  # read rows waiting for the database; past this the oldest are dropped
DB_ERRORS = (psycopg.Error, PoolTimeout, TimeoutError)
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")

INSERT = "INSERT INTO audit (ts, event, call, session, replica, data) VALUES (%s, %s, %s, %s, %s, %s::jsonb)"
INSERT_VERDICT = (
    "INSERT INTO audit (ts, event, call, session, replica, data) SELECT %s, %s, %s, %s, %s, %s::jsonb"
    " WHERE NOT EXISTS (SELECT 1 FROM audit WHERE call = %s AND event = 'abandoned')"
)


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
            raise StateError(
                f"cannot write the audit trail to Postgres ({problem(exc)}): no write is forwarded without"
                " its audit row — writes are refused until the database is back; reads keep working"
            ) from None

    def note(self, kind: str, **fields: Any) -> None:
        self._notes.append(self._row(kind, fields))
        if len(self._notes) > MAX_NOTES:
            del self._notes[: len(self._notes) - MAX_NOTES]
        self._wake.set()

    async def flush_notes(self) -> None:
        """Write the read rows noted so far in one batch; a failure drops them with one warning."""
        batch, self._notes = self._notes, []
        self._wake = anyio.Event()
        if not batch:
            return
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

    def close(self) -> None:
        return None  # the store flushes the notes and closes the pool as it closes (`PgStore.open`)


async def read_rows(
    pool: AsyncConnectionPool[Any], *, session: str | None = None, tail: int | None = None
) -> list[dict[str, Any]]:
    """The audit rows in order (the last `tail` of them), as the file's lines read: `{"ts", "event", **fields}`."""
    args: list[Any] = [session] if session else []
    where = "WHERE session = %s" if session else ""
    limit = ""
    if tail is not None:
        limit, args = "LIMIT %s", [*args, tail]
    sql = f"SELECT * FROM (SELECT id, ts, event, data FROM audit {where} ORDER BY id DESC {limit}) last ORDER BY id"
    async with pool.connection() as conn:
        cursor = await conn.execute(sql, args)
        return [{"ts": ts, "event": event, **data} for _, ts, event, data in await cursor.fetchall()]
