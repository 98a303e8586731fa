"""The rug-pull guard's fingerprints in Postgres: a definition accepted once is accepted everywhere.

`PgFingerprints` is the `FingerprintStore` of every replica: its rules are the file store's, but
each listing is merged row by row (`INSERT … ON CONFLICT`), so two replicas listing at once never
overwrite each other, and `tools accept` on any machine reaches them all at the tool's next call.
The catalog asks synchronously and rarely (on a listing, and for a tool under suspicion), so this
one store speaks to the database through a small synchronous connection. While the database is
away the replica keeps its last copy (one warning): a tool never seen accepted stays held.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.fingerprints import SERVERS, FingerprintStore
from mcp_spec_proxy.store.pg_audit import problem

logger = logging.getLogger(__name__)

RETRY_S = 5.0  # after a failure, the last copy is used this long before the database is tried again


class PgFingerprints(FingerprintStore):
    def __init__(self, dsn: str, timeout: float) -> None:
        self._dsn = dsn
        self._timeout = timeout
        self._conn: psycopg.Connection[Any] | None = None
        self._failing = False
        self._retry_at = 0.0
        super().__init__(None)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._failing and time.monotonic() < self._retry_at:
            # The catalog asks on the event loop: while the database is away, do not wait on it each time.
            raise psycopg.OperationalError("the database was unreachable moments ago")
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=max(1, round(self._timeout)))
        return self._conn

    def reload(self) -> None:
        try:
            conn = self._connection()
            rows = conn.execute(
                "SELECT key, accepted, latest, first_seen, changed_at, accepted_at FROM fingerprints"
            ).fetchall()
            servers = conn.execute("SELECT server, first_listing FROM fingerprint_servers").fetchall()
        except psycopg.Error as exc:
            self._failed(exc)
            return
        entries: dict[str, Any] = {}
        for key, accepted, latest, first_seen, changed_at, accepted_at in rows:
            entry = {"accepted": accepted, "latest": latest, "first_seen": first_seen}
            entry.update({k: v for k, v in (("changed_at", changed_at), ("accepted_at", accepted_at)) if v is not None})
            entries[key] = entry
        entries[SERVERS] = {server: {"first_listing": t} for server, t in servers}
        self._entries = entries
        self._recovered()

    def observe(self, prints: dict[str, str], *, server: str | None = None) -> None:
        now = time.time()
        try:
            conn = self._connection()
            with conn.transaction():
                listed = {row[0] for row in conn.execute("SELECT server FROM fingerprint_servers FOR SHARE")}
                for key, sha in prints.items():
                    accepted = None if key.split("/", 1)[0] in listed else sha
                    conn.execute(
                        "INSERT INTO fingerprints (key, accepted, latest, first_seen) VALUES (%s, %s, %s, %s)"
                        " ON CONFLICT (key) DO UPDATE SET latest = EXCLUDED.latest, changed_at = EXCLUDED.first_seen"
                        " WHERE fingerprints.latest IS DISTINCT FROM EXCLUDED.latest",
                        (key, accepted, sha, now),
                    )
                if server is not None:
                    conn.execute(
                        "INSERT INTO fingerprint_servers (server, first_listing) VALUES (%s, %s)"
                        " ON CONFLICT (server) DO NOTHING",
                        (server, now),
                    )
        except psycopg.Error as exc:
            self._failed(exc)
            super().observe(prints, server=server)  # this replica's copy only, until the database is back
            return
        self.reload()

    def accept(self, key: str) -> bool:
        try:
            row = (
                self._connection()
                .execute(
                    "UPDATE fingerprints SET accepted = latest, accepted_at = %s"
                    " WHERE key = %s AND accepted IS DISTINCT FROM latest RETURNING key",
                    (time.time(), key),
                )
                .fetchone()
            )
        except psycopg.Error as exc:
            raise StateError(f"cannot accept {key} in Postgres ({problem(exc)})") from None
        self.reload()
        return row is not None

    def _save(self) -> None:
        return None  # every change is written row by row above

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _failed(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + RETRY_S
        if self._conn is not None and self._conn.broken:
            self._conn = None
        if not self._failing:
            logger.warning("fingerprints: keeping this replica's copy while Postgres is unreachable: %s", problem(exc))
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            logger.warning("fingerprints: Postgres is reachable again")
        self._failing = False
