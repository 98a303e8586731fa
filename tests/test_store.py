"""The store seam: the files store is today's state folder and needs nothing new; the Postgres
store's pieces hold their promises against a real database (one server for the suite, a fresh
database per test), including when two replicas race for the same row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
import yaml

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store import Ticket, open_store
from mcp_spec_proxy.store.migrations import LATEST, LEASH, MIGRATIONS
from mcp_spec_proxy.store.pg_fingerprints import PgFingerprints
from mcp_spec_proxy.store.postgres import SWEEP, PgStore, migrate_database, read_audit_once, sweep_args
from mcp_spec_proxy.trajectory import History, Step
from tests.harness import PROXY_COMMAND
from tests.pg import DSN_ENV, rows

pytestmark = pytest.mark.anyio

FILES_ONLY = """
import sys, anyio
from pathlib import Path
from mcp import Client
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.harness import toy, toy_twins

async def main() -> None:
    tmp = Path(sys.argv[1])
    raw = {"servers": {"toy": toy(tmp / "ledger")}, "review": {"default": "allow", "intent": False}}
    config = ProxyConfig.model_validate(raw)
    async with running_proxy(config, StatePaths(tmp / "state"), in_process=toy_twins(raw)) as p:
        async with Client(McpFront(p).server) as client:
            await client.call_tool("toy__echo", {"text": "r"})
            await client.call_tool("toy__record", {"value": "w"})
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("psycopg", "psycopg_pool", "pgvector", "pgserver")))

