"""MCP Apps behind the proxy: npm `@modelcontextprotocol/server-basic-vanillajs` lists `get-time` with
`_meta.ui.resourceUri` and serves its page as a `ui://` resource; the page calls the tool by its
server's own name (`callServerTool({name: "get-time"})`), which the host sends to the proxy.

The test does the host's part over MCP, as a host would: list the tools, read the page the tool
names, find in it the name the page calls, and call that name through the proxy. The tool has no
annotations, so the call is a write, held at the gate like any other.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from tests import backends
from tests.harness import proxied, stdio

pytestmark = pytest.mark.anyio

PAGE_CALL = re.compile(r'callServerTool\(\{name:"([^"]+)"')


def config(review: str) -> dict[str, Any]:
    return {"servers": {"apps": stdio(backends.basic_app())}, "review": {"default": review}}


async def test_an_apps_page_calls_its_tool_by_its_own_name_through_the_gate_and_gets_its_result(tmp_path: Path) -> None:
    async with proxied(config("allow"), tmp_path) as p:
        (tool,) = [t for t in (await p.client.list_tools()).tools if t.name == "apps__get-time"]
        meta = tool.meta or {}
        uri = meta["ui"]["resourceUri"]
        page = await p.client.read_resource(uri)
        (content,) = page.contents
        assert isinstance(content, types.TextResourceContents)
        assert content.text == backends.app_page().read_text()  # the page passes unchanged
        (own_name,) = set(PAGE_CALL.findall(content.text))
        result = await p.client.call_tool(own_name, {})
    assert own_name == "get-time"
    assert not result.is_error
    assert isinstance(result.structured_content, dict) and "time" in result.structured_content
    verdicts = [row for row in read_audit(tmp_path / "audit.jsonl") if row["event"] == "verdict"]
    assert [row["tool"] for row in verdicts] == ["apps__get-time"]  # audited under its listed name


async def test_a_call_by_its_own_name_meets_the_tools_reviewer_as_the_listed_name_does(tmp_path: Path) -> None:
    async with proxied(config("deny"), tmp_path) as p:
        by_own = await p.client.call_tool("get-time", {})
        by_listed = await p.client.call_tool("apps__get-time", {})
    assert by_own.is_error and by_listed.is_error
    assert "not executed" in str(by_own.content[0])
