"""scripts/sticky_router.py in front of two real replicas on one Postgres, one of them killed.

A 2026-07-28 session the client names lives in the database, so any replica can serve it: after
`kill -9` of one replica, every later call of every named session succeeds on the survivor (the
backend's ledger and the audit rows are the ground truth). A handshake-era session lived in the
dead replica's memory: its next request is answered 503 with what to do, not a closed connection.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from tests.harness import recorded, toy
from tests.pg import replica, rows
from tests.test_store_replicas import client

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
ROUTING = re.compile(r"routing on (http://\S+)")
SESSIONS = 12
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


@contextmanager
def router(replicas: dict[str, str]) -> Iterator[str]:
    """The router as a process in front of `replicas` (name -> base URL): its base URL."""
    specs = [arg for name, base in replicas.items() for arg in ("--replica", f"{name}={base}")]
    argv = [sys.executable, str(REPO / "scripts" / "sticky_router.py"), "--listen", "127.0.0.1:0", *specs]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline().decode()
        found = ROUTING.search(line)
        assert found, line
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()


async def ready(base: str) -> list[str]:
    async with httpx.AsyncClient(timeout=5) as http:
        return list((await http.get(f"{base}/readyz")).json()["ready"])


async def legacy_session(url: str) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        answered = await http.post(url, json=INITIALIZE, headers=ACCEPT)
        assert answered.status_code == 200, answered.text
        return answered.headers["mcp-session-id"]


async def ping(url: str, session: str) -> httpx.Response:
    headers = {**ACCEPT, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(url, json={"jsonrpc": "2.0", "id": 2, "method": "ping"}, headers=headers)


async def test_named_sessions_move_to_the_surviving_replica_after_kill_9_and_every_call_succeeds(
    tmp_path: Path, pg_dsn: str
) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    names = [f"named-{n}" for n in range(SESSIONS)]
    with (
        replica(config, tmp_path, pg_dsn, "a", heartbeat=1) as a,
        replica(config, tmp_path, pg_dsn, "b", heartbeat=1) as b,
        router({"a": a.url.removesuffix("/mcp"), "b": b.url.removesuffix("/mcp")}) as base,
    ):
        url = f"{base}/mcp"
        with anyio.fail_after(240):
            while True:
                if await ready(base) == ["a", "b"]:
                    break
                await anyio.sleep(0.1)
            legacy = [await legacy_session(url) for _ in range(2)]  # in turn: one on each replica
            async with AsyncExitStack() as stack:
                clients = [await stack.enter_async_context(client(url, name)) for name in names]
                for name, c in zip(names, clients, strict=True):
                    result = await c.call_tool("toy__record", {"value": f"{name}-before"})
                    assert not result.is_error, result
                served = {r for (r,) in rows(pg_dsn, "SELECT DISTINCT replica FROM audit WHERE event = 'held'")}
                assert len(served) == 2  # the named sessions were spread over both replicas

                a.kill()
                for round_ in range(3):  # the first round runs before the router's poll has seen the death
                    for name, c in zip(names, clients, strict=True):
                        result = await c.call_tool("toy__record", {"value": f"{name}-after-{round_}"})
                        assert not result.is_error, (name, result)
                assert await ready(base) == ["b"]

            answers = [await ping(url, session) for session in legacy]
            assert sorted(answer.status_code for answer in answers) == [200, 503], [a.text for a in answers]
            (gone,) = [answer for answer in answers if answer.status_code == 503]
            assert "start a new one" in gone.json()["error"]

    wanted = [f"{name}-{when}" for when in ("before", "after-0", "after-1", "after-2") for name in names]
    assert recorded(ledger) == [json.dumps({"value": value}) for value in wanted]  # each once, in order
    forwarded = rows(pg_dsn, "SELECT count(*) FROM audit WHERE event = 'forwarded'")
    assert forwarded == [(len(wanted),)]
