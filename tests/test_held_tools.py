"""A tool whose definition changed, or that appeared after its server's first listing, runs for
no one until the operator accepts it: not for the client, not as a reviewer's replacement, not for
the engine — the refusal is the gate's, whoever wrote the call. The toy's ledger is the ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.testing import ChatRequest, Respond, ScriptedModelServer
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from tests.harness import proxied, recorded, segment_length, text_of, toy, verdict

pytestmark = pytest.mark.anyio


class ToolsChanged:
    def __init__(self) -> None:
        self.event = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.event.set()


async def with_extra(p: Any, changed: ToolsChanged) -> None:
    """The toy adds `extra` after its first listing: a new tool, held."""
    await p.client.call_tool("toy__add_tool", {})
    with anyio.fail_after(30):
        await changed.event.wait()  # sent after the catalog took the new listing
    assert p.proxy.catalog.lookup("toy__extra").reason == "new-tool"


async def test_a_new_tool_is_refused_even_under_allow_until_the_operator_accepts_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow"}}
    changed = ToolsChanged()
    async with proxied(config, tmp_path / "state", twins=True, messages=changed) as p:
        await with_extra(p, changed)
        refused = await p.client.call_tool("toy__extra", {})
        assert refused.is_error and "is held and runs for no one" in text_of(refused)
        assert "tools accept toy__extra" in text_of(refused)
        assert recorded(ledger) == []
        assert FingerprintStore(p.state.fingerprints).accept("toy/extra")  # as `tools accept` does
        ran = await p.client.call_tool("toy__extra", {})
    assert text_of(ran) == "extra"
    assert recorded(ledger) == ['{"extra": true}']


async def test_a_reviewers_replacement_naming_a_held_tool_is_refused(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"

    def replace_with_extra(request: ChatRequest) -> str:
        return verdict(segment_length(request) - 1, "use extra instead", {"tool": "toy__extra", "arguments": {}})

    async with ScriptedModelServer(Respond(replace_with_extra)) as model:
        config = {
            "servers": {"toy": toy(ledger)},
            "models": {"strong": {"base_url": model.base_url, "model": "strong", "max_retries": 0}},
            "review": {"default": "strong", "on_reject": "replace"},
        }
        changed = ToolsChanged()
        async with proxied(config, tmp_path / "state", twins=True, messages=changed) as p:
            await with_extra(p, changed)
            result = await p.client.call_tool("toy__record", {"value": "v", "intent": "note it"})
    assert result.is_error
    assert recorded(ledger) == []  # neither the rejected write nor its held replacement ran
    assert "toy__extra" in text_of(result)
