"""The rug-pull guard's fingerprints in Postgres: a definition accepted once is accepted everywhere.

Both stores here keep the file store's rules; each listing is merged row by row (`INSERT … ON
CONFLICT`), so two replicas listing at once never overwrite each other, and `tools accept` on any
machine reaches them all at the tool's next call.

`SharedFingerprints` is a replica's store, and nothing it does waits on the database on the event
loop. It loads the database's copy once, awaited, when the store opens — before any listing is
classified, so a fresh replica knows at once what was accepted and which servers were listed. From
then on the catalog's questions are answered from memory. A listing changes the copy at once: a
changed definition is held, and so is a tool the database has not recorded (only the database can
tell a server's first listing from one after another replica's, so only a merge accepts it); an
acceptance applies at once. Both are merged in the background (`run`, the database's first-listing
rule, `INSERT … ON CONFLICT`), and the database's rows, with whatever of this replica's writes it has
not taken yet applied on top, then replace the copy and the catalog classifies again. Nothing but
the database's rows turns a held tool accepted. A refresh asked for on the request path (a tool
under suspicion, or not yet merged) waits at most `REFRESH_WAIT_S` for the database's copy and
otherwise serves the last one; while the database is away (refusing or silent) the copy serves
alone (one warning), and the writes are merged once it is back.

`PgFingerprints` is the same store spoken to synchronously, for short commands (`tools accept`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store.pg_audit import DB_ERRORS, problem
from mcp_spec_proxy.tools.fingerprints import SERVERS, FingerprintStore

logger = logging.getLogger(__name__)

RETRY_S = 5.0  # after a failure, the last copy serves this long before the database is tried again
REFRESH_WAIT_S = 0.2  # how long a call under suspicion waits for the database's copy

# The tools before the servers: a server listed between the two reads then has no tools here, so
# its late tools are held; the other order could miss its listing and take them for a first one.
READ_ROWS = "SELECT key, accepted, latest, first_seen, changed_at, accepted_at FROM fingerprints"
READ_SERVERS = "SELECT server, first_listing FROM fingerprint_servers"
LISTED = "SELECT server FROM fingerprint_servers FOR SHARE"
MERGE_TOOL = (
    "INSERT INTO fingerprints (key, accepted, latest, first_seen) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT (key) DO UPDATE SET latest = EXCLUDED.latest, changed_at = EXCLUDED.first_seen"
    " WHERE fingerprints.latest IS DISTINCT FROM EXCLUDED.latest"
)
MERGE_SERVER = "INSERT INTO fingerprint_servers (server, first_listing) VALUES (%s, %s) ON CONFLICT (server) DO NOTHING"
ACCEPT = (
    "UPDATE fingerprints SET accepted = latest, accepted_at = %s"
    " WHERE key = %s AND accepted IS DISTINCT FROM latest RETURNING key"
)


def entries_of(rows: list[tuple[Any, ...]], servers: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The file store's entries from the database's rows."""
    entries: dict[str, Any] = {}
    for key, accepted, latest, first_seen, changed_at, accepted_at in rows:
        entry = {"accepted": accepted, "latest": latest, "first_seen": first_seen}
        entry.update({k: v for k, v in (("changed_at", changed_at), ("accepted_at", accepted_at)) if v is not None})
        entries[key] = entry
    entries[SERVERS] = {server: {"first_listing": t} for server, t in servers}
    return entries


def tool_rows(prints: dict[str, str], listed: set[str], at: float) -> list[tuple[Any, ...]]:
    """The rows of one listing: a tool of a server the database has seen listed is new (held)."""
    return [(key, None if key.split("/", 1)[0] in listed else sha, sha, at) for key, sha in prints.items()]


@dataclass(frozen=True)
class Listed:
    """A listing this replica observed, waiting to be merged."""

    prints: dict[str, str]
    server: str | None
    at: float


@dataclass(frozen=True)
class Accepted:
    """An acceptance made on this replica, waiting to be merged."""

    key: str
    at: float


