"""Two proxy replicas — two `mcp-spec-proxy --http` processes — on one Postgres and the same backends.

Ground truth is the backends' ledger and the database itself, never a replica's word: a session's
reads on one replica are in the review of its write on the other; a ticket is good on any replica
and only once; a replica killed with writes held leaves every audit row, and nothing it held is
ever forwarded; with the database away, writes are refused in one line and reads keep working.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.fronts.mcp import SESSION_HEADER
from mcp_spec_proxy.store.postgres import RECONNECT_S
from mcp_spec_proxy.testing import ChatRequest, Respond, ScriptedModelServer
from tests.harness import PROXY_COMMAND, approve, recorded, segment_length, text_of, toy, verdict
from tests.pg import DSN_ENV, database_down, database_name, database_up, replica, rows, until

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def client(
    url: str, session: str | None, *, mode: str = "2026-07-28", elicitation: Any = None
) -> AsyncIterator[Client]:
    headers = {SESSION_HEADER: session} if session else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=elicitation) as c,
    ):
        yield c


def world(server: ScriptedModelServer, ledger: Path, review: dict[str, Any]) -> dict[str, Any]:
    endpoint = {"base_url": server.base_url, "max_retries": 0}
    return {
        "servers": {"toy": toy(ledger)},
        "models": {"strong": {**endpoint, "model": "strong-model"}},
        "review": {"intent": False, **review},
    }


async def test_a_write_on_replica_b_is_reviewed_with_the_reads_made_on_replica_a(tmp_path: Path, pg_dsn: str) -> None:
    seen: list[int] = []

    def answer(request: ChatRequest) -> str:
        seen.append(segment_length(request))
        return verdict(segment_length(request))

    ledger = tmp_path / "ledger"
    async with ScriptedModelServer(Respond(answer)) as server:
        config = world(server, ledger, {"default": "strong"})
        with replica(config, tmp_path, pg_dsn, "a") as a, replica(config, tmp_path, pg_dsn, "b") as b:
            with anyio.fail_after(60):
                async with client(a.url, "agent-7") as on_a:
                    await on_a.call_tool("toy__echo", {"text": "one"})
                    await on_a.call_tool("toy__echo", {"text": "two"})
                async with client(b.url, "agent-7") as on_b:
                    written = await on_b.call_tool("toy__record", {"value": "v"})
                async with client(b.url, "another-agent") as other:
                    await other.call_tool("toy__record", {"value": "w"})
    assert not written.is_error, text_of(written)
    assert seen == [3, 1]  # agent-7's two reads from A and its write on B; the other session sees only its own
    assert recorded(ledger) == ['{"value": "v"}', '{"value": "w"}']
    (first, _) = rows(pg_dsn, "SELECT call, replica FROM audit WHERE event = 'held' ORDER BY id")
    events = [e for (e,) in rows(pg_dsn, "SELECT event FROM audit WHERE call = %s ORDER BY id", (first[0],))]
    assert events == ["held", "verdict", "forwarded"]
    replicas = rows(pg_dsn, "SELECT count(DISTINCT replica) FROM audit")
    assert replicas == [(2,)]


async def test_the_audit_command_reads_the_rows_of_every_replica(tmp_path: Path, pg_dsn: str) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    with replica(config, tmp_path, pg_dsn, "a") as a:
        with anyio.fail_after(60):
            async with client(a.url, "s1") as on_a:
                await on_a.call_tool("toy__record", {"value": "v"})
    argv = [PROXY_COMMAND, "audit", "--config", str(tmp_path / "a" / "servers.yaml"), "--tail", "3"]
    with anyio.fail_after(60):
        listed = await anyio.run_process(argv, env={**os.environ, DSN_ENV: pg_dsn}, check=False)
    assert listed.returncode == 0, listed.stderr.decode()
    lines = [json.loads(line) for line in listed.stdout.decode().splitlines()]
    assert [line["event"] for line in lines] == ["held", "verdict", "forwarded"]
    assert lines[0]["tool"] == "toy__record" and lines[0]["session"].startswith("named-")


async def test_an_approval_is_good_on_any_replica_and_only_once(tmp_path: Path, pg_dsn: str) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "human", "intent": False}}
    with replica(config, tmp_path, pg_dsn, "a") as a, replica(config, tmp_path, pg_dsn, "b") as b:
        with anyio.fail_after(90):
            async with (
                client(a.url, "agent-9", elicitation=approve(True)) as on_a,
                client(b.url, "agent-9", elicitation=approve(True)) as on_b,
            ):
                results = []
                for issuer, user, replay, value in ((on_a, on_a, on_b, "v"), (on_b, on_a, on_b, "w")):
                    asked = await issuer.session.call_tool("toy__record", {"value": value}, allow_input_required=True)
                    assert isinstance(asked, types.InputRequiredResult)
                    (key,) = (asked.input_requests or {}).keys()
                    yes: types.InputResponses = {key: types.ElicitResult(action="accept", content={"approve": True})}
                    for each in (user, replay):
                        results.append(
                            await each.session.call_tool(
                                "toy__record",
                                {"value": value},
                                input_responses=yes,
                                request_state=asked.request_state,
                                allow_input_required=True,
                            )
                        )
    # Issued on A and used on A, replayed on B; issued on B, used on A, replayed on B.
    used = [r for r in results if isinstance(r, types.CallToolResult)]
    assert [isinstance(r, types.CallToolResult) for r in results] == [True, False, True, False]
    assert all(not r.is_error for r in used), [text_of(r) for r in used]
    assert recorded(ledger) == ['{"value": "v"}', '{"value": "w"}']


async def test_the_strong_verdict_rides_with_the_ticket_to_the_other_replica(tmp_path: Path, pg_dsn: str) -> None:
    ledger = tmp_path / "ledger"
    async with ScriptedModelServer(Respond(lambda r: verdict(segment_length(r) - 1, "looks wrong"))) as server:
        config = world(server, ledger, {"default": "strong_then_human"})
        with replica(config, tmp_path, pg_dsn, "a") as a, replica(config, tmp_path, pg_dsn, "b") as b:
            with anyio.fail_after(90):
                async with (
                    client(a.url, "agent-5", elicitation=approve(True)) as on_a,
                    client(b.url, "agent-5", elicitation=approve(True)) as on_b,
                ):
                    asked = await on_a.session.call_tool("toy__record", {"value": "v"}, allow_input_required=True)
                    assert isinstance(asked, types.InputRequiredResult)
                    (key,) = (asked.input_requests or {}).keys()
                    yes: types.InputResponses = {key: types.ElicitResult(action="accept", content={"approve": True})}
                    done = await on_b.session.call_tool(
                        "toy__record",
                        {"value": "v"},
                        input_responses=yes,
                        request_state=asked.request_state,
                        allow_input_required=True,
                    )
        model_calls = len(server.chat_requests)
    assert isinstance(done, types.CallToolResult) and not done.is_error, done
    assert model_calls == 1  # B read A's strong verdict from the ticket instead of asking again
    assert recorded(ledger) == ['{"value": "v"}']


def waiting_elicitation(asked: list[str], all_asked: anyio.Event, want: int, go: anyio.Event | None = None) -> Any:
    """A person who is asked (`want` questions in all) and answers yes once `go` is set — never without it."""

    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        if len(asked) == want:
            all_asked.set()
        if go is None:
            await anyio.sleep_forever()
        else:
            await go.wait()
        return types.ElicitResult(action="accept", content={"approve": True, "note": ""})

    return callback


async def steady_reads(url: str, stop: anyio.Event) -> int:
    """Reads one after another until `stop`: the replica is never idle. How many ran."""
    done = 0
    async with client(url, "reader") as c:
        while not stop.is_set():
            await c.call_tool("toy__echo", {"text": str(done)})
            done += 1
    return done


BEAT = 0.5  # seconds: the replicas' heartbeat in these tests (3 silent beats with no lock: stopped)


async def test_a_replica_killed_with_writes_held_has_them_closed_by_a_busy_survivor(
    tmp_path: Path, pg_dsn: str
) -> None:
    """kill -9 with two writes held: the survivor, busy with reads the whole time, marks them
    abandoned within a few beats — no replica needs to start or idle — and nothing it held runs."""
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "human", "intent": False}}
    asked: list[str] = []
    both_asked = anyio.Event()
    failures: list[BaseException] = []

    async def held_write(url: str, value: str) -> None:
        try:
            async with client(url, None, mode="legacy", elicitation=waiting_elicitation(asked, both_asked, 2)) as c:
                await c.call_tool("toy__record", {"value": value})
        except Exception as exc:  # the replica dies under the call: how it fails is not the point
            failures.append(exc)

    with (
        replica(config, tmp_path, pg_dsn, "a", heartbeat=BEAT) as a,
        replica(config, tmp_path, pg_dsn, "b", heartbeat=BEAT) as b,
    ):
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(held_write, a.url, "one")
                tg.start_soon(held_write, a.url, "two")
                await both_asked.wait()
                a.kill()
                tg.cancel_scope.deadline = anyio.current_time() + 20
        held = rows(pg_dsn, "SELECT call, replica FROM audit WHERE event = 'held' ORDER BY id")
        assert len(held) == 2  # committed before the user was asked, so before the kill
        stop = anyio.Event()
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(steady_reads, b.url, stop)
                await until(lambda: len(rows(pg_dsn, "SELECT 1 FROM audit WHERE event = 'abandoned'")) == 2)
                stop.set()
        abandoned = rows(
            pg_dsn, "SELECT call, replica, data->>'reason' FROM audit WHERE event = 'abandoned' ORDER BY call"
        )
        assert sorted(c for c, _, _ in abandoned) == sorted(c for c, _ in held)
        assert {r for _, r, _ in abandoned} != {r for _, r in held}  # by the survivor, not by the dead
        assert all("never forwarded" in reason for _, _, reason in abandoned)
        with anyio.fail_after(60):
            async with client(b.url, None, mode="legacy", elicitation=approve(True)) as on_b:
                again = await on_b.call_tool("toy__record", {"value": "one"})
    assert not again.is_error, text_of(again)
    assert recorded(ledger) == ['{"value": "one"}']  # the retry ran once; the held calls never did
    forwarded = rows(pg_dsn, "SELECT call, count(*) FROM audit WHERE event = 'forwarded' GROUP BY call")
    assert [n for _, n in forwarded] == [1]
    assert not {c for c, _ in forwarded} & {c for c, _ in held}


async def test_the_sweep_says_which_calls_of_a_dead_replica_may_have_run_as_their_audit_rows_tell(
    tmp_path: Path, pg_dsn: str
) -> None:
    """kill -9 with one write held for a person and one already forwarded (the backend's ledger has
    it; its answer never came): the survivor's sweep log names one never forwarded and one that may
    have run, as the audit rows say, not both "never forwarded"."""
    ledger = tmp_path / "ledger"
    overrides = {"record_then_hang": {"review": "allow"}}
    config = {
        "servers": {"toy": toy(ledger, "--record-then-hang", tools={"overrides": overrides})},
        "review": {"default": "human", "intent": False},
    }
    asked: list[str] = []
    was_asked = anyio.Event()

    async def call(url: str, tool: str, value: str) -> None:
        with contextlib.suppress(Exception):  # the replica dies under the call: how it fails is not the point
            async with client(url, None, mode="legacy", elicitation=waiting_elicitation(asked, was_asked, 1)) as c:
                await c.call_tool(tool, {"value": value})

    with (
        replica(config, tmp_path, pg_dsn, "a", heartbeat=BEAT) as a,
        replica(config, tmp_path, pg_dsn, "b", heartbeat=BEAT) as b,
    ):
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, a.url, "toy__record", "held")
                tg.start_soon(call, a.url, "toy__record_then_hang", "ran")
                await was_asked.wait()
                await until(lambda: recorded(ledger) == ['{"value": "ran"}'])
                a.kill()
                tg.cancel_scope.deadline = anyio.current_time() + 20
            await until(lambda: len(rows(pg_dsn, "SELECT 1 FROM audit WHERE event = 'abandoned'")) == 2)
            await until(lambda: any("abandoned" in line for line in b.log))
    (line,) = [line for line in b.log if "of stopped replicas abandoned" in line]
    assert "marked 2 call(s)" in line and "1 held, never forwarded" in line, line
    assert "1 after an accepted verdict, which the backend may or may not have run" in line, line
    reasons = dict(rows(pg_dsn, "SELECT data->>'tool', data->>'reason' FROM audit WHERE event = 'abandoned'"))
    assert "never forwarded" in reasons["toy__record"]
    assert "may or may not have run" in reasons["toy__record_then_hang"]
    assert recorded(ledger) == ['{"value": "ran"}']


async def test_after_a_database_outage_under_traffic_no_live_replicas_held_call_is_abandoned(
    tmp_path: Path, pg_dsn: str, postgres_server: str
) -> None:
    """The database goes away for longer than its replicas' silence limits (every lock and connection cut) while a
    write waits for its person on A and B serves reads; when it is back, both replicas register
    again on their own timers, neither sweeps the other, and the person's yes still runs the write."""
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "human", "intent": False}}
    asked: list[str] = []
    was_asked, go = anyio.Event(), anyio.Event()
    name = database_name(pg_dsn)
    outcome: list[types.CallToolResult] = []

    async def held_write(url: str) -> None:
        elicitation = waiting_elicitation(asked, was_asked, 1, go)
        async with client(url, None, mode="legacy", elicitation=elicitation) as c:
            outcome.append(await c.call_tool("toy__record", {"value": "held through the outage"}))

    def said(r: Any, text: str) -> int:
        return sum(text in line for line in r.log)

    # A beats slower than B: B is back (and sweeping) before A has taken its lock again.
    with (
        replica(config, tmp_path, pg_dsn, "a", heartbeat=4 * BEAT, timeout=3) as a,
        replica(config, tmp_path, pg_dsn, "b", heartbeat=BEAT, timeout=3) as b,
    ):
        with anyio.fail_after(150):
            async with anyio.create_task_group() as tg:
                tg.start_soon(held_write, a.url)
                await was_asked.wait()
                stop = anyio.Event()
                tg.start_soon(steady_reads, a.url, stop)
                tg.start_soon(steady_reads, b.url, stop)
                database_down(postgres_server, name)
                # Each has missed five of its beats: both silent past their limits (3 beats + the timeout).
                await until(lambda: min(said(a, "is not registered"), said(b, "is not registered")) >= 5)
                database_up(postgres_server, name)
                (up,) = rows(pg_dsn, "SELECT now()")
                await until(lambda: min(said(a, "with Postgres again"), said(b, "with Postgres again")) >= 1)
                await until(lambda: said(a, "Postgres is reachable again") >= 1)  # A's pool is back too
                # Several of B's beats (and sweeps) after the outage, and A's, reads going on all along.
                beaten = "SELECT bool_and(seen > %s + interval '4 seconds') FROM replicas"
                await until(lambda: bool(rows(pg_dsn, beaten, (up[0],))[0][0]))
                stop.set()
                go.set()
    assert rows(pg_dsn, "SELECT count(*) FROM audit WHERE event = 'abandoned'") == [(0,)]
    assert outcome and not outcome[0].is_error, text_of(outcome[0]) if outcome else "no answer"
    assert recorded(ledger) == ['{"value": "held through the outage"}']


