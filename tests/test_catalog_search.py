"""Search mode (`catalog: {mode: search}`): the client finds tools by words and calls them through
`call_tool` — and every call still meets the one write gate, exactly as a direct `tools/call`.

Ground truth is the toy backend's ledger (the writes it really ran) and the audit log; the client
is a real MCP client of each protocol era.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts import catalog_search
from mcp_spec_proxy.leash.encoders import EncoderError, EncoderInfo, StepView
from mcp_spec_proxy.testing import Reply, Respond, ScriptedModelServer
from mcp_spec_proxy.tools.catalog import INTENT_ARGUMENT, INTENT_SCHEMA, Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from mcp_spec_proxy.tools.lookalikes import preference
from mcp_spec_proxy.tools.search import ToolIndex
from tests.harness import ERAS, approve, proxied, recorded, spawned, text_of, toy

pytestmark = pytest.mark.anyio


def config(record: Path, review: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "servers": {"toy": toy(record)},
        "review": review or {"default": "human"},
        "catalog": {"mode": "search"},
        **extra,
    }


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return read_audit(path) if path.exists() else []


def found(result: types.CallToolResult) -> list[dict[str, Any]]:
    assert not result.is_error, text_of(result)
    hits: list[dict[str, Any]] = json.loads(text_of(result))["tools"]
    return hits


async def search(client: Any, query: str, **more: Any) -> list[dict[str, Any]]:
    return found(await client.call_tool("search_tools", {"query": query, **more}))


class Changed:
    """Set when the proxy's catalog took a new tool listing."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    async def __call__(self, what: str) -> None:
        if what == "tools":
            self.event.set()


@pytest.mark.parametrize("mode", ERAS)
async def test_the_client_lists_the_meta_tools_and_search_finds_a_tool_with_effect_server_and_schema(
    tmp_path: Path, mode: str
) -> None:
    models = {"strong": {"base_url": "http://127.0.0.1:9/v1", "model": "unused"}}
    async with proxied(config(tmp_path / "rec", models=models), tmp_path / "state", twins=True, mode=mode) as p:
        listed = [tool.name for tool in (await p.client.list_tools()).tools]
        writes = await search(p.client, "append a value to the record file")
        reads = await search(p.client, "echo my text back to me", limit=2)

    assert listed == ["search_tools", "call_tool", "delegate"]  # own tools are listed as before
    assert writes[0]["name"] == "toy__record"
    assert (writes[0]["server"], writes[0]["effect"]) == ("toy", "write")
    schema = writes[0]["inputSchema"]
    assert schema["properties"][INTENT_ARGUMENT] == INTENT_SCHEMA and INTENT_ARGUMENT not in schema["required"]
    assert len(reads) <= 2 and reads[0]["name"] == "toy__echo"
    assert reads[0]["effect"] == "read" and INTENT_ARGUMENT not in reads[0]["inputSchema"]["properties"]