anyio.run(main)
"""


def test_the_files_store_imports_no_postgres_module(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-c", FILES_ONLY, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=os.getcwd()
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
    assert (tmp_path / "ledger").read_text().strip() == '{"value": "w"}'  # it did serve, from the files store
    assert [json.loads(line)["event"] for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()] == [
        "read",
        "held",
        "verdict",
        "forwarded",
    ]


def test_a_postgres_store_whose_variable_is_unset_is_one_line_from_check(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {}, "store": {"postgres": {"dsn_env": "NOT_SET_ANYWHERE"}}}))
    run = subprocess.run([PROXY_COMMAND, "--config", str(config), "check"], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        f"Error: {config}: store.postgres.dsn_env: environment variable NOT_SET_ANYWHERE is not set — export it"
        " with the database's DSN (postgresql://user:password@host/db), or remove `store:`"
    ]


def test_the_audit_command_reads_the_files_store(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    lines = [{"ts": 1.0, "event": "held", "session": "s1"}, {"ts": 2.0, "event": "held", "session": "s2"}]
    (state / "audit.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"torn')
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {}}))
    run = subprocess.run(
        [PROXY_COMMAND, "audit", "--config", str(config), "--state-dir", str(state), "--session", "s2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert [json.loads(line) for line in run.stdout.splitlines()] == [lines[1]]


def test_the_audit_command_keeps_one_principals_lines_before_it_takes_the_tail(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    ann, bob = {"sub": "ann", "client_id": "c"}, {"sub": "bob", "client_id": "c"}
    lines = [
        {"ts": 1.0, "event": "held", "session": "s1", "principal": ann},
        {"ts": 2.0, "event": "backend", "server": "toy"},  # names nobody
        {"ts": 3.0, "event": "verdict", "session": "s1", "principal": ann},
        {"ts": 4.0, "event": "held", "session": "s2", "principal": bob},
    ]
    (state / "audit.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {}}))
    command = [PROXY_COMMAND, "audit", "--config", str(config), "--state-dir", str(state), "--principal", "ann"]
    runs = [subprocess.run(c, capture_output=True, text=True, timeout=60) for c in (command, [*command, "--tail", "1"])]
    every, last = runs
    assert every.returncode == 0 and last.returncode == 0, every.stderr + last.stderr
    assert [json.loads(line) for line in every.stdout.splitlines()] == [lines[0], lines[2]]
    assert [json.loads(line) for line in last.stdout.splitlines()] == [lines[2]]


# -- the Postgres store ---------------------------------------------------------------------------


async def test_migrations_apply_once_and_leash_tables_only_for_a_config_with_leash(pg_dsn: str) -> None:
    core = [m.version for m in MIGRATIONS if m.part != LEASH]
    assert await migrate_database(pg_dsn, 5) == core
    assert await migrate_database(pg_dsn, 5) == []
    # A proxy without LEASH needs neither pgvector nor the right to create extensions.
    assert rows(pg_dsn, "SELECT count(*) FROM pg_extension WHERE extname = 'vector'") == [(0,)]
    assert rows(pg_dsn, "SELECT to_regclass('bank_vectors') IS NULL") == [(True,)]
    assert await migrate_database(pg_dsn, 5, leash=True) == [m.version for m in MIGRATIONS if m.part == LEASH]
    assert rows(pg_dsn, "SELECT count(*) FROM pg_extension WHERE extname = 'vector'") == [(1,)]
    assert await migrate_database(pg_dsn, 5, leash=True) == []


async def test_a_newer_additive_step_lets_an_older_replica_start_and_a_breaking_one_does_not(pg_dsn: str) -> None:
    """Expand, then contract: replicas upgraded one at a time keep serving while the first new one
    migrates; a step that changes what older replicas use stops them in one line."""
    await migrate_database(pg_dsn, 5)
    future = "INSERT INTO schema_version (version, name, breaking) VALUES (%s, 'from the future', %s) RETURNING 1"
    rows(pg_dsn, future, (LATEST + 1, False))
    assert await migrate_database(pg_dsn, 5) == []  # starts: the newer step only adds
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        await store.audit.record("held", call="c1", session="s", tool="toy__record")
    rows(pg_dsn, future, (LATEST + 2, True))
    with pytest.raises(StateError, match=f"has step {LATEST + 2}, which changes what this proxy"):
        await migrate_database(pg_dsn, 5)


async def test_store_migrate_to_stops_at_the_version_named(pg_dsn: str) -> None:
    assert await migrate_database(pg_dsn, 5, to=1) == [1]
    assert rows(pg_dsn, "SELECT to_regclass('open_calls') IS NULL") == [(True,)]
    assert await migrate_database(pg_dsn, 5) == [m.version for m in MIGRATIONS if m.part != LEASH and m.version > 1]


async def test_a_definition_accepted_once_is_accepted_on_every_replica(pg_dsn: str) -> None:
    await migrate_database(pg_dsn, 5)
    a, b = PgFingerprints(pg_dsn, 5), PgFingerprints(pg_dsn, 5)
    try:
        a.observe({"git/log": "v1"}, server="git")  # the first listing ever: accepted as it stands
        b.reload()
        assert b.status("git/log", "v1") == "accepted"
        b.observe({"git/log": "v2", "git/push": "p1"}, server="git")  # a rug pull and a late tool, seen on B
        a.reload()
        assert (a.status("git/log", "v2"), a.status("git/push", "p1")) == ("changed", "new")
        assert a.accept("git/log") and not b.accept("git/log")  # accepted on A: B has nothing left to accept
        b.reload()
        assert b.status("git/log", "v2") == "accepted" and b.pending() == ["git/push"]
    finally:
        a.close()
        b.close()


async def test_of_two_replicas_taking_one_ticket_at_once_exactly_one_gets_it(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    environ = {DSN_ENV: pg_dsn}
    got: list[Ticket | None] = []
    async with open_store(config, None, environ) as a, open_store(config, None, environ) as b:
        assert await a.approvals.key() == await b.approvals.key()  # a ticket signed on A verifies on B
        for n in range(20):
            await a.approvals.put(f"n{n}", Ticket(("s", "t", "d"), time.time() + 60, "q", {"m": ("why", ())}))

        async def take(store: Any, nonce: str) -> None:
            got.append(await store.approvals.take(nonce))

        async with anyio.create_task_group() as tg:
            for n in range(20):
                tg.start_soon(take, a, f"n{n}")
                tg.start_soon(take, b, f"n{n}")
    taken = [t for t in got if t is not None]
    assert len(got) == 40 and len(taken) == 20
    assert taken[0].memo == {"m": ("why", ())}  # the reviewers' memo comes back as they left it


async def test_an_expired_ticket_is_taken_by_no_one(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        await store.approvals.put("old", Ticket(("s", "t", "d"), time.time() - 1, "q"))
        assert await store.approvals.take("old") is None


async def view(store: Any, session: str) -> History:
    """The session as a replica's next held write would load it (that probe is released again)."""
    history = History()
    segment = await store.sessions.hold(session, history, Step("probe", {}, "write"))
    await store.sessions.release(session, history, segment)
    return history