class SharedFingerprints(FingerprintStore):
    def __init__(self, pool: AsyncConnectionPool[Any], timeout: float) -> None:
        self._pool = pool
        self._timeout = timeout
        self._pending: list[Listed | Accepted] = []  # in the order they happened: merged in that order
        self._asked = 0  # refreshes asked for
        self._settled = 0  # the refreshes asked for before the last round began: that round answered them
        self._wake = anyio.Event()
        self._progress = anyio.Event()
        self._failing = False
        super().__init__(None)

    async def load(self) -> None:
        """The database's copy, awaited: the store is not open before it is here."""
        with anyio.fail_after(self._timeout):
            async with self._pool.connection() as conn:
                self._entries = await _read(conn)
        self._settled = self._asked

    def observe(self, prints: dict[str, str], *, server: str | None = None) -> None:
        at = time.time()
        self._note(prints, at)
        last = self._pending[-1] if self._pending else None
        if not (isinstance(last, Listed) and (last.prints, last.server) == (prints, server)):
            self._pending.append(Listed(dict(prints), server, at))  # a listing repeated is merged once
        self._wake.set()

    def _note(self, prints: dict[str, str], at: float) -> None:
        """A listing, on this copy: a tool the database has not recorded is new (held) here until a
        merge says otherwise — only the database can tell a server's first listing from a listing
        after another replica's — and a changed definition is noted."""
        for key, sha in prints.items():
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = {"accepted": None, "latest": sha, "first_seen": at}
            elif entry.get("latest") != sha:
                entry["latest"] = sha
                entry["changed_at"] = at

    def accept(self, key: str) -> bool:
        if not super().accept(key):
            return False
        self._pending.append(Accepted(key, time.time()))
        self._wake.set()
        return True

    def reload(self) -> None:
        """Ask for the database's copy; the one in memory serves meanwhile."""
        self._asked += 1
        self._wake.set()

    async def refresh(self, *, settle: bool = False) -> None:
        self.reload()
        if self._failing:
            return  # the database failed moments ago: do not keep a request waiting on it
        asked = self._asked
        with anyio.move_on_after(self._timeout if settle else REFRESH_WAIT_S):
            while self._settled < asked:
                await self._progress.wait()

    async def run(self) -> None:
        """Merge this replica's writes and refresh its copy, one round at a time, off the request path."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            if await self._round():
                continue
            await anyio.sleep(RETRY_S)
            if self._pending or self._asked > self._settled:
                self._wake.set()

    async def flush(self) -> None:
        """At shutdown: merge what is pending, bounded by the store's timeout."""
        with anyio.move_on_after(self._timeout):
            if self._pending:
                await self._round()
        if self._pending:
            # Each replica's next listing meets the database's rows as they are: a changed definition
            # is held there again; only what no replica's rows recorded is judged afresh.
            count = len(self._pending)
            logger.warning("fingerprints: %d change(s) of this replica were not merged into Postgres", count)

    async def _round(self) -> bool:
        asked = self._asked
        try:
            while self._pending:
                write = self._pending[0]
                with anyio.fail_after(self._timeout):
                    async with self._pool.connection() as conn:
                        await _merge(conn, write)
                self._pending.pop(0)  # only appended to meanwhile: the first is still `write`
            with anyio.fail_after(self._timeout):
                async with self._pool.connection() as conn:
                    entries = await _read(conn)
        except DB_ERRORS as exc:
            self._answered(asked)
            self._failed(exc)
            return False
        before, self._entries = self._entries, entries
        for write in self._pending:  # listed or accepted during the read: not lost from the copy
            self._apply(write)
        self._answered(asked)
        self._recovered()
        if self._entries != before:
            self._changed_by_itself()
        return True

    def _apply(self, write: Listed | Accepted) -> None:
        if isinstance(write, Listed):
            self._note(write.prints, write.at)
        else:
            FingerprintStore.accept(self, write.key)

    def _answered(self, asked: int) -> None:
        self._settled = max(self._settled, asked)
        progress, self._progress = self._progress, anyio.Event()
        progress.set()

    def _failed(self, exc: BaseException) -> None:
        if not self._failing:
            logger.warning("fingerprints: keeping this replica's copy while Postgres is unreachable: %s", problem(exc))
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            logger.warning("fingerprints: Postgres is reachable again")
        self._failing = False


async def _read(conn: psycopg.AsyncConnection[Any]) -> dict[str, Any]:
    rows = await (await conn.execute(READ_ROWS)).fetchall()
    servers = await (await conn.execute(READ_SERVERS)).fetchall()
    return entries_of(rows, servers)


async def _merge(conn: psycopg.AsyncConnection[Any], write: Listed | Accepted) -> None:
    if isinstance(write, Accepted):
        await conn.execute(ACCEPT, (write.at, write.key))
        return
    async with conn.transaction():
        listed = {row[0] for row in await (await conn.execute(LISTED)).fetchall()}
        await conn.cursor().executemany(MERGE_TOOL, tool_rows(write.prints, listed, write.at))
        if write.server is not None:
            await conn.execute(MERGE_SERVER, (write.server, write.at))


class PgFingerprints(FingerprintStore):
    """The store for a short command: each question and change goes to the database at once."""

    def __init__(self, dsn: str, timeout: float) -> None:
        self._dsn = dsn
        self._timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None
        super().__init__(None)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=max(1, round(self._timeout)))
        return self._conn

    def reload(self) -> None:
        try:
            conn = self._connection()
            rows = conn.execute(READ_ROWS).fetchall()
            servers = conn.execute(READ_SERVERS).fetchall()
        except psycopg.Error as exc:
            logger.warning("fingerprints: Postgres is unreachable, nothing is known accepted: %s", problem(exc))
            return
        self._entries = entries_of(rows, servers)

    def observe(self, prints: dict[str, str], *, server: str | None = None) -> None:
        now = time.time()
        try:
            conn = self._connection()
            with conn.transaction():
                listed = {row[0] for row in conn.execute(LISTED)}
                conn.cursor().executemany(MERGE_TOOL, tool_rows(prints, listed, now))
                if server is not None:
                    conn.execute(MERGE_SERVER, (server, now))
        except psycopg.Error as exc:
            logger.warning("fingerprints: a listing is kept in this process only: %s", problem(exc))
            super().observe(prints, server=server)
            return
        self.reload()

    def accept(self, key: str) -> bool:
        try:
            row = self._connection().execute(ACCEPT, (time.time(), key)).fetchone()
        except psycopg.Error as exc:
            raise StateError(f"cannot accept {key} in Postgres ({problem(exc)})") from None
        self.reload()
        return row is not None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
