"""The Postgres store's sweep at a long history: the old plan (every held row of the audit table,
probed for a terminal row) beside today's (`open_calls`, kept by a trigger), on one database.

    .venv/bin/python -m bench.sweep                      # 100,000 and 1,000,000 settled calls
    .venv/bin/python -m bench.sweep --sizes 100000
    MCP_SPEC_PROXY_BENCH_DSN=postgresql://... .venv/bin/python -m bench.sweep   # a real server

Each size is a fresh database migrated by the proxy, filled with that many settled write calls (a
`held` and a `forwarded` row each, as a busy fleet leaves them; inserted with triggers off, since
settled calls leave no open call) and 10 open calls of a stopped replica. Both sweeps are run
`--repeat` times as plain SELECTs of the rows they would mark (the old one is this project's
previous SQL, kept here only to measure it), and must find the same 10 calls. Printed: the median
milliseconds of each and their ratio. Needs the `postgres` and `test` extras.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

import anyio
import psycopg

from bench.store import fresh, postgres
from mcp_spec_proxy.store.migrations import LOCK_NAMESPACE
from mcp_spec_proxy.store.postgres import migrate_database

SETTLED = "'blocked', 'forwarded', 'unsent', 'abandoned', 'forward-interrupted', 'awaiting-input'"
OLD = f"""
SELECT h.call FROM audit h
WHERE h.event = 'held' AND NOT (h.replica = ANY(%(live)s))
  AND NOT EXISTS (SELECT 1 FROM audit t WHERE t.call = h.call AND t.event IN ({SETTLED}))
"""
NEW = """
WITH live AS (
    SELECT objid::bigint AS replica FROM pg_locks
    WHERE locktype = 'advisory' AND classid::bigint = %(ns)s AND objsubid = 2 AND granted
)
SELECT o.call FROM open_calls o JOIN audit h ON h.id = o.held_id LEFT JOIN replicas r ON r.replica = o.replica
WHERE o.replica IS NULL OR (
    o.replica NOT IN (SELECT replica FROM live)
    AND (r.replica IS NULL OR (
        r.seen < clock_timestamp() - make_interval(secs => r.silent_s)
        AND %(since)s::timestamptz < clock_timestamp() - make_interval(secs => r.silent_s)
    ))
)
"""


def fill(dsn: str, size: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                "INSERT INTO audit (ts, event, call, session, replica, data)"
                " SELECT 0, e.event, 'old' || g, 's' || (g %% 1000), 7, '{}' FROM generate_series(1, %s) g,"
                " (VALUES ('held'), ('forwarded')) e(event)",
                (size,),
            )
        for n in range(10):  # open calls of replica 9, which stopped (no lock, no row)
            conn.execute(
                "INSERT INTO audit (ts, event, call, session, replica, data) VALUES (0, 'held', %s, 's', 9, '{}')",
                (f"open{n}",),
            )
        conn.execute("ANALYZE audit")
        conn.execute("ANALYZE open_calls")


def timed(dsn: str, sql: str, args: dict[str, object], repeat: int) -> tuple[float, list[str]]:
    samples, found = [], []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(repeat):
            started = time.perf_counter()
            found = sorted(row[0] for row in conn.execute(sql, args).fetchall())
            samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e3, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with postgres() as admin:
        for size in args.sizes:
            dsn = fresh(admin, f"bench_sweep_{size}")
            anyio.run(migrate_database, dsn, 30)
            fill(dsn, size)
            old_ms, old = timed(dsn, OLD, {"live": []}, args.repeat)
            since = datetime(2000, 1, 1, tzinfo=UTC)  # a sweeper connected long enough to judge
            new_ms, new = timed(dsn, NEW, {"ns": LOCK_NAMESPACE, "since": since}, args.repeat)
            assert old == new == [f"open{n}" for n in range(10)], (old, new)
            print(
                f"{size:>9,} settled calls: old sweep {old_ms:9.2f} ms   open_calls sweep {new_ms:7.2f} ms"
                f"   old/new {old_ms / new_ms:8.1f}x"
            )


if __name__ == "__main__":
    main()
