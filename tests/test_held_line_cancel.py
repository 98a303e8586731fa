"""A write cancelled while its `held` line is being written is still settled on the audit trail.

The trail is the real `AuditLog`. In one case its disk stalls on the `held` line (a loaded disk);
in the other the line is on disk and the answer is slow to come back, as a Postgres INSERT that
committed while its client's await was still waiting on the network. Either way the client goes
away in the middle of it: the call must end `abandoned`, never `held` for ever on a live replica,
and never run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import AuditLog
from mcp_spec_proxy.calls.results import text_result
from mcp_spec_proxy.tools.catalog import CatalogTool
from tests.ops_world import until
from tests.test_drain_gate import SlowLine, _gate, _lines, _NoUser

pytestmark = pytest.mark.anyio


class SlowAnswer:
    """The real log, whose `held` line is written at once and whose answer then waits for `release`."""

    def __init__(self, path: Path) -> None:
        self.inner = AuditLog(path)
        self.committed = anyio.Event()
        self.release = anyio.Event()

    async def record(self, kind: str, **fields: Any) -> None:
        await self.inner.record(kind, **fields)
        if kind == "held":
            self.committed.set()
            await self.release.wait()  # the row is in; its answer is on its way back

    def note(self, kind: str, **fields: Any) -> None:
        self.inner.note(kind, **fields)

    def later(self, kind: str, **fields: Any) -> None:
        self.inner.later(kind, **fields)

    async def claim(self, session: str, key: str, call: str) -> str | None:
        return await self.inner.claim(session, key, call)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("where", ["the answer is slow", "the disk stalls"])
async def test_a_write_cancelled_while_its_held_line_is_written_is_abandoned_and_never_runs(
    tmp_path: Path, where: str
) -> None:
    path = tmp_path / "audit.jsonl"
    ran: list[str] = []

    async def executor(tool: CatalogTool, arguments: dict[str, Any], report: Any) -> types.CallToolResult:
        ran.append(tool.name)
        return text_result("ran")

    slow_answer = SlowAnswer(path) if where == "the answer is slow" else None
    stalled_disk = SlowLine(path, "held") if slow_answer is None else None
    sink = slow_answer or stalled_disk
    assert sink is not None
    gate, call = _gate(sink)  # type: ignore[arg-type]  # an AuditSink: SlowAnswer wraps the real log
    with anyio.fail_after(30):
        async with anyio.create_task_group() as client:
            client.start_soon(lambda: gate.write(call, _NoUser(), executor=executor))
            if slow_answer is not None:
                await slow_answer.committed.wait()
            else:
                assert stalled_disk is not None
                await until(stalled_disk.stalled.is_set)
            client.cancel_scope.cancel()  # the client goes away while its `held` line is written
            if slow_answer is not None:
                slow_answer.release.set()
            else:
                assert stalled_disk is not None
                stalled_disk.release.set()
    sink.close()
    assert _lines(path) == [("held", ""), ("abandoned", "the client cancelled or disconnected")]
    assert ran == []
