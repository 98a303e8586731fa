"""Stops seen from outside: a real `mcp-spec-proxy --http` replica on the shared Postgres, a write
held on its console, and an operator who sends SIGTERM three times.

The second signal stops at once: the held write is never forwarded, its client is told the
replica shut down (-32016), and its `abandoned` row is on the shared audit trail, written by this
replica before its pool closed (no survivor sweeps for it). The third signal, and any after it,
is ignored to the process's end (logged while its event loop runs): the replica exits 0, without
a traceback — before, a signal after the event loop ended killed it (exit -15).

A write whose approval is out with the person behind its client (2026-07-28: the call returned
`input_required`) when SIGTERM comes is waited for: the SDK client's retry brings the approval, the
write runs once, its result reaches the client, and the replica exits 0 — before, the drain saw
nothing in flight and stopped under the retry, which ran while its client was told "Connection closed".
That client never listed the tools: the SDK lists them after the result to check it, and the stopping
replica answers that too before it stops (before, it answered 503 and the SDK raised, the write done).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.provenance import own_blocks
from mcp_spec_proxy.errors import SHUTTING_DOWN
from tests.harness import recorded, text_of, toy
from tests.ops_world import SERVING, Running, serving, until
from tests.pg import DSN_ENV, rows
from tests.test_ops_drain import hold_then_terminate

pytestmark = pytest.mark.anyio

SECOND = re.compile(r"a second signal")
OUT_WITH_CLIENT = re.compile(r"draining: .*1 approval\(s\) out with their clients")


def signalled(proxy: Running) -> bool:
    """One more SIGTERM, unless it has exited: whether it has."""
    if proxy.proc.poll() is None:
        proxy.terminate()
    return proxy.proc.poll() is not None


def world(ledger: Path) -> dict[str, Any]:
    return {
        "servers": {"toy": toy(ledger)},
        "review": {"default": "console", "intent": False},
        "drain_s": 120,
        "store": {"postgres": {"dsn_env": DSN_ENV}},
    }


async def test_three_and_more_sigterms_abandon_the_held_write_on_the_shared_trail_tell_its_client_and_exit_0(
    tmp_path: Path, pg_dsn: str
) -> None:
    ledger = tmp_path / "ledger"
    out: list[str] = []
    async with serving(world(ledger), tmp_path, "--console", "127.0.0.1:0", env={DSN_ENV: pg_dsn}) as proxy:
        with anyio.fail_after(90):
            async with anyio.create_task_group() as tg:
                await hold_then_terminate(proxy, tmp_path, tg, out)  # the first: the drain begins
                proxy.terminate()  # the second: stop at once
                await proxy.line(SECOND)
                # The third, and more while it stops, up to its very end (after its event loop, too):
                # sent at every look until the process has exited.
                await until(lambda: signalled(proxy), every=0.02)
                code = await proxy.wait()
    log = proxy.log()
    assert code == 0, log
    assert "Traceback" not in log, log
    assert recorded(ledger) == []  # never forwarded
    assert len(out) == 1 and out[0].startswith(f"error {SHUTTING_DOWN}:"), (out, log)
    assert "the replica shut down" in out[0], out
    trail = rows(pg_dsn, "SELECT event, data->>'reason' FROM audit WHERE event <> 'read' ORDER BY id")
    assert [event for event, _ in trail] == ["held", "abandoned"], trail
    assert trail[-1][1] == "the replica shut down", trail


async def test_a_write_approved_by_the_person_behind_its_client_during_the_drain_runs_and_its_result_reaches_the_client(
    tmp_path: Path,
) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "human", "intent": False}, "drain_s": 120}
    async with serving(config, tmp_path) as proxy:
        url = (await proxy.line(SERVING)).group(1)

        async def person(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            # The approval is out with the client (a 2026-07-28 `input_required`): SIGTERM now.
            proxy.terminate()
            await proxy.line(OUT_WITH_CLIENT)
            return types.ElicitResult(action="accept", content={"approve": True})

        with anyio.fail_after(90):
            async with (
                httpx2.AsyncClient(timeout=60) as http,
                Client(streamable_http_client(url, http_client=http), elicitation_callback=person) as client,
            ):
                # It never listed the tools: after the result the SDK lists them to check it, a new request
                # to a replica whose drain is over, answered before it stops (before, it was refused 503).
                result = await client.call_tool("toy__record", {"value": "approved"})
            code = await proxy.wait()  # the drain ends once the call has run and answered: no second signal
    log = proxy.log()
    # The backend's words: the proxy's own leading notice (this client names no session) aside.
    theirs = result.model_copy(update={"content": result.content[own_blocks(result) :]})
    assert not result.is_error and text_of(theirs) == "recorded approved", (result, log)
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["approved"]
    assert code == 0, log
    assert "ran out" not in log, log  # the drain did not wait out its grace
    events = [line["event"] for line in read_audit(tmp_path / "state" / "audit.jsonl") if line["event"] != "read"]
    assert events[-2:] == ["verdict", "forwarded"], events