async def test_with_the_database_gone_writes_fail_closed_in_one_line_and_reads_keep_working_until_it_is_back(
    tmp_path: Path, pg_dsn: str, postgres_server: str
) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    name = database_name(pg_dsn)
    with replica(config, tmp_path, pg_dsn, "a", timeout=2) as a:
        with anyio.fail_after(90):
            async with client(a.url, "agent-3") as on_a:
                before = await on_a.call_tool("toy__record", {"value": "before"})
                database_down(postgres_server, name)
                read = await on_a.call_tool("toy__echo", {"text": "still here"})
                with pytest.raises(MCPError) as refused:
                    await on_a.call_tool("toy__record", {"value": "during"})
                read_again = await on_a.call_tool("toy__echo", {"text": "and here"})
                database_up(postgres_server, name)
                # The pool reconnects with backoff: a write may still be refused (never forwarded) meanwhile.
                while True:
                    try:
                        after = await on_a.call_tool("toy__record", {"value": "after"})
                        break
                    except MCPError:
                        continue
    assert not before.is_error and not after.is_error, text_of(after)
    assert text_of(read) == "still here" and text_of(read_again) == "and here"
    message = str(refused.value)
    assert "cannot write the audit trail to Postgres" in message and "\n" not in message
    assert recorded(ledger) == ['{"value": "before"}', '{"value": "after"}']  # and the pool found it again


