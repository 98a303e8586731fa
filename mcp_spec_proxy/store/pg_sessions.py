"""Sessions and approval tickets in Postgres: a client's next request may land on another replica.

Each change the barrier makes to a session is one short transaction on the session's row (its
lock orders concurrent changes from several replicas), and the `History` in memory is then
reloaded, so a reviewer on any replica sees every read the session made on any other. Steps
keep their row (`Step.ref`), so settling a segment commits or drops exactly the reads it held.
While the database is away, changes apply to the `History` in memory only (one warning): reads
keep working, and writes are refused by the audit trail anyway.

Approval tickets are rows; `take` is one `DELETE … RETURNING`, so of two replicas handed the
same ticket at once, one gets it and the other gets nothing.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store.pg_audit import DB_ERRORS, json_text, problem
from mcp_spec_proxy.store.sessions import LocalSessions, Ticket
from mcp_spec_proxy.trajectory import History, Segment, Step

logger = logging.getLogger(__name__)

TOUCH = (
    "INSERT INTO sessions (id, held) VALUES (%s, %s) ON CONFLICT (id)"
    " DO UPDATE SET held = greatest(sessions.held + %s, 0), discarded = sessions.discarded + %s, updated_at = now()"
    " RETURNING held"
)
ADD = "INSERT INTO session_steps (ref, session, state, commit_seq, step) VALUES (%s, %s, %s, %s, %s::jsonb)"


def _step_json(step: Step) -> str:
    return json_text(
        {
            "tool": step.tool,
            "arguments": step.arguments,
            "effect": step.effect,
            "observation": step.observation,
            "is_error": step.is_error,
            "duration_s": step.duration_s,
            "intent": step.intent,
        }
    )


def _step(ref: Any, data: dict[str, Any]) -> Step:
    return Step(
        data["tool"],
        data.get("arguments") or {},
        "write" if data.get("effect") == "write" else "read",
        observation=data.get("observation"),
        is_error=bool(data.get("is_error")),
        duration_s=float(data.get("duration_s") or 0.0),
        intent=data.get("intent"),
        ref=str(ref),
    )


RETRY_S = 5.0  # after a failure, sessions stay local this long before the database is tried again


class PgSessions:
    def __init__(self, pool: AsyncConnectionPool[Any], timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._local = LocalSessions()
        self._failing = False
        self._retry_at = 0.0

    def _connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A pooled connection; while the database is known to be away, a `PoolTimeout` at once,
        so reads do not each wait out the timeout."""
        if self._failing and time.monotonic() < self._retry_at:
            raise PoolTimeout("the database was unreachable moments ago")
        return self._pool.connection()

    async def load(self, session: str, history: History) -> None:
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    await self._load(conn, session, history)
        except DB_ERRORS as exc:
            self._failed(exc)

    async def read(self, session: str, history: History, step: Step) -> None:
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    async with conn.transaction():
                        held = await self._touch(conn, session, 0)
                        await conn.execute(ADD, (uuid.uuid4(), session, "open", None, _step_json(step)))
                        if held == 0:
                            # A run of K reads with no write out for review commits without review.
                            await conn.execute(
                                "UPDATE session_steps SET state = 'committed',"
                                " commit_seq = nextval('session_commit_seq') WHERE session = %s AND state = 'open' AND"
                                " (SELECT count(*) FROM session_steps WHERE session = %s AND state = 'open') >= %s",
                                (session, session, history.commit_every),
                            )
                    await self._load(conn, session, history)
        except DB_ERRORS as exc:
            self._failed(exc)
            await self._local.read(session, history, step)

    async def hold(self, session: str, history: History, held: Step) -> Segment:
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    await self._touch(conn, session, 1)
                    await self._load(conn, session, history)
            return Segment((*history.open, held))
        except DB_ERRORS as exc:
            self._failed(exc)
            return await self._local.hold(session, history, held)

    async def release(self, session: str, history: History, segment: Segment) -> None:
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    await self._touch(conn, session, -1)
                    await self._load(conn, session, history)
        except DB_ERRORS as exc:
            self._failed(exc)
            await self._local.release(session, history, segment)

    async def settle(
        self, session: str, history: History, segment: Segment, accepted_steps: int, executed: Step | None = None
    ) -> None:
        accepted_steps = max(0, min(accepted_steps, len(segment)))
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    async with conn.transaction():
                        await self._touch(conn, session, -1, discarded=len(segment) - accepted_steps)
                        cursor = await conn.execute("SELECT nextval('session_commit_seq')")
                        row = await cursor.fetchone()
                        batch = row[0] if row else None
                        committed = list(segment.steps[:accepted_steps]) + ([executed] if executed else [])
                        for step in committed:
                            if step.ref is None:
                                await conn.execute(ADD, (uuid.uuid4(), session, "committed", batch, _step_json(step)))
                            else:
                                await conn.execute(
                                    "UPDATE session_steps SET state = 'committed', commit_seq = %s"
                                    " WHERE ref = %s AND state = 'open'",
                                    (batch, step.ref),
                                )
                        dropped = [s.ref for s in segment.steps[accepted_steps:] if s.ref is not None]
                        if dropped:
                            await conn.execute(
                                "UPDATE session_steps SET state = 'discarded' WHERE ref = ANY(%s::uuid[])"
                                " AND state = 'open'",
                                (dropped,),
                            )
                    await self._load(conn, session, history)
        except DB_ERRORS as exc:
            self._failed(exc)
            await self._local.settle(session, history, segment, accepted_steps, executed)

    async def _touch(self, conn: AsyncConnection[Any], session: str, held: int, *, discarded: int = 0) -> int:
        """Create or lock the session's row, moving its count of held segments by `held`."""
        cursor = await conn.execute(TOUCH, (session, max(held, 0), held, discarded))
        row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def _load(self, conn: AsyncConnection[Any], session: str, history: History) -> None:
        cursor = await conn.execute("SELECT held, discarded FROM sessions WHERE id = %s", (session,))
        head = await cursor.fetchone()
        cursor = await conn.execute(
            "SELECT ref, state, step FROM session_steps WHERE session = %s AND state <> 'discarded'"
            " ORDER BY state = 'open', commit_seq, seq",
            (session,),
        )
        rows = await cursor.fetchall()
        history.committed = [_step(ref, data) for ref, state, data in rows if state == "committed"]
        history.open = [_step(ref, data) for ref, state, data in rows if state == "open"]
        history.held, history.discarded = (int(head[0]), int(head[1])) if head else (0, 0)
        if self._failing:
            logger.warning("Postgres is reachable again: sessions are shared again")
        self._failing = False

    def _failed(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + RETRY_S
        if not self._failing:
            logger.warning("sessions are kept in this replica only while Postgres is unreachable: %s", problem(exc))
        self._failing = True


def _thaw(value: Any) -> Any:
    """A memo as the reviewers left it: JSON made their tuples lists."""
    if isinstance(value, list):
        return tuple(_thaw(item) for item in value)
    if isinstance(value, dict):
        return {key: _thaw(item) for key, item in value.items()}
    return value


class PgApprovals:
    def __init__(self, pool: AsyncConnectionPool[Any], timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._key: bytes | None = None

    async def key(self) -> bytes:
        if self._key is None:
            async with self._connection() as conn:
                await conn.execute(
                    "INSERT INTO secrets (name, value) VALUES ('approvals', %s) ON CONFLICT (name) DO NOTHING",
                    (secrets.token_bytes(32),),
                )
                cursor = await conn.execute("SELECT value FROM secrets WHERE name = 'approvals'")
                row = await cursor.fetchone()
                assert row is not None
                self._key = bytes(row[0])
        return self._key

    async def put(self, nonce: str, ticket: Ticket) -> None:
        async with self._connection() as conn:
            await conn.execute("DELETE FROM approvals WHERE expires <= %s", (time.time(),))
            await conn.execute(
                "INSERT INTO approvals (nonce, binding, expires, question, memo) VALUES (%s, %s, %s, %s, %s::jsonb)",
                (nonce, list(ticket.binding), ticket.expires, ticket.question, json_text(ticket.memo)),
            )

    async def take(self, nonce: str) -> Ticket | None:
        async with self._connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM approvals WHERE nonce = %s AND expires > %s RETURNING binding, expires, question, memo",
                (nonce, time.time()),
            )
            row = await cursor.fetchone()
        if row is None:
            return None
        binding, expires, asked, memo = row
        return Ticket((binding[0], binding[1], binding[2]), float(expires), asked, _thaw(json.loads(json.dumps(memo))))

    def _connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        return guarded(self._pool, self._timeout, "approval tickets")


@asynccontextmanager
async def guarded(pool: AsyncConnectionPool[Any], limit_s: float, what: str) -> AsyncIterator[AsyncConnection[Any]]:
    """A pooled connection whose database errors (and silence past `limit_s`) become one `StateError` line."""
    try:
        with anyio.fail_after(limit_s):
            async with pool.connection() as conn:
                yield conn
    except DB_ERRORS as exc:
        raise StateError(f"Postgres failed on {what} ({problem(exc)})") from None
