"""The audit log's writer (`jsonl.JsonLines`): group commit, and what a cancelled writer leaves behind.

Ground truth: the lines on disk, and whether every writer whose line was queued returns.
"""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import pytest

from mcp_spec_proxy.calls.audit import AuditLog, read_audit
from mcp_spec_proxy.errors import StateError

pytestmark = pytest.mark.anyio


async def test_concurrent_records_all_land_once_each(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")

    async def held(n: int) -> None:
        await log.record("held", call=n)

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(held, n)
    log.close()
    assert sorted(event["call"] for event in read_audit(tmp_path / "audit.jsonl")) == list(range(50))


async def test_a_writer_cancelled_mid_commit_still_writes_the_lines_queued_behind_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first writer commits for everyone queued while its write runs. When its caller is
    # cancelled then (the client closed stdin: the SDK cancels every request in flight), the
    # lines queued behind it must still be written and their writers released. Before, the next
    # batch was taken off the queue and the thread hop refused it at its first checkpoint: those
    # writers waited forever, among them the gate's shielded `abandoned` line, and the proxy
    # never exited once its client left.
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    writing, release = threading.Event(), threading.Event()
    append = log._append  # pyright: ignore[reportPrivateUsage]

    def slow_append(lines: list[str]) -> None:  # the disk, slow under load
        writing.set()
        release.wait()
        append(lines)

    monkeypatch.setattr(log, "_append", slow_append)
    behind_returned = anyio.Event()

    async def behind() -> None:
        await log.record("abandoned", call="b")
        behind_returned.set()

    async with anyio.create_task_group() as everyone:
        async with anyio.create_task_group() as first:
            first.start_soon(lambda: log.record("held", call="a"))
            await anyio.to_thread.run_sync(writing.wait)  # the first commit's write is under way
            everyone.start_soon(behind)
            await anyio.wait_all_tasks_blocked()  # `behind` queued its line and waits for it
            first.cancel_scope.cancel()
            release.set()
        # The cancelled writer has returned: what was queued behind it is on disk.
        assert [event["call"] for event in read_audit(path)] == ["a", "b"]
        await behind_returned.wait()
    log.close()


async def test_a_write_that_fails_unexpectedly_fails_its_writers_instead_of_leaving_them_waiting(
    tmp_path: Path,
) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    handle = (tmp_path / "audit.jsonl").open("a")
    handle.close()
    log._handle = handle  # closed under it: writing raises ValueError, not OSError
    with anyio.fail_after(10), pytest.raises(StateError, match="cannot append to"):
        await log.record("held", call=1)
