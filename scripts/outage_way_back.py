"""How long a replica takes to come back after its database was away, by the outage's length.

    .venv/bin/python scripts/outage_way_back.py [--dsn postgresql://...] [--outage 30 --outage 90]

One replica (`mcp-spec-proxy --http`, `store: postgres`, the toy backend, writes allowed) serves a
named 2026-07-28 session. For each outage length the database refuses connections and cuts the open
ones (as a server or a network that fails) for that long, with no traffic meanwhile; then it takes
connections again, and the client tries a write and a read every quarter second. Printed per
outage: the seconds from the database's return to the first write that ran (the backend's ledger
says so) and to the first read shared again (its row is in `session_steps`: another replica's
reviewer would see it). Ground truth is the ledger and the database, never the replica's word.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test setup's Postgres helpers and toy backend live in tests/

import anyio  # noqa: E402  # after the path: run as a script, the repository root is not on it
import httpx2  # noqa: E402
from mcp import Client, MCPError  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from tests.harness import recorded, toy  # noqa: E402
from tests.pg import (  # noqa: E402
    database_down,
    database_name,
    database_up,
    embedded_postgres,
    fresh_database,
    replica,
    rows,
)

TRY_EVERY_S = 0.25
GIVE_UP_S = 400.0


async def way_back(url: str, dsn: str, admin: str, ledger: Path, outage_s: float) -> tuple[float | None, float | None]:
    """Seconds from the database's return to the first write that ran and the first read shared
    (None: not within `GIVE_UP_S`)."""
    name = database_name(dsn)
    session = f"outage-{uuid.uuid4().hex[:8]}"
    async with (
        httpx2.AsyncClient(headers={"Mcp-Spec-Proxy-Session": session}, timeout=60) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        await client.call_tool("toy__echo", {"text": "warm"})
        database_down(admin, name)
        await anyio.sleep(outage_s)
        database_up(admin, name)
        back = time.monotonic()
        wrote: float | None = None
        shared: float | None = None
        with anyio.move_on_after(GIVE_UP_S):
            while wrote is None or shared is None:
                tried = time.monotonic()
                value = f"v-{uuid.uuid4().hex[:8]}"
                if wrote is None:
                    with contextlib.suppress(MCPError):  # refused: the audit trail does not take it yet
                        await client.call_tool("toy__record", {"value": value})
                    if json.dumps({"value": value}) in recorded(ledger):
                        wrote = time.monotonic() - back
                if shared is None:
                    await client.call_tool("toy__echo", {"text": value})
                    found = rows(dsn, "SELECT 1 FROM session_steps WHERE step->'arguments'->>'text' = %s", (value,))
                    if found:
                        shared = time.monotonic() - back
                await anyio.sleep(max(0.0, TRY_EVERY_S - (time.monotonic() - tried)))
    return wrote, shared


def measure(admin: str, home: Path, outages: list[float]) -> None:
    for outage_s in outages:
        dsn = fresh_database(admin)
        ledger = home / f"ledger-{outage_s:g}"
        config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
        with replica(config, home, dsn, f"r-{outage_s:g}") as running:
            wrote, shared = anyio.run(way_back, running.url, dsn, admin, ledger, outage_s)
        print(
            f"outage {outage_s:5.0f} s: first write ran {seconds(wrote)} after the database was back,"
            f" first read shared {seconds(shared)} after",
            flush=True,
        )


def seconds(value: float | None) -> str:
    return f"not within {GIVE_UP_S:.0f} s" if value is None else f"{value:5.1f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="a maintenance DSN of a server with pgvector (default: an embedded one)")
    parser.add_argument("--outage", type=float, action="append", help="seconds away (repeatable; default 30, 90)")
    args = parser.parse_args()
    outages = args.outage or [30.0, 90.0]
    home = Path(tempfile.mkdtemp(prefix="mcp-spec-proxy-outage-"))
    try:
        if args.dsn:
            measure(args.dsn, home, outages)
        else:
            with embedded_postgres(home / "pgdata") as admin:
                measure(admin, home, outages)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