async def test_reads_on_one_replica_are_in_the_segment_held_on_another(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    environ = {DSN_ENV: pg_dsn}
    async with open_store(config, None, environ) as a, open_store(config, None, environ) as b:
        on_a, on_b = History(commit_every=8), History(commit_every=8)
        await a.sessions.read("s", on_a, Step("fs__read", {"path": "x"}, "read", observation="X"))
        segment = await b.sessions.hold("s", on_b, Step("fs__write", {"path": "x"}, "write"))
        await a.sessions.read("s", on_a, Step("fs__read", {"path": "y"}, "read"))  # arrives while B's write is held
        await b.sessions.settle("s", on_b, segment, len(segment))
        on_a = await view(a, "s")
    assert [s.tool for s in segment.steps] == ["fs__read", "fs__write"]
    assert segment.steps[0].observation == "X"
    assert [s.tool for s in on_a.committed] == ["fs__read", "fs__write"]
    assert [s.arguments for s in on_a.open] == [{"path": "y"}]  # still open for the next segment
    assert on_a.held == 0


async def test_a_rejected_segment_commits_its_prefix_and_drops_the_rest_for_every_replica(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    environ = {DSN_ENV: pg_dsn}
    async with open_store(config, None, environ) as a, open_store(config, None, environ) as b:
        on_a, on_b = History(), History()
        for path in ("1", "2", "3"):
            await a.sessions.read("s", on_a, Step("fs__read", {"path": path}, "read"))
        segment = await b.sessions.hold("s", on_b, Step("fs__write", {}, "write"))
        await b.sessions.settle("s", on_b, segment, 1)  # only the first read was sound
        on_a = await view(a, "s")
    assert [s.arguments for s in on_a.committed] == [{"path": "1"}]
    assert on_a.open == () and on_a.discarded == 3


async def test_hostile_text_reaches_the_audit_table_intact_enough(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        await store.audit.record("verdict", call="c1", session="s", reason="nul \x00 and lone \ud800 surrogate")
        found = await store.read_audit("s")
    assert found[0]["reason"].startswith("nul ") and "surrogate" in found[0]["reason"]


async def test_the_audit_rows_of_one_principal_are_read_before_the_tail(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        await store.audit.record("held", call="c1", session="s", principal={"sub": "ann", "client_id": None})
        await store.audit.record("held", call="c2", session="s", principal={"sub": "bob", "client_id": None})
        await store.audit.record("backend", server="toy")
    found = await read_audit_once(pg_dsn, 10, None, 1, "ann")
    assert [(row["call"], row["principal"]["sub"]) for row in found] == [("c1", "ann")]


async def test_a_call_marked_abandoned_takes_no_verdict(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        assert isinstance(store, PgStore)
        await store.audit.record("held", call="c9", session="s", tool="toy__record")
        # As another replica's sweep does when it finds this one gone.
        rows(
            pg_dsn,
            "INSERT INTO audit (ts, event, call, session, replica, data) VALUES (0, 'abandoned', 'c9', 's', 0, '{}')"
            " RETURNING 1",
        )
        with pytest.raises(StateError, match="marked abandoned"):
            await store.audit.record("verdict", call="c9", session="s", accepted=True)


async def test_a_sweep_spares_the_held_calls_of_live_replicas(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    environ = {DSN_ENV: pg_dsn}
    async with open_store(config, None, environ) as a:
        await a.audit.record("held", call="live", session="s")
        async with open_store(config, None, environ) as b:  # opening sweeps
            assert isinstance(b, PgStore)
            assert await b.sweep() == 0
    async with open_store(config, None, environ):  # A stopped (and signed off): its held call is abandoned
        pass
    assert rows(pg_dsn, "SELECT call FROM audit WHERE event = 'abandoned'") == [("live",)]


def cut_lock(dsn: str, replica: int) -> None:
    """As a database restart does to one replica: its lock's connection is cut, and the lock with it."""
    rows(dsn, "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s", (replica,))


async def test_a_live_replica_that_lost_its_lock_keeps_its_held_calls(pg_dsn: str) -> None:
    """After a database restart every lock is gone at once; a replica still beating is alive."""
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV, "heartbeat": 60}}})
    environ = {DSN_ENV: pg_dsn}
    async with open_store(config, None, environ) as a, open_store(config, None, environ) as b:
        assert isinstance(a, PgStore) and isinstance(b, PgStore)
        await a.audit.record("held", call="mine", session="s", tool="toy__record")
        cut_lock(pg_dsn, a.replica)
        assert await b.sweep() == 0  # silent for less than DEAD_AFTER beats: not taken for dead
        await a._keep_registered()  # a's own timer: it takes its lock again
        assert await b.sweep() == 0
        await a.audit.record("verdict", call="mine", session="s", accepted=True)  # not refused
    assert rows(pg_dsn, "SELECT count(*) FROM audit WHERE event = 'abandoned'") == [(0,)]


async def test_a_replica_with_no_lock_and_no_beat_is_swept_and_its_verdict_refused(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV, "heartbeat": 60}}})
    environ = {DSN_ENV: pg_dsn}
    async with open_store(config, None, environ) as a, open_store(config, None, environ) as b:
        assert isinstance(a, PgStore) and isinstance(b, PgStore)
        await a.audit.record("held", call="gone", session="s", tool="toy__record")
        await a.audit.record("held", call="settled", session="s", tool="toy__record")
        await a.audit.record("blocked", call="settled", session="s")
        cut_lock(pg_dsn, a.replica)
        rows(
            pg_dsn, "UPDATE replicas SET seen = now() - interval '1 hour' WHERE replica = %s RETURNING 1", (a.replica,)
        )
        assert await b.sweep() == 0  # b itself has not been connected long enough to judge a's silence
        b._connected_since = datetime.now(UTC) - timedelta(hours=1)  # as if it had, for an hour
        assert await b.sweep() == 1
        assert await b.sweep() == 0  # once
        with pytest.raises(StateError, match="marked abandoned"):
            await a.audit.record("verdict", call="gone", session="s", accepted=True)
    found = rows(pg_dsn, "SELECT call, replica, data->>'replica' FROM audit WHERE event = 'abandoned'")
    assert found == [("gone", b.replica, str(a.replica))]