async def test_after_an_outage_longer_than_the_pools_old_backoff_the_first_write_runs(
    tmp_path: Path, pg_dsn: str, postgres_server: str
) -> None:
    """The pool's back-off is capped (`RECONNECT_S`): after 40 s away, the way back is one attempt,
    so the first write once the database is back runs, within the store's timeout. (With the pool's
    own back-off, doubling up to 128 s, its next attempt could come 30 s after the return, and writes
    were refused meanwhile; its series gave up only after 300 s, which the log shows.)"""
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    name = database_name(pg_dsn)
    with replica(config, tmp_path, pg_dsn, "a", timeout=3) as a:
        with anyio.fail_after(150):
            async with client(a.url, "agent-4") as on_a:
                assert not (await on_a.call_tool("toy__record", {"value": "before"})).is_error
                database_down(postgres_server, name)
                with pytest.raises(MCPError):  # the pool finds its connection cut: its attempts begin
                    await on_a.call_tool("toy__record", {"value": "during"})
                # Eight of its beats (5 s each) missed: 40 s away, past the old back-off's 16 s and 32 s steps;
                # and the pool gave up a series of attempts after RECONNECT_S (its default: after 300 s),
                # so the next request that waits starts a new one at once.
                await until(lambda: sum("is not registered" in line for line in a.log) >= 8)
                await until(lambda: any(f"failed after {RECONNECT_S} sec" in line for line in a.log))
                database_up(postgres_server, name)
                after = await on_a.call_tool("toy__record", {"value": "after"})
    assert not after.is_error, text_of(after)
    assert recorded(ledger) == ['{"value": "before"}', '{"value": "after"}']
