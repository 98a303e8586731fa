"""A replay refused while its key's call waits behind an earlier write of its session names a call
the audit trail already knows.

A session's writes are settled one at a time: a keyed write sent while another is held for a person
waits for that one before it is held itself, so it has no `held` line yet. A replay of it meanwhile
is refused naming it ("still running; `mcp-spec-proxy audit` shows its outcome") — and used to name
a call the trail had never heard of. The keyed write now has a `queued` line before it waits, and a
replay is told of it only once that line is on the trail. The toy's ledger is the ground truth of
what ran; the audit file is read at the moment the refusal arrives.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import MCPError

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import FIRST_META
from mcp_spec_proxy.errors import CALL_REPLAYED
from mcp_spec_proxy.fronts.replays import KEY_META
from tests.harness import recorded, request_meta
from tests.test_call_ids import call_of, held_until, served, world

pytestmark = pytest.mark.anyio


async def test_a_replay_of_a_queued_keyed_write_names_a_call_already_on_the_trail_and_the_write_runs_once(
    tmp_path: Path,
) -> None:
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    release, asked = anyio.Event(), [anyio.Event(), anyio.Event(), anyio.Event()]
    meta = request_meta({KEY_META: "order-21"})
    async with served(world(ledger, "human"), state, elicitation=held_until(release, asked)) as (client, _, _):
        earlier: list[types.CallToolResult] = []
        keyed: list[types.CallToolResult] = []
        refused: list[MCPError] = []
        seen: list[list[str]] = []  # the audit's call ids at the moment of each refusal
        one_refused = anyio.Event()

        async def held_first() -> None:
            earlier.append(await client.call_tool("toy__record", {"value": "earlier"}))

        async def keyed_write() -> None:
            try:
                keyed.append(await client.call_tool("toy__record", {"value": "pay"}, meta=meta))
            except MCPError as exc:
                seen.append([str(line.get("call")) for line in read_audit(state / "audit.jsonl")])
                refused.append(exc)
                one_refused.set()

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(held_first)
                await asked[0].wait()  # the earlier write is held for the person: the session's writes wait
                tg.start_soon(keyed_write)
                tg.start_soon(keyed_write)  # its replay, while it waits behind the earlier write
                await one_refused.wait()
                release.set()
    [refusal] = refused
    [ran] = keyed
    error = refusal.error
    assert error.code == CALL_REPLAYED and "still running" in error.message, error
    assert isinstance(error.data, dict) and error.data[FIRST_META] == call_of(ran)
    assert call_of(ran) in seen[0]  # on the trail when the refusal was sent, not only later
    assert recorded(ledger) == ['{"value": "earlier"}', '{"value": "pay"}']  # the keyed write ran once
    lines = [line["event"] for line in read_audit(state / "audit.jsonl") if line.get("call") == call_of(ran)]
    assert lines[0] == "queued" and "held" in lines and lines[-1] == "forwarded", lines
    assert not asked[2].is_set()  # the refused replay was never shown to the person
    assert earlier and not earlier[0].is_error
