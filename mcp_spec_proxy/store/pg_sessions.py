"""Sessions and approval tickets in Postgres: a client's next request may land on another replica.

Each change the barrier makes to a session is one statement (a read: an insert; a write held:
the count of held segments and the whole session, loaded as every replica left it; a verdict:
the accepted prefix committed and the rest dropped), so a reviewer on any replica sees every read
the session made on any other, and the `History` here follows each change without a reload.
Steps keep their row (`Step.ref`), so settling a segment commits or drops exactly the reads it held.
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
from dataclasses import replace
from typing import Any

import anyio
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store.pg_audit import DB_ERRORS, json_text, problem
from mcp_spec_proxy.store.sessions import MAX_PENDING_APPROVALS, LocalSessions, Ticket
from mcp_spec_proxy.trajectory import History, Segment, Step

logger = logging.getLogger(__name__)

READ = """
WITH s AS (
    INSERT INTO sessions (id) VALUES (%(id)s) ON CONFLICT (id) DO UPDATE SET updated_at = now() RETURNING held
), i AS (
    INSERT INTO session_steps (ref, session, state, step) VALUES (%(ref)s, %(id)s, 'open', %(step)s::jsonb) RETURNING 1
)
SELECT (SELECT held FROM s), (SELECT count(*) FROM session_steps WHERE session = %(id)s AND state = 'open'),
       (SELECT count(*) FROM i)
"""
COMMIT_OPEN = """
UPDATE session_steps SET state = 'committed', commit_seq = (SELECT nextval('session_commit_seq'))
WHERE session = %(id)s AND state = 'open'
  AND (SELECT held FROM sessions WHERE id = %(id)s) = 0
  AND (SELECT count(*) FROM session_steps WHERE session = %(id)s AND state = 'open') >= %(every)s
"""
HOLD = """
WITH h AS (
    INSERT INTO sessions (id, held) VALUES (%(id)s, 1)
    ON CONFLICT (id) DO UPDATE SET held = sessions.held + 1, updated_at = now() RETURNING held, discarded
)
SELECT h.held, h.discarded, st.ref, st.state, st.step FROM h
LEFT JOIN session_steps st ON st.session = %(id)s AND st.state <> 'discarded'
ORDER BY st.state = 'open', st.commit_seq, st.seq
"""
RELEASE = "UPDATE sessions SET held = greatest(held - 1, 0), updated_at = now() WHERE id = %(id)s"
SETTLE = """
WITH s AS (
    UPDATE sessions SET held = greatest(held - 1, 0), discarded = discarded + %(dropped)s, updated_at = now()
    WHERE id = %(id)s RETURNING id
), n AS (
    SELECT nextval('session_commit_seq') AS v
), c AS (
    UPDATE session_steps SET state = 'committed', commit_seq = (SELECT v FROM n)
    WHERE ref = ANY(%(commit)s::uuid[]) AND state = 'open' RETURNING 1
), d AS (
    UPDATE session_steps SET state = 'discarded' WHERE ref = ANY(%(drop)s::uuid[]) AND state = 'open' RETURNING 1
), i AS (
    INSERT INTO session_steps (ref, session, state, commit_seq, step)
    SELECT x.r, %(id)s, 'committed', (SELECT v FROM n), x.st
    FROM unnest(%(new_refs)s::uuid[], %(new_steps)s::jsonb[]) WITH ORDINALITY AS x(r, st, o) ORDER BY x.o
    RETURNING 1
)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM c), (SELECT count(*) FROM d), (SELECT count(*) FROM i)
"""


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

    async def read(self, session: str, history: History, step: Step) -> None:
        """One round trip (two every `commit_every` reads); the `History` here follows without a reload."""
        ref = uuid.uuid4()
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    cursor = await conn.execute(READ, {"id": session, "ref": ref, "step": _step_json(step)})
                    row = await cursor.fetchone()
                    held, open_before = (int(row[0] or 0), int(row[1])) if row else (0, 0)
                    every = history.commit_every
                    if every is not None and held == 0 and open_before + 1 >= every:
                        # A run of K reads with no write out for review commits without review.
                        await conn.execute(COMMIT_OPEN, {"id": session, "every": every})
            self._recovered()
        except DB_ERRORS as exc:
            self._failed(exc)
        else:
            step = replace(step, ref=str(ref))  # the history keeps the step with its row
        await self._local.read(session, history, step)

    async def hold(self, session: str, history: History, held: Step) -> Segment:
        """Count the held segment and load the session as every replica left it, in one statement."""
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    cursor = await conn.execute(HOLD, {"id": session})
                    found = await cursor.fetchall()
            self._recovered()
        except DB_ERRORS as exc:
            self._failed(exc)
            return await self._local.hold(session, history, held)
        steps = [(ref, state, data) for _, _, ref, state, data in found if ref is not None]
        committed = [_step(ref, data) for ref, state, data in steps if state == "committed"]
        open_ = [_step(ref, data) for ref, state, data in steps if state == "open"]
        held_count, discarded = (int(found[0][0]), int(found[0][1])) if found else (1, 0)
        history.load(committed, open_, held_count, discarded)
        return Segment((*history.open, held))

    async def release(self, session: str, history: History, segment: Segment) -> None:
        await self._apply(RELEASE, {"id": session})
        await self._local.release(session, history, segment)

    async def settle(
        self, session: str, history: History, segment: Segment, accepted_steps: int, executed: Step | None = None
    ) -> None:
        """Commit the accepted prefix, drop the rest and append `executed`, in one statement."""
        committed, accepted_steps = segment.settled(accepted_steps, executed)
        new = [step for step in committed if step.ref is None]
        refs = [uuid.uuid4() for _ in new]
        applied = await self._apply(
            SETTLE,
            {
                "id": session,
                "dropped": len(segment) - accepted_steps,
                "commit": [step.ref for step in committed if step.ref is not None],
                "drop": [step.ref for step in segment.steps[accepted_steps:] if step.ref is not None],
                "new_refs": refs,
                "new_steps": [_step_json(step) for step in new],
            },
        )
        if applied and executed is not None and executed.ref is None:
            # The steps of the segment get their rows' refs when the next `hold` loads the session.
            executed = replace(executed, ref=str(refs[next(n for n, step in enumerate(new) if step is executed)]))
        await self._local.settle(session, history, segment, accepted_steps, executed)

    async def _apply(self, sql: str, args: dict[str, Any]) -> bool:
        try:
            with anyio.fail_after(self._timeout):
                async with self._connection() as conn:
                    await conn.execute(sql, args)
        except DB_ERRORS as exc:
            self._failed(exc)
            return False
        self._recovered()
        return True

    def _recovered(self) -> None:
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
            # Expired tickets go, and past the cap the oldest: a flooding client cannot grow the table.
            await conn.execute(
                "DELETE FROM approvals WHERE expires <= %s"
                " OR nonce IN (SELECT nonce FROM approvals ORDER BY expires DESC OFFSET %s)",
                (time.time(), MAX_PENDING_APPROVALS - 1),
            )
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