async def test_a_busy_replica_sweeps_on_its_own_timer(pg_dsn: str) -> None:
    """Reads never let up, and still the survivor closes the dead replica's held call: beats and
    sweeps no longer wait for a quiet moment."""
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV, "heartbeat": 0.2}}})
    environ = {DSN_ENV: pg_dsn}
    async with open_store(config, None, environ) as a, open_store(config, None, environ) as b:
        assert isinstance(a, PgStore) and isinstance(b, PgStore)
        await a.audit.record("held", call="dead", session="s", tool="toy__record")
        cut_lock(pg_dsn, a.replica)  # and a never beats: its `run` is not running, as after kill -9
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                await tg.start(b.run)
                while not rows(pg_dsn, "SELECT 1 FROM audit WHERE event = 'abandoned' AND call = 'dead'"):
                    b.audit.note("read", call=None, session="s", tool="toy__echo")
                    await anyio.sleep(0.01)  # steady traffic: a read every 10 ms
                tg.cancel_scope.cancel()
    assert rows(pg_dsn, "SELECT count(*) FROM audit WHERE event = 'read'")[0][0] > 0


async def test_the_sweep_reads_the_open_calls_not_the_history(pg_dsn: str) -> None:
    """A long history of settled calls: the sweep's plan reads none of them (at a million rows, the
    old plan's time neared its 5 s limit: `python -m bench.sweep`, docs/BENCHMARKS.md)."""
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        assert isinstance(store, PgStore)
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            with conn.transaction():
                conn.execute("SET LOCAL session_replication_role = replica")  # settled: no open call to keep
                conn.execute(
                    "INSERT INTO audit (ts, event, call, session, replica, data)"
                    " SELECT 0, e.event, 'old' || g, 's', 7, '{}' FROM generate_series(1, 100000) g,"
                    " (VALUES ('held'), ('forwarded')) e(event)"
                )
            conn.execute("ANALYZE audit")
            conn.execute("ANALYZE open_calls")
            plan = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + SWEEP, sweep_args(store.replica, datetime.now(UTC))
            ).fetchone()
        assert plan is not None and rows(pg_dsn, "SELECT count(*) FROM open_calls") == [(0,)]
        assert audit_rows_read(plan[0][0]["Plan"]) < 100  # was every held row of the history, and a probe each
        assert await store.sweep() == 0


