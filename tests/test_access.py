"""`access:` — what each principal sees. As values (each server and tool decided once per
principal, first match wins, a rule that fails hides) and from outside: a client of the proxy that
nobody identified (the empty principal, as without `auth:`) does not see a hidden server's tools,
prompts or resources anywhere — tools/list, search mode, `delegate`'s tools — and its call of one
is refused as the call of a tool that does not exist, with nothing run. Principals with groups,
through the HTTP front and a real authorization server, are `test_access_identity.py`'s."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import openai
import pytest
from mcp.shared.exceptions import MCPError

from mcp_spec_proxy.calls.access import Access, shown, viewing
from mcp_spec_proxy.config.schema import ProxyConfig, load_config, parse_config_text
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.fixtures import feature_server
from tests.harness import ERAS, Proxied, call_error, proxied, recorded, spawned, text_of, toy, toy_twins

pytestmark = pytest.mark.anyio

ACCESS: list[dict[str, Any]] = [
    {"when": '"finance" in principal.groups', "hide": False, "name": "finance-sees-all"},
    {"when": 'server == "bank" || server == "feat"', "hide": True},
    {"when": 'tool == "toy__record"', "hide": True},
]


def access(*rules: dict[str, Any]) -> Access:
    return Access(ProxyConfig.model_validate({"access": list(rules or ACCESS)}).access)


def who(*groups: str) -> Principal:
    return Principal("https://id.example.com/", "ann", "cli", ("mcp",), groups)


def config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "servers": {"toy": toy(tmp_path / "toy"), "bank": toy(tmp_path / "bank"), "feat": {"command": "unused"}},
        "review": {"default": "allow", "intent": False},
        "access": ACCESS,
        **extra,
    }


@asynccontextmanager
async def anonymous(tmp_path: Path, era: str = "legacy", **extra: Any) -> AsyncIterator[Proxied]:
    """A client of the proxy that nobody identified, over the toy, a second toy (`bank`) and a
    server of prompts and resources (`feat`)."""
    async with proxied(
        config(tmp_path, **extra),
        tmp_path / "state",
        mode=era,
        twins=True,
        in_process={"feat": feature_server.build()},
    ) as p:
        yield p


def test_the_first_matching_rule_decides_and_nothing_matching_shows() -> None:
    rules = access()
    finance, nobody = rules.view(who("finance")), rules.view(None)
    assert finance is not None and nobody is not None
    assert finance.shows("bank", "bank__record") and finance.shows("toy", "toy__record")
    assert not nobody.shows("bank", "bank__echo") and not nobody.shows("bank")  # the server whole
    assert not nobody.shows("toy", "toy__record") and nobody.shows("toy", "toy__echo")
    assert nobody.shows("toy")  # a rule naming one tool leaves its server's prompts and resources
    assert rules.view(who("finance")) is finance  # a principal's view is kept: each tool decided once


def test_a_rule_that_cannot_be_evaluated_hides() -> None:
    # `principal.team` is no key of the principal: the rule errs at run time, for every tool.
    rules = access({"when": 'principal.team == "ops"', "hide": False})
    view = rules.view(who("ops"))
    assert view is not None and not view.shows("toy", "toy__echo") and not view.shows("toy")


def test_without_rules_there_is_no_view_and_everything_is_shown() -> None:
    assert Access(()).view(who()) is None
    with viewing(None):
        assert shown("bank", "bank__record")
    with viewing(access().view(None)):
        assert not shown("bank", "bank__record") and shown("toy", "toy__echo")
    assert shown("bank", "bank__record")  # where no client asks: the operator's commands


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ('server == "bank" &&', "Syntax error"),
        ("args.amount > 100", "the variables are principal, server and tool"),
        ('"bank"', "gives a string, not true or false"),
    ],
)
def test_an_access_rule_that_does_not_compile_is_one_line_at_its_file_and_line(
    tmp_path: Path, when: str, problem: str
) -> None:
    path = tmp_path / "servers.yaml"
    path.write_text(f"servers: {{}}\naccess:\n  - hide: true\n    when: '{when}'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}:4: access.0.when: `when`"), message
    assert problem in message and " — " in message


def test_an_access_rule_must_say_whether_it_hides() -> None:
    with pytest.raises(ConfigError, match="hide"):
        parse_config_text("access: [{when: 'true'}]", {})


@pytest.mark.parametrize("era", ERAS)
async def test_a_hidden_tool_is_not_listed_and_its_call_is_refused_as_a_tool_that_does_not_exist(
    tmp_path: Path, era: str
) -> None:
    async with anonymous(tmp_path, era) as p:
        listed = {tool.name for tool in (await p.client.list_tools()).tools}
        refused = {name: await call_error(p.client, name, {"value": "v"}) for name in ("bank__record", "toy__record")}
        read = await call_error(p.client, "bank__echo", {"text": "hi"})  # a read: the lean path's door
        unknown = await call_error(p.client, "nosuch__record", {"value": "v"})
        own_name = await call_error(p.client, "record", {"value": "v"})  # the name its server lists it under
        echoed = await p.client.call_tool("toy__echo", {"text": "hi"})
    assert "toy__echo" in listed and not {"bank__echo", "bank__record", "toy__record"} & listed
    for name, error in [*refused.items(), ("bank__echo", read), ("record", own_name)]:
        assert (error.code, error.message.replace(name, "X")) == (
            unknown.code,
            unknown.message.replace("nosuch__record", "X"),
        )
    assert text_of(echoed) == "hi"
    assert recorded(tmp_path / "bank") == [] and recorded(tmp_path / "toy") == []


async def test_a_hidden_servers_prompts_and_resources_are_not_listed_and_not_served(tmp_path: Path) -> None:
    async with anonymous(tmp_path) as p:
        prompts = (await p.client.list_prompts()).prompts
        resources = (await p.client.list_resources()).resources
        templates = (await p.client.list_resource_templates()).resource_templates
        with pytest.raises(MCPError) as prompt:
            await p.client.get_prompt("feat__greet", {"name": "ann"})
        with pytest.raises(MCPError) as unknown:
            await p.client.get_prompt("feat__nosuch", {"name": "ann"})
        with pytest.raises(MCPError, match="no backend serves resource"):
            await p.client.read_resource(feature_server.TODAY)
    assert prompts == [] and resources == [] and templates == []
    assert prompt.value.error.code == unknown.value.error.code
    assert prompt.value.error.message.replace("greet", "X") == unknown.value.error.message.replace("nosuch", "X")


async def test_search_mode_neither_finds_nor_calls_a_hidden_tool(tmp_path: Path) -> None:
    async with anonymous(tmp_path, catalog={"mode": "search"}) as p:
        found = await p.client.call_tool("search_tools", {"query": "append a value to the record file"})
        called = await p.client.call_tool("call_tool", {"name": "bank__record", "arguments": {"value": "v"}})
        echo = await p.client.call_tool("search_tools", {"query": "echo the text back"})
    names = {hit["name"] for hit in json.loads(text_of(found))["tools"]}
    hits = json.loads(text_of(echo))["tools"]
    assert not {"bank__record", "toy__record"} & names
    assert [hit["name"] for hit in hits][:1] == ["toy__echo"]
    assert not any(other["name"] == "bank__echo" for hit in hits for other in hit.get("also", []))
    assert called.is_error and "there is no tool 'bank__record'" in text_of(called)
    assert recorded(tmp_path / "bank") == []


async def test_search_modes_meta_tools_are_tools_of_mcp_spec_proxy_that_access_can_hide(tmp_path: Path) -> None:
    own = [{"when": 'server == "mcp-spec-proxy" && tool == "call_tool"', "hide": True}, *ACCESS]
    async with anonymous(tmp_path, catalog={"mode": "search"}, access=own) as p:
        listed = {tool.name for tool in (await p.client.list_tools()).tools}
        refused = await call_error(p.client, "call_tool", {"name": "toy__record", "arguments": {"value": "v"}})
        unknown = await call_error(p.client, "nosuch", {"name": "toy__record", "arguments": {"value": "v"}})
        found = await p.client.call_tool("search_tools", {"query": "echo the text back"})
    assert listed == {"search_tools"}
    assert (refused.code, refused.message.replace("call_tool", "X")) == (
        unknown.code,
        unknown.message.replace("nosuch", "X"),
    )
    assert json.loads(text_of(found))["tools"][0]["name"] == "toy__echo"
    assert recorded(tmp_path / "toy") == []


def test_no_backend_may_take_the_name_access_gives_the_proxys_own_tools() -> None:
    with pytest.raises(ConfigError, match="'mcp-spec-proxy' is the proxy's own"):
        parse_config_text("servers: {mcp-spec-proxy: {command: x}}", {})


async def test_delegate_offers_its_models_only_the_tools_the_principal_sees_and_runs_no_hidden_one(
    tmp_path: Path,
) -> None:
    offered: list[set[str]] = []
    heard: list[str] = []

    def answer(request: ChatRequest) -> Reply | str:
        offered.append({tool["function"]["name"] for tool in request.tools})
        told = [str(message.get("content")) for message in request.messages if message["role"] == "tool"]
        if told:
            heard.extend(told)
            return "Done."
        return Reply(tool_calls=[ToolCall("bank__record", {"value": "from the agent"})])

    async with ScriptedModelServer(Respond(answer)) as model:
        strong = {"base_url": model.base_url, "max_retries": 0, "model": "strong-model"}
        async with anonymous(tmp_path, models={"strong": strong}) as p:
            ran = await p.client.call_tool("delegate", {"task": "Record a value at the bank."})
    assert offered and all("toy__echo" in names and not any(n.startswith("bank__") for n in names) for names in offered)
    assert recorded(tmp_path / "bank") == []
    assert "[error]" in text_of(ran) and heard and "unknown tool 'bank__record'" in heard[0], heard


async def test_the_stdio_front_whose_reads_skip_the_sdk_hides_the_same_tools(tmp_path: Path) -> None:
    """stdio takes a read off the wire before the SDK parses it (`stdio._LeanReads`): that door
    meets the empty principal's view too."""
    servers = {"toy": toy(tmp_path / "toy"), "bank": toy(tmp_path / "bank")}
    async with spawned({"servers": servers, "review": {"default": "allow"}, "access": ACCESS}, tmp_path) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        read = await call_error(client, "bank__echo", {"text": "hi"})
        written = await call_error(client, "bank__record", {"value": "v"})
        unknown = await call_error(client, "nosuch__echo", {"text": "hi"})
        echoed = await client.call_tool("toy__echo", {"text": "hi"})
    assert "toy__echo" in listed and not any(name.startswith("bank__") for name in listed)
    for error, name in ((read, "bank__echo"), (written, "bank__record")):
        expected = (unknown.code, unknown.message.replace("nosuch__echo", "X"))
        assert (error.code, error.message.replace(name, "X")) == expected
    assert text_of(echoed) == "hi" and recorded(tmp_path / "bank") == []


