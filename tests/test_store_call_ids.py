"""Call ids and idempotency keys on the Postgres store, across two real replicas (`mcp-spec-proxy
--http` processes): the database refuses a `forwarded` row once, and a key is replayed on the
other replica, one after the other and at once. Ground truth: the toy's ledger and the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import psycopg
import pytest
from mcp import MCPError

from mcp_spec_proxy.calls.results import AUDIT_META, CALL_META, FIRST_META
from mcp_spec_proxy.errors import CALL_REPLAYED
from mcp_spec_proxy.fronts.replays import KEY_META
from tests.harness import recorded, text_of, toy
from tests.pg import replica, rows
from tests.test_store_replicas import client

pytestmark = pytest.mark.anyio

# The first `forwarded` row the database is asked for fails (a sequence: not rolled back with it).
REFUSE_FIRST_FORWARDED = """
CREATE SEQUENCE refusals;
CREATE FUNCTION refuse_first_forwarded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.event = 'forwarded' AND nextval('refusals') = 1 THEN
    RAISE EXCEPTION 'injected: the audit table refuses this row';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_first_forwarded BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION refuse_first_forwarded();
"""


def world(ledger: Path) -> dict[str, Any]:
    return {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}


async def test_a_forwarded_row_the_database_refuses_leaves_the_real_result_and_is_written_late(
    tmp_path: Path, pg_dsn: str
) -> None:
    ledger = tmp_path / "ledger"
    with replica(world(ledger), tmp_path, pg_dsn, "a") as a:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(REFUSE_FIRST_FORWARDED)
        with anyio.fail_after(90):
            async with client(a.url, "agent-1") as on_a:
                ran = await on_a.call_tool("toy__record", {"value": "once"})
                assert ran.meta is not None
                call = ran.meta[CALL_META]
                # Each read wakes the replica's batch writer, which writes the kept row with it.
                while not rows(pg_dsn, "SELECT 1 FROM audit WHERE call = %s AND event = 'forwarded'", (call,)):
                    await on_a.call_tool("toy__echo", {"text": "tick"})
    assert not ran.is_error, text_of(ran)
    assert "the backend ran this call" in ran.meta[AUDIT_META]
    assert recorded(ledger) == ['{"value": "once"}']
    events = rows(pg_dsn, "SELECT event, data->>'late' FROM audit WHERE call = %s ORDER BY id", (call,))
    assert events == [("held", None), ("verdict", None), ("forwarded", "true")]


@pytest.mark.parametrize("together", [False, True], ids=["one-after-the-other", "at-once"])
async def test_a_key_replayed_on_another_replica_runs_once(tmp_path: Path, pg_dsn: str, together: bool) -> None:
    ledger = tmp_path / "ledger"
    meta = {KEY_META: "order-1"}
    outcomes: list[types.CallToolResult | MCPError] = []
    with replica(world(ledger), tmp_path, pg_dsn, "a") as a, replica(world(ledger), tmp_path, pg_dsn, "b") as b:
        with anyio.fail_after(90):
            async with client(a.url, "agent-2") as on_a, client(b.url, "agent-2") as on_b:

                async def call(on: Any) -> None:
                    try:
                        outcomes.append(await on.call_tool("toy__record", {"value": "pay"}, meta=meta))
                    except MCPError as exc:
                        outcomes.append(exc)

                if together:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(call, on_a)
                        tg.start_soon(call, on_b)
                else:
                    await call(on_a)
                    await call(on_b)
    assert recorded(ledger) == ['{"value": "pay"}']
    ran = [o for o in outcomes if isinstance(o, types.CallToolResult)]
    refused = [o.error for o in outcomes if isinstance(o, MCPError)]
    assert len(ran) == 1 and len(refused) == 1, outcomes
    assert refused[0].code == CALL_REPLAYED and isinstance(refused[0].data, dict)
    assert ran[0].meta is not None and refused[0].data[FIRST_META] == ran[0].meta[CALL_META]
    assert rows(pg_dsn, "SELECT count(*) FROM audit WHERE event = 'forwarded'") == [(1,)]
