"""The Postgres store: one database for every replica of the proxy.

Opening it reaches the database (or fails in one line), applies the schema's migrations, and
registers this process as a live replica: it holds a session-level advisory lock on its own
number for as long as it runs, and beats (`replicas.seen`, in the database's clock) every
`heartbeat` seconds on that lock's connection. A replica is presumed stopped only when it holds
no lock *and* has been silent past its limit (`DEAD_AFTER` beats plus its timeout): `kill -9`
drops the lock at once and the beats stop, while a database restart drops every lock but not the
beats, and each live replica takes its lock again at its next beat — so no live replica's calls
are ever swept. Each replica's silence is judged by its own limit (recorded with its beats, so replicas configured apart
never misjudge each other), and only by a replica that has itself been connected at least that
long: after an outage (or at its start) a replica cannot tell a stopped replica from one not yet
back, so it waits. A replica that stopped on purpose (it signs off) or has no row at all is
stopped at once. Beats,
re-registration and sweeps run on their own timer, whatever the traffic; every replica sweeps,
so a survivor closes a dead replica's held calls within `DEAD_AFTER + 1` beats. The sweep reads
`open_calls` (held calls with no terminal row, kept by a trigger), never the whole history.
Abandoned calls are never forwarded, by anyone: the call's verdict row is refused once it is
marked (`pg_audit.py`), and nothing re-sends a held call.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.abc
import psycopg
from psycopg_pool import AsyncConnectionPool

from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.config.schema import PostgresSettings
from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store.migrations import LATEST, LOCK_NAMESPACE, migrate, versions_wanted
from mcp_spec_proxy.store.pg_audit import DB_ERRORS, PgAudit, problem, read_principals, read_rows
from mcp_spec_proxy.store.pg_fingerprints import PgFingerprints, SharedFingerprints
from mcp_spec_proxy.store.pg_sessions import PgApprovals, PgSessions
from mcp_spec_proxy.store.sessions import ApprovalStore, SessionStore
from mcp_spec_proxy.tools.fingerprints import FingerprintStore

logger = logging.getLogger(__name__)

__all__ = ["LATEST", "PgFingerprints", "PgStore", "migrate_database", "read_audit_once"]

DEAD_AFTER = 3  # beats of silence, with no lock held, before a replica is presumed stopped
FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
# The pool retries a lost connection after 1 s, then after 1 s more, and then gives that connection
# up; the next request that waits for one starts a new attempt at once (its sweeps, every beat, are
# such requests). So the way back is one attempt away, a second at most, however long the database
# was away: the pool's default (300 s, doubling the wait from 1 s up to 128 s) brought writes back
# 3 s after a 30 s outage and 16 s and more after 90 s.
RECONNECT_S = 2.0
PROBE_S = 0.5  # how long `/readyz` waits for the database: well within a probe's 1 s
SESSION_TTL = "1 day"  # a session untouched this long, with nothing held, is forgotten by the sweep

SWEEP = """
WITH live AS (
    SELECT objid::bigint AS replica FROM pg_locks
    WHERE locktype = 'advisory' AND classid::bigint = %(ns)s AND objsubid = 2 AND granted
)
INSERT INTO audit (ts, event, call, session, replica, data)
SELECT extract(epoch FROM clock_timestamp()), 'abandoned', o.call, o.session, %(me)s,
       jsonb_build_object('call', o.call, 'session', o.session, 'tool', h.data->>'tool',
                          'replica', o.replica, 'reason', CASE WHEN EXISTS (
                              SELECT 1 FROM audit v WHERE v.call = o.call AND v.event = 'verdict'
                              AND (v.data->>'accepted')::boolean)
                          THEN %(may_have_run)s::text ELSE %(never_forwarded)s::text END)