@pytest.mark.parametrize("mode", ERAS)
async def test_call_runs_a_read_at_once_and_audits_it_under_the_real_tool(tmp_path: Path, mode: str) -> None:
    async def must_not_ask(context: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("a read was sent for review")

    async with proxied(
        config(tmp_path / "rec"), tmp_path / "state", twins=True, mode=mode, elicitation=must_not_ask
    ) as p:
        result = await p.client.call_tool("call_tool", {"name": "toy__echo", "arguments": {"text": "hello"}})

    assert not result.is_error and text_of(result) == "hello"
    assert [(e["event"], e["tool"]) for e in audit(tmp_path / "state")] == [("read", "toy__echo")]


@pytest.mark.parametrize("mode", ERAS)
async def test_call_of_a_denied_tool_never_runs(tmp_path: Path, mode: str) -> None:
    record = tmp_path / "rec"
    cfg = config(record, {"default": "allow"})
    cfg["servers"] = {"toy": toy(record, tools={"overrides": {"record": {"review": "deny"}}})}
    async with proxied(cfg, tmp_path / "state", twins=True, mode=mode) as p:
        arguments = {"value": "x", "intent": "the user asked for it"}
        result = await p.client.call_tool("call_tool", {"name": "toy__record", "arguments": arguments})

    assert result.is_error and "Blocked at the write barrier" in text_of(result)
    assert recorded(record) == []
    story = audit(tmp_path / "state")
    assert [e["event"] for e in story] == ["held", "verdict", "blocked"]
    assert len({e["call"] for e in story}) == 1  # one story, one call id
    assert [(e["tool"], e["reviewer"]) for e in story[:2]] == [("toy__record", "deny")] * 2


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize("answer", [True, False])
async def test_call_of_a_human_tool_asks_the_user_and_runs_only_if_approved(
    tmp_path: Path, mode: str, answer: bool
) -> None:
    record = tmp_path / "rec"
    asked: list[str] = []
    approval = approve(answer, "not that one")

    async def ask(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        asked.append(params.message)
        return await approval(context, params)

    async with proxied(config(record), tmp_path / "state", twins=True, mode=mode, elicitation=ask) as p:
        arguments = {"value": "v1", "intent": "the user asked to record v1"}
        result = await p.client.call_tool("call_tool", {"name": "toy__record", "arguments": arguments})

    assert len(asked) == 1 and "toy__record" in asked[0] and "the user asked to record v1" in asked[0]
    assert bool(result.is_error) is not answer, text_of(result)
    assert recorded(record) == (['{"value": "v1"}'] if answer else [])  # intent stripped, as for a direct call
    events = [e["event"] for e in audit(tmp_path / "state")]
    assert events[-2:] == ["verdict", "forwarded" if answer else "blocked"]
    assert {e["tool"] for e in audit(tmp_path / "state") if "tool" in e} == {"toy__record"}


@pytest.mark.parametrize("mode", ERAS)
async def test_unknown_and_held_tools_are_refused_with_a_clear_error(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(catalog_search, "ACCEPT_RECHECK_S", 0.0)  # reread `tools accept` at every search
    changed = Changed()
    async with proxied(config(tmp_path / "rec", {"default": "allow"}), tmp_path / "state", twins=True, mode=mode) as p:
        p.proxy.listeners.append(changed)
        unknown = await p.client.call_tool("call_tool", {"name": "toy__nope", "arguments": {}})
        assert (await search(p.client, "echo the text back"))[0]["name"] == "toy__echo"
        # The backend rewrites echo's description: the changed definition is held until accepted.
        await p.client.call_tool("call_tool", {"name": "toy__rug_pull", "arguments": {}})
        with anyio.fail_after(30):
            await changed.event.wait()
        hits = await search(p.client, "echo the text back")
        through_search = await p.client.call_tool("call_tool", {"name": "toy__echo", "arguments": {"text": "hi"}})
        direct = await p.client.call_tool("toy__echo", {"text": "hi"})

        FingerprintStore(p.state.fingerprints).accept("toy/echo")  # as `tools accept` does, from outside
        found_again = await search(p.client, "echo the text back")
        accepted = await p.client.call_tool("call_tool", {"name": "toy__echo", "arguments": {"text": "hi"}})

    assert unknown.is_error and "there is no tool 'toy__nope'" in text_of(unknown)
    assert "toy__echo" not in [hit["name"] for hit in hits]
    for refused in (through_search, direct):
        assert refused.is_error and "toy__echo is held" in text_of(refused)
        assert "definition changed" in text_of(refused) and "tools accept toy__echo" in text_of(refused)
    assert found_again[0]["name"] == "toy__echo"
    assert not accepted.is_error and text_of(accepted) == "hi"
    assert [e["tool"] for e in audit(tmp_path / "state") if e["event"] == "read"].count("toy__echo") == 1


@pytest.mark.parametrize("mode", ERAS)
async def test_malformed_calls_are_rejected_before_anything_runs(tmp_path: Path, mode: str) -> None:
    async def must_not_ask(context: Any, params: Any) -> types.ElicitResult:
        raise AssertionError("a malformed call reached the reviewer")

    record = tmp_path / "rec"
    async with proxied(config(record), tmp_path / "state", twins=True, mode=mode, elicitation=must_not_ask) as p:
        no_name = await p.client.call_tool("call_tool", {"arguments": {"value": "x"}})
        not_object = await p.client.call_tool("call_tool", {"name": "toy__record", "arguments": ["x"]})
        bad_arguments = await p.client.call_tool("call_tool", {"name": "toy__record", "arguments": {"value": 5}})
        meta = await p.client.call_tool("call_tool", {"name": "call_tool", "arguments": {}})
        no_query = await p.client.call_tool("search_tools", {"query": "  "})
        bad_limit = await p.client.call_tool("search_tools", {"query": "record", "limit": 500})

    assert "call_tool needs `name`" in text_of(no_name)
    assert "`arguments` must be an object" in text_of(not_object)
    assert "value: 5 is not of type 'string'" in text_of(bad_arguments)
    assert "intent" not in text_of(bad_arguments)
    assert "there is no tool 'call_tool'" in text_of(meta)
    assert "search_tools needs `query`" in text_of(no_query)
    assert "`limit` must be a whole number from 1 to 5" in text_of(bad_limit)
    assert all(r.is_error for r in (no_name, not_object, bad_arguments, meta, no_query, bad_limit))
    assert recorded(record) == []
    assert audit(tmp_path / "state") == []


async def test_search_mode_sends_no_tool_list_changes(tmp_path: Path) -> None:
    seen: list[Any] = []
    changed = Changed()

    async def messages(message: Any) -> None:
        seen.append(message)

    async with proxied(config(tmp_path / "rec"), tmp_path / "state", twins=True, messages=messages) as p:
        p.proxy.listeners.append(changed)  # after the front's own listener: it has run when this one does
        await p.client.call_tool("call_tool", {"name": "toy__add_tool", "arguments": {}})
        with anyio.fail_after(30):
            await changed.event.wait()
        listed = [tool.name for tool in (await p.client.list_tools()).tools]  # a round trip after it
        added = p.proxy.catalog.lookup("toy__extra")

    assert added.reason == "new-tool" and listed == ["search_tools", "call_tool"]
    assert not [m for m in seen if isinstance(m, types.ToolListChangedNotification)]


async def test_search_ranks_with_leashs_embedding_endpoint_and_falls_back_to_words_when_it_fails(
    tmp_path: Path,
) -> None:
    failing = False

    def faults(request: Any) -> Reply | None:
        return Reply(status=500) if failing else None

    async with ScriptedModelServer(Respond(lambda r: "unused"), embedding_faults=faults) as server:
        leash = {
            "encoder": "embedding",
            "embedding": {"base_url": server.base_url, "model": "embedder"},
            "bank_dir": str(tmp_path / "banks"),
        }
        cfg = config(tmp_path / "rec", leash=leash, catalog={"mode": "search", "rank": "encoder"})
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            by_model = await search(p.client, "append a value to the record file")
            embedded = [text for request in server.embedding_requests for text in request.input]
            failing = True
            by_words = await search(p.client, "append a value to the record file")

    assert by_model[0]["name"] == "toy__record"
    assert any("record" in text and "Append a value" in text for text in embedded)  # the tools, in plain words
    assert "append a value to the record file" in embedded  # and the request
    assert by_words[0]["name"] == "toy__record"  # the endpoint failed: words ranked, the search answered


class _Broken:
    info = EncoderInfo("embedding", "down", 8)

    async def encode_steps(self, steps: list[StepView]) -> Any:
        raise EncoderError("the endpoint is down")

    async def encode_texts(self, texts: list[str]) -> Any:
        raise EncoderError("the endpoint is down")


async def test_the_index_never_offers_a_held_tool_and_follows_the_catalog(tmp_path: Path) -> None:
    cfg = ProxyConfig.model_validate({"servers": {"a": {"command": "x"}}})
    store = FingerprintStore(tmp_path / "fingerprints.json")
    catalog = Catalog(cfg, store)
    first = types.Tool(name="send_invoice", description="Send an invoice to a customer.", input_schema={})
    catalog.set_tools("a", [first])
    index = ToolIndex(catalog.tools, _Broken(), "hybrid")
    assert [hit.tool.name for hit in await index.search("send the invoice", 5)] == ["a__send_invoice"]

    # A tool that appears after the server's first listing is held: never a hit until accepted.
    later = types.Tool(name="pay_invoice", description="Pay an invoice now.", input_schema={})
    catalog.set_tools("a", [first, later])
    assert [hit.tool.name for hit in await index.search("pay the invoice", 5)] == ["a__send_invoice"]
    store.accept("a/pay_invoice")
    await catalog.refresh_fingerprints()
    assert next(hit.tool.name for hit in await index.search("pay the invoice", 5)) == "a__pay_invoice"
    catalog.set_tools("a", None)
    assert await index.search("pay the invoice", 5) == []


async def test_one_tool_served_by_several_servers_is_one_hit_naming_the_others() -> None:
    cfg = ProxyConfig.model_validate(
        {"servers": {"work": {"command": "x"}, "home": {"command": "x"}, "other": {"command": "x"}}}
    )
    catalog = Catalog(cfg, FingerprintStore(None))
    send = types.Tool(name="send_mail", description="Send an email message.", input_schema={})
    draft = types.Tool(name="draft_mail", description="Draft an email message to send later.", input_schema={})
    catalog.set_tools("work", [send])
    catalog.set_tools("home", [send])
    catalog.set_tools("other", [draft])
    trust = preference(cfg.servers)
    hits = await ToolIndex(catalog.tools, None, "words", trust).search("send an email", 2)
    ungrouped = await ToolIndex(catalog.tools, None, "words", trust).search("send an email", 2, group=False)

    # The hit is the tool of the server listed first (`work`), not of the one whose name sorts first.
    assert [(hit.tool.name, [other.name for other in hit.also]) for hit in hits] == [
        ("work__send_mail", ["home__send_mail"]),
        ("other__draft_mail", []),
    ]
    assert [hit.tool.name for hit in ungrouped] == ["work__send_mail", "home__send_mail"]


async def test_the_installed_command_serves_search_mode_from_servers_yaml(tmp_path: Path) -> None:
    record = tmp_path / "rec"
    async with spawned(config(record, {"default": "deny"}), tmp_path) as client:
        listed = [tool.name for tool in (await client.list_tools()).tools]
        hits = await search(client, "append a value to the record file")
        denied = await client.call_tool(
            "call_tool", {"name": hits[0]["name"], "arguments": {"value": "x", "intent": "y"}}
        )

    assert listed == ["search_tools", "call_tool"]
    assert hits[0]["name"] == "toy__record" and denied.is_error
    assert recorded(record) == []
