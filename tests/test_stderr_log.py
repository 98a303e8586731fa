"""A backend that floods stderr cannot fill the disk: `logs/<server>.log` is capped and rotated.

Ground truth is the files themselves, read once the proxy has stopped: their sizes, and the
numbered lines the hostile backend (`fixtures/raw_server.py`, `shout`) wrote — the newest must be
in `<server>.log`, and the lines kept must run on without a gap from `<server>.log.1` into it.
The flood goes through the proxy's in-process pool and through the real command, whose stdio
servers are spawned at launch (`prespawn.py`) before the pool adopts them.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from mcp_spec_proxy.observe.stderr_log import KEEP, MAX_BYTES
from tests.harness import proxied, spawned, text_of

pytestmark = pytest.mark.anyio

RAW_SERVER = Path(__file__).parent / "fixtures" / "raw_server.py"
FLOOD = 3 * MAX_BYTES + 1_000_000  # enough to rotate past every file kept
SLACK = 65536  # one pipe chunk: the most a file may pass the cap by


def flooding(**env: str) -> dict[str, Any]:
    server = {"command": sys.executable, "args": [str(RAW_SERVER)], "env": {"RAW_SHOUT_BYTES": str(FLOOD), **env}}
    return {"servers": {"raw": server}, "review": {"default": "deny"}}


def assert_capped_and_newest_kept(logs: Path) -> None:
    current = logs / "raw.log"
    kept = [logs / f"raw.log.{n}" for n in range(KEEP, 0, -1)] + [current]
    assert all(path.exists() for path in kept)
    assert not (logs / f"raw.log.{KEEP + 1}").exists()  # the oldest was dropped, not kept beside
    assert all(path.stat().st_size <= MAX_BYTES + SLACK for path in kept), [p.stat().st_size for p in kept]
    lines = [line for path in kept for line in path.read_text().splitlines()]
    assert lines[-1] == "LAST"  # the newest line is in <server>.log
    numbers = [int(line.split()[1]) for line in lines[:-1] if line.startswith("line ")]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # no line lost, none cut
    assert all(line.startswith("line ") for line in lines[:-1])


async def test_a_backend_flooding_stderr_during_a_call_is_answered_and_its_log_stays_capped(tmp_path: Path) -> None:
    async with proxied(flooding(), tmp_path / "state") as p:
        result = await p.client.call_tool("raw__shout", {})  # the backend is not blocked on its stderr
    assert text_of(result) == "shouted"
    assert_capped_and_newest_kept(tmp_path / "state" / "logs")
    # The proxy's end of the pipe closed with the connection, though shutdown cancels it: the
    # thread that kept the log saw the end and is gone, nothing of it left behind.
    assert not [thread for thread in threading.enumerate() if thread.name == "stderr of raw"]


async def test_a_server_spawned_at_launch_that_floods_stderr_keeps_a_capped_log(tmp_path: Path) -> None:
    # The command spawns stdio servers before the SDK is imported (`prespawn.py`): the same cap holds.
    async with spawned(flooding(RAW_SHOUT_AT_START="1", RAW_SHOUT_BYTES=str(FLOOD)), tmp_path) as client:
        result = await client.call_tool("raw__shout", {})
    assert text_of(result) == "shouted"
    logs = tmp_path / "state" / "logs"
    assert_capped_and_newest_kept(logs)
    assert (logs / "raw.log").read_text().count("LAST") == 1  # the call's flood, after the start's
