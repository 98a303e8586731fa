"""Faults: huge results, notification floods, backends killed around a write, clients that vanish."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.errors import BACKEND_CLOSED, RESULT_TOO_LARGE
from tests.harness import call_error, proxied, recorded, spawned, text_of, toy
from tests.test_resilience import ToolChanges

pytestmark = pytest.mark.anyio


def toy_pids() -> list[int]:
    """The toy servers this test process started (through the in-process proxy)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"toy_server.py" in cmdline:
            found.append(int(entry))
    return found


def events(state: Path) -> list[str]:
    return [e["event"] for e in read_audit(state / "audit.jsonl")]


async def test_result_over_the_size_cap_is_withheld_with_a_clear_error(tmp_path: Path) -> None:
    cfg = {"servers": {"toy": toy(tmp_path / "rec", max_result_bytes=1_000_000)}}
    async with proxied(cfg, tmp_path / "state") as p:
        big = await call_error(p.client, "toy__big", {"size": 50_000_000})
        small = await p.client.call_tool("toy__big", {"size": 1000})
        assert text_of(await p.client.call_tool("toy__echo", {"text": "still fine"})) == "still fine"
    assert big.code == RESULT_TOO_LARGE
    assert "backend 'toy' returned too much from big" in big.message
    assert "more than max_result_bytes (1.0 MB)" in big.message
    assert len(big.message) < 1000
    assert text_of(small) == "x" * 1000


async def test_result_just_over_the_cap_is_withheld_after_reading(tmp_path: Path) -> None:
    cfg = {"servers": {"toy": toy(tmp_path / "rec", max_result_bytes=1_000_000)}}
    async with proxied(cfg, tmp_path / "state") as p:
        over = await call_error(p.client, "toy__big", {"size": 1_200_000})
    assert over.code == RESULT_TOO_LARGE
    assert "returned too much from big (1.2 MB)" in over.message


async def test_a_notification_flood_is_coalesced_and_the_proxy_keeps_serving(tmp_path: Path) -> None:
    cfg = {"servers": {"toy": toy(tmp_path / "rec", "--legacy-only")}}
    async with proxied(cfg, tmp_path / "state") as p:
        listings = 0
        set_tools = p.proxy.catalog.set_tools

        def counting(server: str, tools: Any, only: Any = None) -> None:
            nonlocal listings
            listings += 1
            set_tools(server, tools, only)

        p.proxy.catalog.set_tools = counting  # type: ignore[method-assign]
        with anyio.fail_after(60):
            flooded = await p.client.call_tool("toy__flood", {"count": 3000})
            echoed = await p.client.call_tool("toy__echo", {"text": "after the flood"})
    assert text_of(flooded) == "flooded"
    assert text_of(echoed) == "after the flood"
    assert 1 <= listings < 100  # 3000 list_changed notifications, a handful of refreshes


async def test_write_approved_while_its_backend_restarts_waits_for_it_and_runs_once(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    changes = ToolChanges()
    proxy: list[Any] = []

    async def kill_then_approve(context: Any, params: Any) -> types.ElicitResult:
        transport = proxy[0].backends.get("toy")._transport
        for pid in toy_pids():
            os.kill(pid, signal.SIGKILL)
        await transport.ended.wait()  # the proxy has seen it die: the approved write is not sent yet
        return types.ElicitResult(action="accept", content={"approve": True})

    cfg = {"servers": {"toy": toy(record)}, "review": {"default": "human"}}
    async with proxied(cfg, tmp_path / "state", elicitation=kill_then_approve, messages=changes) as p:
        proxy.append(p.proxy)
        written = await p.client.call_tool("toy__record", {"value": "v", "intent": "x"})
        restarts = p.proxy.backends.get("toy").restarts
    # Nothing was sent to the dead process; the write waited for the new one, which ran it once.
    assert text_of(written) == "recorded v"
    assert recorded(record) == ['{"value": "v"}']
    assert restarts == 1 and changes.count == 0  # its tools stayed listed throughout
    audit = [e for e in read_audit(tmp_path / "state" / "audit.jsonl") if e["event"] != "read"]
    assert [e["event"] for e in audit] == ["held", "verdict", "forwarded"]
    assert audit[1]["accepted"] is True and audit[2]["is_error"] is False


async def test_backend_killed_while_a_write_is_in_flight_is_not_retried(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    changes = ToolChanges()
    cfg = {"servers": {"toy": toy(record)}, "review": {"default": "allow"}}
    async with proxied(cfg, tmp_path / "state", messages=changes) as p:
        error = await call_error(p.client, "toy__record_then_crash", {"value": "once", "intent": "x"})
        assert error.code == BACKEND_CLOSED
        assert error.message == (
            "backend 'toy' closed its connection during tools/call record_then_crash, before answering,"
            " so it may have run; the proxy restarts it"
        )
        # The backend comes back (a call waits for it); the write that failed is not replayed to it.
        assert text_of(await p.client.call_tool("toy__echo", {"text": "back"})) == "back"
        assert p.proxy.backends.get("toy").restarts == 1
    assert recorded(record) == ['{"value": "once"}']  # done once by the backend, never again by us


async def test_client_that_disconnects_while_its_write_is_held_abandons_it(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    asked = anyio.Event()

    async def walk_away(context: Any, params: Any) -> types.ElicitResult:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    cfg = {"servers": {"toy": toy(record)}, "review": {"default": "human"}}
    async with spawned(cfg, tmp_path, elicitation=walk_away) as client, anyio.create_task_group() as tg:
        tg.start_soon(client.call_tool, "toy__record", {"value": "v", "intent": "x"})
        await asked.wait()
        tg.cancel_scope.cancel()  # leaving the block closes the client: the proxy's stdin ends
    # The proxy wrote "abandoned" while it shut down; nothing reached the backend.
    assert events(tmp_path / "state")[-1] == "abandoned"
    assert recorded(record) == []