FROM open_calls o JOIN audit h ON h.id = o.held_id LEFT JOIN replicas r ON r.replica = o.replica
WHERE o.replica IS NULL OR (
    o.replica NOT IN (SELECT replica FROM live)
    AND (r.replica IS NULL OR (
        -- silent past its own limit, and this replica connected for longer than that limit
        r.seen < clock_timestamp() - make_interval(secs => r.silent_s)
        AND %(since)s::timestamptz < clock_timestamp() - make_interval(secs => r.silent_s)
    ))
)
ON CONFLICT DO NOTHING
RETURNING data->>'reason' = %(may_have_run)s::text
"""
# What the sweep writes of each call it marks: the audit rows say which it was.
MAY_HAVE_RUN = (
    "its replica stopped after the accepted verdict, before recording the forward:"
    " the backend may or may not have run it; it is not sent again"
)
NEVER_FORWARDED = "its replica stopped while the call was held: it was never forwarded"
BEAT = (
    "INSERT INTO replicas (replica, beat_s, silent_s) VALUES (%s, %s, %s) ON CONFLICT (replica)"
    " DO UPDATE SET seen = clock_timestamp(), beat_s = EXCLUDED.beat_s, silent_s = EXCLUDED.silent_s RETURNING seen"
)
FORGET_REPLICAS = (
    "DELETE FROM replicas r WHERE seen < now() - interval '1 day'"
    " AND NOT EXISTS (SELECT 1 FROM open_calls o WHERE o.replica = r.replica)"
)


async def migrate_database(dsn: str, limit_s: float, *, leash: bool = False, to: int | None = None) -> list[int]:
    """`mcp-spec-proxy store migrate`: the versions applied."""
    try:
        async with await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, connect_timeout=max(1, round(limit_s))
        ) as conn:
            return await migrate(conn, leash=leash, to=to)
    except psycopg.Error as exc:
        raise StateError(f"cannot migrate the Postgres store: {problem(exc)}") from None


class PgStore:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        dsn: str,
        settings: PostgresSettings,
        replica: int,
        lock: psycopg.AsyncConnection[Any],
        registered: datetime | None = None,
        *,
        leash: bool = False,
    ) -> None:
        self.pool = pool
        self._leash = leash  # whether LEASH's tables are part of the schema this replica needs
        self._dsn = dsn
        self.replica = replica
        self._lock = lock
        self._timeout = settings.timeout
        self._beat_s = settings.heartbeat
        # How long this replica may be silent before another takes it for stopped: its beats, and
        # the time one beat may take to get through (a loaded machine, a reconnect).
        self._silent_s = silent_limit(settings)
        # Since when (the database's clock) this replica's lock connection has beaten without a break.
        self._connected_since: datetime | None = registered
        self.rows = PgAudit(pool, replica, settings.timeout)
        self.audit: AuditSink = self.rows
        self.sessions: SessionStore = PgSessions(pool, settings.timeout)
        self.approvals: ApprovalStore = PgApprovals(pool, settings.timeout)
        self.prints = SharedFingerprints(pool, settings.timeout)
        self.fingerprints: FingerprintStore = self.prints

    @classmethod
    @asynccontextmanager
    async def open(cls, dsn: str, settings: PostgresSettings, *, leash: bool = False) -> AsyncIterator[PgStore]:
        await migrate_database(dsn, settings.timeout, leash=leash)
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=settings.pool_size,
            open=False,
            timeout=settings.timeout,
            reconnect_timeout=RECONNECT_S,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(settings.timeout))},
        )
        try:
            await pool.open(wait=True, timeout=settings.timeout)
            lock, replica, registered = await _register(
                dsn, settings.timeout, settings.heartbeat, silent_limit(settings)
            )
        except DB_ERRORS as exc:
            await pool.close()
            raise StateError(f"cannot reach the Postgres store: {problem(exc)}") from None
        store = cls(pool, dsn, settings, replica, lock, registered, leash=leash)
        try:
            try:
                await store.prints.load()  # before any listing is classified: a fresh replica holds late tools
            except DB_ERRORS as exc:
                raise StateError(f"cannot read the fingerprints from Postgres: {problem(exc)}") from None
            await store.sweep()
            yield store
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(settings.timeout):
                await store.rows.flush_notes()
            with anyio.CancelScope(shield=True):
                await store.prints.flush()
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(settings.timeout):
                    await store._sign_off()
                await store._lock.close()
                await pool.close(timeout=settings.timeout)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write batched read rows as they come; beat, re-register and sweep every `heartbeat` seconds;
        merge and refresh the fingerprints off the request path."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write_notes)
            tg.start_soon(self._keep_alive)
            tg.start_soon(self.prints.run)
            task_status.started()

    async def _write_notes(self) -> None:
        while True:
            await self.rows.wait_for_notes()
            await self.rows.flush_notes()

    async def _keep_alive(self) -> None:
        # On its own timer: a replica busy with reads beats and sweeps as often as an idle one.
        while True:
            await anyio.sleep(self._beat_s)
            await self._keep_registered()
            await self.sweep()
            self.rows.retry_late()  # kept audit rows are retried on the timer too, traffic or not

    async def _keep_registered(self) -> None:
        """Beat on the lock's connection; take the lock again when that connection was lost (the
        database restarted) — within `DEAD_AFTER` beats, before any sweep takes this replica for dead."""
        try:
            with anyio.fail_after(self._timeout):
                seen = await _beat(self._lock, self.replica, self._beat_s, self._silent_s)
            if self._connected_since is None:
                self._connected_since = seen
            return
        except DB_ERRORS:
            self._connected_since = None
        try:
            with anyio.fail_after(self._timeout):
                await self._lock.close()
                self._lock = await _lock_connection(self._dsn, self._timeout)
                cursor = await self._lock.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, self.replica))
                row = await cursor.fetchone()
                self._connected_since = await _beat(self._lock, self.replica, self._beat_s, self._silent_s)
        except DB_ERRORS as exc:
            logger.warning("replica %d is not registered with Postgres: %s", self.replica, problem(exc))
            return
        if row and row[0]:
            logger.warning("replica %d registered with Postgres again", self.replica)

    async def _sign_off(self) -> None:
        """A replica that stops on purpose says so: its calls left open are swept at once, not
        after `DEAD_AFTER` beats (it recorded its own abandoned calls as it stopped)."""
        try:
            await self._lock.execute("DELETE FROM replicas WHERE replica = %s", (self.replica,))
        except DB_ERRORS as exc:
            logger.warning("replica %d could not sign off in Postgres: %s", self.replica, problem(exc))

    async def sweep(self) -> int:
        """Mark abandoned every held call whose replica is gone (how many were marked), and forget
        sessions idle past `SESSION_TTL` (as the files store forgets the least recent in memory)."""
        try:
            with anyio.fail_after(self._timeout):
                async with self.pool.connection() as conn:
                    # Not connected: judge no one's silence.
                    args = sweep_args(self.replica, self._connected_since or FAR_FUTURE)
                    cursor = await conn.execute(SWEEP, args)
                    verdicts = [bool(row[0]) for row in await cursor.fetchall()]
                    await conn.execute(
                        f"DELETE FROM sessions WHERE held = 0 AND updated_at < now() - interval '{SESSION_TTL}'"
                    )
                    await conn.execute(FORGET_REPLICAS)
        except DB_ERRORS as exc:
            logger.warning("could not sweep held calls of stopped replicas: %s", problem(exc))
            return 0
        if verdicts:
            logger.warning("marked %d call(s) of stopped replicas abandoned: %s", len(verdicts), _kinds(verdicts))
        return len(verdicts)

    async def health(self) -> list[str]:
        """Reached within `PROBE_S` (a readiness probe's own deadline is about a second: a kubelet's
        default), and holding every schema step this replica needs."""
        try:
            with anyio.fail_after(min(self._timeout, PROBE_S)):
                async with self.pool.connection() as conn:
                    cursor = await conn.execute("SELECT version FROM schema_version")
                    present = {int(row[0]) for row in await cursor.fetchall()}
        except DB_ERRORS:
            return ["store: the database does not answer"]
        if set(versions_wanted(leash=self._leash)) - present:
            return ["store: the database's schema is older than this proxy's (run `mcp-spec-proxy store migrate`)"]
        return []

    async def read_audit(self, session: str | None = None) -> list[dict[str, Any]]:
        try:
            return await read_rows(self.pool, session=session)
        except DB_ERRORS as exc:
            raise StateError(f"cannot read the audit trail from Postgres: {problem(exc)}") from None


def sweep_args(me: int, since: datetime) -> dict[str, Any]:
    """`SWEEP`'s parameters for replica `me`, connected without a break since `since`."""
    return {
        "me": me,
        "ns": LOCK_NAMESPACE,
        "since": since,
        "may_have_run": MAY_HAVE_RUN,
        "never_forwarded": NEVER_FORWARDED,
    }


