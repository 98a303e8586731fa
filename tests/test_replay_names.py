"""A replay refused while an earlier call with its key is still running names the call that holds
the key — the one whose audit lines say what became of it — not a replay.

Across replicas the front's memory of keyed calls is each replica's own: a replica that never saw
the first call (it ran on another) takes a replay of it for a first call, and holds it for review
until the gate's claim refuses it. A second replay reaching that replica meanwhile used to be told
"call <the first replay> is still running" — a call that would itself be refused, and that holds
no claim. It is told the call that holds the key at the gate. The store is the one every replica
would share; the other replica is this one's front with its memory wiped after the first call ran.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import MCPError
from mcp.client.session import ElicitationFnT

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import FIRST_META
from mcp_spec_proxy.errors import CALL_REPLAYED
from mcp_spec_proxy.fronts.replays import KEY_META, Replays
from tests.harness import recorded, request_meta
from tests.test_call_ids import call_of, served, world

pytestmark = pytest.mark.anyio


def person(go: anyio.Event, shown: list[anyio.Event]) -> ElicitationFnT:
    """Approves the first call shown at once, and each later one once `go` is set; `shown[n]` is set as call n is."""
    count = 0

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        nonlocal count
        shown[count].set()
        count += 1
        if count > 1:
            await go.wait()
        return types.ElicitResult(action="accept", content={"approve": True})

    return answer


async def test_a_replay_refused_while_another_replay_is_held_names_the_call_that_holds_the_key(tmp_path: Path) -> None:
    ledger, state = tmp_path / "ledger", tmp_path / "state"
    go, shown = anyio.Event(), [anyio.Event(), anyio.Event(), anyio.Event()]
    meta = request_meta({KEY_META: "order-11"})
    async with served(world(ledger, "human"), state, elicitation=person(go, shown)) as (client, front, _):
        first = await client.call_tool("toy__record", {"value": "pay"}, meta=meta)  # it runs, and holds the key
        front.replays = Replays()  # another replica: its front never saw the first call
        held_there: list[types.CallToolResult | MCPError] = []

        async def replay_held_for_review() -> None:
            try:
                held_there.append(await client.call_tool("toy__record", {"value": "pay"}, meta=meta))
            except MCPError as exc:
                held_there.append(exc)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(replay_held_for_review)
                await shown[1].wait()  # that replay is held for the person there
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("toy__record", {"value": "pay"}, meta=meta)
                go.set()
    assert recorded(ledger) == ['{"value": "pay"}']  # the key's write ran once
    assert not shown[2].is_set()  # the refused replay was never shown to the person
    error = refused.value.error
    assert error.code == CALL_REPLAYED and isinstance(error.data, dict)
    assert error.data[FIRST_META] == call_of(first), error  # the call that holds the key, not the held replay
    assert call_of(first) in error.message
    [replay] = held_there
    assert isinstance(replay, MCPError) and isinstance(replay.error.data, dict)
    assert replay.error.data[FIRST_META] == call_of(first)  # the held replay is refused at its forward
    held = {line["call"] for line in read_audit(state / "audit.jsonl") if line["event"] == "held"}
    assert call_of(first) in held  # the call named has its audit lines