async def test_the_gateway_offers_its_models_only_what_the_empty_principal_sees(tmp_path: Path) -> None:
    offered: list[set[str]] = []

    def answer(request: ChatRequest) -> Reply | str:
        offered.append({tool["function"]["name"] for tool in request.tools})
        if any(message["role"] == "tool" for message in request.messages):
            return "Done."
        return Reply(tool_calls=[ToolCall("bank__record", {"value": "from the gateway"})])

    async with ScriptedModelServer(Respond(answer)) as model:
        strong = {"base_url": model.base_url, "max_retries": 0, "model": "strong-model"}
        raw = config(tmp_path, models={"strong": strong})
        parsed, state, twins = ProxyConfig.model_validate(raw), StatePaths(tmp_path / "state"), toy_twins(raw)
        with anyio.fail_after(60):
            async with running_proxy(parsed, state, in_process=twins) as proxy, anyio.create_task_group() as tg:
                port = await tg.start(functools.partial(serve_gateway, Gateway(proxy), "127.0.0.1", 0))
                async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-") as client:
                    await client.chat.completions.create(
                        model="strong-only", messages=[{"role": "user", "content": "Record a value at the bank."}]
                    )
                tg.cancel_scope.cancel()
    assert offered and all("toy__echo" in names and not any(n.startswith("bank__") for n in names) for names in offered)
    assert recorded(tmp_path / "bank") == []


async def test_a_resource_a_hidden_and_a_seen_server_both_list_is_refused_without_naming_the_hidden_one(
    tmp_path: Path,
) -> None:
    raw = {**config(tmp_path), "servers": {"bank": {"command": "unused"}, "notes": {"command": "unused"}}}
    servers = {"bank": feature_server.build(), "notes": feature_server.build()}
    async with proxied(raw, tmp_path / "state", in_process=servers) as p:
        with pytest.raises(MCPError) as listed:
            await p.client.read_resource(feature_server.TODAY)
        with pytest.raises(MCPError) as templated:
            await p.client.read_resource("feature://notes/monday")
    for refused in (listed, templated):
        message = refused.value.error.message
        assert "bank" not in message and "no backend serves resource" in message, message