def _kinds(may_have_run: list[bool]) -> str:
    """What the marked calls were, as their audit rows tell (not sent again, either way)."""
    ran = sum(may_have_run)
    kinds = []
    if held := len(may_have_run) - ran:
        kinds.append(f"{held} held, never forwarded")
    if ran:
        kinds.append(f"{ran} after an accepted verdict, which the backend may or may not have run")
    return "; ".join(kinds) + " (none is sent again)"


async def _lock_connection(dsn: str, limit_s: float) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=max(1, round(limit_s)))


def silent_limit(settings: PostgresSettings) -> float:
    return DEAD_AFTER * settings.heartbeat + settings.timeout


async def _beat(conn: psycopg.AsyncConnection[Any], replica: int, beat_s: float, silent_s: float) -> datetime:
    """One beat: this replica is alive now (the database's clock, which it returns)."""
    cursor = await conn.execute(BEAT, (replica, beat_s, silent_s))
    row = await cursor.fetchone()
    assert row is not None  # INSERT … RETURNING always returns its row
    seen: datetime = row[0]
    return seen


async def _register(
    dsn: str, limit_s: float, beat_s: float, silent_s: float
) -> tuple[psycopg.AsyncConnection[Any], int, datetime]:
    """A connection holding this replica's liveness lock, the replica's number, its first beat."""
    conn = await _lock_connection(dsn, limit_s)
    for _ in range(32):
        replica = secrets.randbelow(2**31 - 3) + 2  # 1 is the migration lock's
        cursor = await conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (LOCK_NAMESPACE, replica))
        row = await cursor.fetchone()
        if row and row[0]:
            # A number a stopped replica used, whose calls are still open, is not taken over: its
            # calls would look alive. (The sweep closes them; the next number is as good.)
            cursor = await conn.execute(
                "INSERT INTO replicas (replica, beat_s, silent_s) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
                " RETURNING seen",
                (replica, beat_s, silent_s),
            )
            first = await cursor.fetchone()
            if first:
                return conn, replica, first[0]
            await conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LOCK_NAMESPACE, replica))
    await conn.close()
    raise StateError("could not take a replica number in the Postgres store")


async def read_audit_once(
    dsn: str,
    limit_s: float,
    session: str | Sequence[str] | None = None,
    tail: int | None = None,
    principal: str | None = None,
) -> list[dict[str, Any]]:
    """`mcp-spec-proxy audit`: the audit rows in order (the last `tail`; `session`: of that session, or of
    any of several; `principal`: of that subject's calls alone), from one short connection."""
    try:
        async with (
            AsyncConnectionPool(dsn, min_size=1, max_size=1, timeout=limit_s, kwargs={"autocommit": True}) as pool,
        ):
            return await read_rows(pool, session=session, tail=tail, principal=principal)
    except DB_ERRORS as exc:
        raise StateError(f"cannot read the audit trail from Postgres: {problem(exc)}") from None


async def read_audit_principals_once(dsn: str, limit_s: float) -> list[tuple[str, str | None]]:
    """Every (subject, client) the audit rows name, from one short connection."""
    try:
        async with (
            AsyncConnectionPool(dsn, min_size=1, max_size=1, timeout=limit_s, kwargs={"autocommit": True}) as pool,
        ):
            return await read_principals(pool)
    except DB_ERRORS as exc:
        raise StateError(f"cannot read the audit trail from Postgres: {problem(exc)}") from None
