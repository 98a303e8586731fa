"""`--log-format json` on the real command: every line of its log is one JSON object, and each
line about a call names the call (the id its result and its audit lines carry) and its session."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from tests.harness import toy
from tests.ops_world import SERVING, serving

pytestmark = pytest.mark.anyio

ACCEPTED = re.compile(r"\"message\": \"toy__record accepted by allow\"")


async def test_json_log_lines_about_a_call_carry_its_call_id_and_session(tmp_path: Path) -> None:
    config = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "allow", "intent": False}}
    async with serving(config, tmp_path, "--log-format", "json", "--log-level", "DEBUG") as proxy:
        with anyio.fail_after(60):
            url = (await proxy.line(SERVING)).group(1)
            async with (
                httpx2.AsyncClient(timeout=30) as http,
                Client(streamable_http_client(url, http_client=http)) as client,
            ):
                written = await client.call_tool("toy__record", {"value": "v"})
            assert written.meta is not None
            call = written.meta[CALL_META]
            await proxy.line(ACCEPTED)
            proxy.terminate()
            assert await proxy.wait() == 0
    lines = [json.loads(line) for line in "".join(proxy.lines).splitlines() if line.strip()]  # each one parses
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in lines)
    session = next(row["session"] for row in read_audit(tmp_path / "state" / "audit.jsonl") if row["call"] == call)
    about = [line for line in lines if line.get("call") == call]
    assert [line["message"] for line in about] == [
        "toy__record held for its verdict (reviewer allow)",
        "toy__record accepted by allow",
    ]
    assert {line["session"] for line in about} == {session}
    assert not [line for line in lines if "call" in line and line["call"] != call]  # no other call's id leaks in