def audit_rows_read(node: dict[str, Any]) -> int:
    """The rows a plan's scans of the audit table produced, in all their loops."""
    own = int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1)) if node.get("Relation Name") == "audit" else 0
    return own + sum(audit_rows_read(child) for child in node.get("Plans", []))


async def test_tools_accept_on_any_machine_reaches_the_postgres_store(pg_dsn: str, tmp_path: Path) -> None:
    await migrate_database(pg_dsn, 5)
    prints = PgFingerprints(pg_dsn, 5)
    try:
        prints.observe({"toy/echo": "v1"}, server="toy")
        prints.observe({"toy/echo": "v2"}, server="toy")  # the definition changed under a replica
        config = tmp_path / "servers.yaml"
        config.write_text(yaml.safe_dump({"servers": {}, "store": {"postgres": {"dsn_env": DSN_ENV}}}))
        with anyio.fail_after(60):
            run = await anyio.run_process(
                [PROXY_COMMAND, "tools", "accept", "toy/echo", "--config", str(config)],
                env={**os.environ, DSN_ENV: pg_dsn},
                check=False,
            )
        prints.reload()
        assert run.returncode == 0, run.stderr.decode()
        assert run.stdout.decode().splitlines()[0] == "accepted the new definition of toy/echo"
        assert prints.status("toy/echo", "v2") == "accepted"
    finally:
        prints.close()


async def test_store_migrate_applies_the_schema_once(pg_dsn: str, tmp_path: Path) -> None:
    postgres, files = tmp_path / "postgres.yaml", tmp_path / "files.yaml"
    postgres.write_text(yaml.safe_dump({"servers": {}, "store": {"postgres": {"dsn_env": DSN_ENV}}}))
    files.write_text(yaml.safe_dump({"servers": {}}))
    said = []
    with anyio.fail_after(90):
        for config in (postgres, postgres, files):
            run = await anyio.run_process(
                [PROXY_COMMAND, "store", "migrate", "--config", str(config)],
                env={**os.environ, DSN_ENV: pg_dsn},
                check=False,
            )
            assert run.returncode == 0, run.stderr.decode()
            said.append(run.stdout.decode().strip())
    core = [m.version for m in MIGRATIONS if m.part != LEASH]
    assert said == [
        f"applied migration(s) {', '.join(map(str, core))}: schema at version {max(core)}",
        f"schema is current (version {max(core)})",
        "store: files — nothing to migrate",
    ]
    assert rows(pg_dsn, "SELECT max(version) FROM schema_version") == [(max(core),)]


async def test_a_replica_whose_lock_connection_dropped_registers_again(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    live = "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted"
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        assert isinstance(store, PgStore)
        assert (store.replica,) in rows(pg_dsn, live)
        # As when the database restarts: the replica's lock connection is cut, and the lock with it.
        rows(
            pg_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s",
            (store.replica,),
        )
        assert (store.replica,) not in rows(pg_dsn, live)
        await store._keep_registered()
        assert (store.replica,) in rows(pg_dsn, live)
