"""A default start is quiet: the shipped servers.yaml, served over stdio to an MCP client with its real
backends (the filesystem, git and time servers) all present, logs what it serves and nothing that
looks like trouble — no WARNING, no ERROR, no traceback, no exception text — in list mode and in
search mode (which loads FAISS, whose loader reports each CPU build it could not import).

The filesystem server is the shipped one started from the local install instead of through npx
(which would download it); every other line of the shipped file is as it ships.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp_spec_proxy.backends import connection
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests import backends
from tests.harness import PROXY_COMMAND, proxy_env

REPO = Path(__file__).resolve().parent.parent
TROUBLE = (" WARNING ", " ERROR ", " CRITICAL ", "Traceback", "Error(", "Exception")


def shipped(tmp_path: Path, **extra: Any) -> Path:
    data = yaml.safe_load((REPO / "servers.yaml").read_text(encoding="utf-8"))
    fs = data["servers"]["fs"]
    local = backends.filesystem(Path("unused"))
    fs["command"], fs["args"] = local.command, [local.args[0], fs["args"][-1]]  # the root stays ${PROXY_ROOT:-.}
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump({**data, **extra}), encoding="utf-8")
    return path


async def serve_and_use(config: Path, root: Path, stderr: Path, search: bool) -> list[str]:
    env = {
        **proxy_env(),
        "PROXY_ROOT": str(root),
        "PATH": f"{backends.PY_MODERN / 'bin'}{os.pathsep}{os.environ['PATH']}",  # mcp-server-git, -time
    }
    params = StdioServerParameters(
        command=PROXY_COMMAND, args=["--config", str(config), "--state-dir", str(root.parent / "state")], env=env
    )
    with stderr.open("w", encoding="utf-8") as errlog, anyio.fail_after(120):
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = [tool.name for tool in (await session.list_tools()).tools]
            if search:
                found = await session.call_tool("search_tools", {"query": "current time in a timezone"})
                assert not found.is_error, found
            else:
                now = await session.call_tool("time__get_current_time", {"timezone": "UTC"})
                assert not now.is_error, now
    return names


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["list", "search"])
async def test_a_start_with_the_shipped_config_logs_no_warning_and_no_traceback(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    await anyio.run_process(["git", "init", "-q", str(root)])
    config = shipped(tmp_path, catalog={"mode": mode})
    stderr = tmp_path / "stderr.txt"

    names = await serve_and_use(config, root, stderr, search=mode == "search")

    said = stderr.read_text(encoding="utf-8")
    assert "serving " in said and "from fs, git, time" in said, said  # the backends all came up, and it said so
    if mode == "list":
        assert {name.split("__")[0] for name in names} == {"fs", "git", "time"}
    else:
        assert "search_tools" in names
    assert "waiting for an MCP client" not in said  # a client, not a person, is on stdin
    trouble = [line for line in said.splitlines() if any(mark in line for mark in TROUBLE)]
    assert trouble == [], said


class Records(logging.Handler):
    """Every record of one logger, and an event once `enough` retries were scheduled."""

    def __init__(self, enough: int) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.enough = enough
        self.retried = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if sum("reconnecting in" in r.msg for r in self.records) >= self.enough:
            self.retried.set()


@pytest.mark.anyio
async def test_a_backend_said_to_be_retried_quietly_logs_nothing_more_at_the_default_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "BACKOFF_START", 0.001)  # the schedule, shrunk
    monkeypatch.setattr(connection, "BACKOFF_MAX", 0.002)
    monkeypatch.setattr(connection, "BACKOFF_MAX_UNCHANGED", 0.004)
    heard = Records(enough=6)
    log = logging.getLogger(connection.__name__)
    log.addHandler(heard)
    level = log.level
    log.setLevel(logging.DEBUG)  # setLevel, not the attribute: it clears the cached isEnabledFor answers
    config = ProxyConfig.model_validate({"servers": {"calc": {"command": "quiet-start-missing"}}})
    try:
        with anyio.fail_after(30):
            async with running_proxy(config, StatePaths(tmp_path / "state")):
                await heard.retried.wait()
    finally:
        log.removeHandler(heard)
        log.setLevel(level)
    said = [r.getMessage() for r in heard.records if r.levelno >= logging.INFO]  # what serving shows

    assert len(said) == 1, said
    assert "saying so again only if the failure changes" in said[0]
