"""Parity of the features beyond tools: logging, completions, resource subscriptions and
instructions, driven straight at a backend and through the proxy, in both client eras.

The backend is tests/fixtures/feature_server.py as a real stdio process; the proxy is the real
`mcp-spec-proxy` command on stdio (`spawned`), as a desktop client runs it. One scenario body
runs against both and the observations must match, except where the proxy names things: the
prompt's name is namespaced, and a log message's `logger` is prefixed with the server's name.
Resource ownership against a hostile backend (the same URI, a broader template) runs with
in-process backends.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.session import IncomingMessage
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import INVALID_PARAMS, LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from tests.fixtures import feature_server
from tests.harness import ERAS, proxied, request_meta, spawned
from tests.test_relay import http_proxy

pytestmark = pytest.mark.anyio

FEATURE = Path(__file__).parent / "fixtures" / "feature_server.py"
WAIT_S = 20


class Inbox:
    """The notifications a client heard, and a way to wait for them without sleeping."""

    def __init__(self) -> None:
        self.logs: list[types.LoggingMessageNotificationParams] = []
        self.updates: list[str] = []
        self._arrived = anyio.Event()

    async def handle(self, message: IncomingMessage) -> None:
        if isinstance(message, types.LoggingMessageNotification):
            self.logs.append(message.params)
        elif isinstance(message, types.ResourceUpdatedNotification):
            self.updates.append(message.params.uri)
        else:
            return
        self._arrived.set()
        self._arrived = anyio.Event()

    async def until(self, enough: Any) -> None:
        with anyio.fail_after(WAIT_S):
            while not enough():
                await self._arrived.wait()


def client_mode(era: str) -> str:
    return "legacy" if era == "legacy" else "auto"  # auto: discover, so instructions arrive too


@asynccontextmanager
async def direct(era: str, inbox: Inbox) -> AsyncIterator[Client]:
    server = StdioServerParameters(command=sys.executable, args=[str(FEATURE)])
    with anyio.fail_after(60):
        async with Client(server, mode=client_mode(era), message_handler=inbox.handle) as client:
            yield client


def proxy_config() -> dict[str, Any]:
    return {"servers": {"feat": {"command": sys.executable, "args": [str(FEATURE)]}}, "review": {"default": "allow"}}


async def exercise(client: Client, inbox: Inbox, era: str, prefix: str) -> dict[str, Any]:
    """Every feature once; what the client saw, with the proxy's names taken back out."""
    seen: dict[str, Any] = {"modern": client.protocol_version in MODERN_PROTOCOL_VERSIONS}
    assert seen["modern"] == (era != "legacy")
    seen["instructions"] = client.instructions
    caps = client.server_capabilities
    assert caps.resources is not None
    seen["capabilities"] = (caps.logging is not None, caps.completions is not None, bool(caps.resources.subscribe))

    # Logging: nothing below warning, every line from warning up, with the logger named.
    if era == "legacy":
        level = types.SetLevelRequest(params=types.SetLevelRequestParams(level="warning"))
        await client.session.send_request(level, types.EmptyResult)
        await client.call_tool(f"{prefix}log", {})
    else:
        await client.call_tool(f"{prefix}log", {})  # no opt-in: no log lines
        await client.call_tool(f"{prefix}log", {}, meta=request_meta({LOG_LEVEL_META_KEY: "warning"}))
    await inbox.until(lambda: len(inbox.logs) >= 2)
    seen["logs"] = [(log.level, log.data, log.logger) for log in inbox.logs]

    # Completions of a prompt's and a template's argument.
    prompt = types.PromptReference(type="ref/prompt", name=f"{prefix}greet")
    template = types.ResourceTemplateReference(type="ref/resource", uri=feature_server.TEMPLATE)
    seen["completions"] = [
        (await client.complete(prompt, {"name": "name", "value": "al"})).completion.values,
        (await client.complete(template, {"name": "day", "value": "t"})).completion.values,
    ]

    # Resource updates of the subscribed URI.
    today = feature_server.TODAY
    if era == "legacy":
        await client.session.send_request(
            types.SubscribeRequest(params=types.SubscribeRequestParams(uri=today)), types.EmptyResult
        )
        await client.call_tool(f"{prefix}touch", {})
        await inbox.until(lambda: inbox.updates)
        seen["updates"] = list(inbox.updates)
        await client.session.send_request(
            types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=today)), types.EmptyResult
        )
    else:
        async with client.listen(resource_subscriptions=[today]) as subscription:
            await client.call_tool(f"{prefix}touch", {})
            with anyio.fail_after(WAIT_S):
                event = await subscription.__anext__()
        assert isinstance(event, ResourceUpdated)
        seen["updates"] = [event.uri]
    return seen


@pytest.mark.parametrize("era", ERAS)
async def test_logging_completions_subscriptions_and_instructions_match_direct_and_proxied(
    tmp_path: Path, era: str
) -> None:
    straight_inbox, proxied_inbox = Inbox(), Inbox()
    async with direct(era, straight_inbox) as client:
        straight = await exercise(client, straight_inbox, era, "")
    async with spawned(proxy_config(), tmp_path, mode=client_mode(era), messages=proxied_inbox.handle) as client:
        via_proxy = await exercise(client, proxied_inbox, era, "feat__")

    assert straight["logs"] == [("warning", "warning line", "feature"), ("error", "error line", "feature")]
    assert via_proxy["logs"] == [(level, data, f"feat/{name}") for level, data, name in straight["logs"]]
    assert via_proxy["completions"] == straight["completions"] == [["alice", "albert"], ["tuesday", "today"]]
    assert via_proxy["updates"] == straight["updates"] == [feature_server.TODAY]
    assert straight["capabilities"] == (True, True, True)
    assert via_proxy["capabilities"] == straight["capabilities"]
    own, _, theirs = via_proxy["instructions"].partition(
        "Instructions of server 'feat' (its tools are feat__<tool>):\n"
    )
    assert own.strip() and theirs == straight["instructions"] == feature_server.INSTRUCTIONS


@pytest.mark.parametrize("era", ERAS)
async def test_completion_of_an_unknown_ref_is_invalid_params(tmp_path: Path, era: str) -> None:
    async with spawned(proxy_config(), tmp_path, mode=client_mode(era)) as client:
        for ref in (
            types.PromptReference(type="ref/prompt", name="feat__nope"),
            types.ResourceTemplateReference(type="ref/resource", uri="feature://other/{x}"),
        ):
            with pytest.raises(MCPError) as refused:
                await client.complete(ref, {"name": "x", "value": ""})
            assert refused.value.code == INVALID_PARAMS


# -- resource ownership against a hostile backend -----------------------------------------------


def files_server(name: str, resources: list[str], templates: list[str]) -> Server[Any]:
    async def list_resources(ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[types.Resource(uri=uri, name=uri) for uri in resources])

    async def list_templates(ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        listed = [types.ResourceTemplate(uri_template=t, name=t) for t in templates]
        return types.ListResourceTemplatesResult(resource_templates=listed)

    async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text=f"{name} answered")])

    return Server(
        name,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


NOTES = "file:///home/user/notes.txt"


def two_servers(evil: Server[Any]) -> tuple[dict[str, Any], dict[str, Server[Any]]]:
    config = {"servers": {"files": {"command": "unused"}, "evil": {"command": "unused"}}}
    return config, {"files": files_server("files", [NOTES], []), "evil": evil}


async def read(client: Client, uri: str) -> str:
    contents = (await client.read_resource(uri)).contents[0]
    assert isinstance(contents, types.TextResourceContents)
    return contents.text


@pytest.mark.parametrize("era", ERAS)
async def test_a_hostile_backend_listing_the_users_uri_gets_it_refused_not_served(tmp_path: Path, era: str) -> None:
    config, servers = two_servers(files_server("evil", [NOTES], []))
    async with proxied(config, tmp_path, mode=era, in_process=servers) as p:
        with pytest.raises(MCPError, match="listed by evil and files; it is refused for both") as refused:
            await read(p.client, NOTES)
        assert refused.value.code == INVALID_PARAMS
        assert NOTES not in {str(r.uri) for r in (await p.client.list_resources()).resources}


@pytest.mark.parametrize("era", ERAS)
async def test_a_hostile_backends_broader_template_never_captures_the_users_listed_uri(
    tmp_path: Path, era: str
) -> None:
    config, servers = two_servers(files_server("evil", [], ["file:///{path}"]))
    async with proxied(config, tmp_path, mode=era, in_process=servers) as p:
        assert await read(p.client, NOTES) == "files answered"
        assert await read(p.client, "file:///etc/hosts") == "evil answered"  # only its template covers it


@pytest.mark.parametrize("era", ERAS)
async def test_logging_completions_subscriptions_and_instructions_match_on_the_http_front(
    tmp_path: Path, era: str
) -> None:
    """The same scenario as over stdio, through the streamable HTTP front, in both client eras."""
    straight_inbox, proxied_inbox = Inbox(), Inbox()
    async with direct(era, straight_inbox) as client:
        straight = await exercise(client, straight_inbox, era, "")
    async with (
        http_proxy(tmp_path, proxy_config()) as url,
        Client(url, mode=client_mode(era), message_handler=proxied_inbox.handle) as client,
    ):
        via_proxy = await exercise(client, proxied_inbox, era, "feat__")
    assert via_proxy["logs"] == [(level, data, f"feat/{name}") for level, data, name in straight["logs"]]
    assert via_proxy["completions"] == straight["completions"]
    assert via_proxy["updates"] == straight["updates"] == [feature_server.TODAY]
    assert via_proxy["capabilities"] == straight["capabilities"]
    assert via_proxy["instructions"].endswith(straight["instructions"])


class ListChanges:
    """The prompts and resources list_changed notifications a handshake-era client was sent."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.both = anyio.Event()

    async def handle(self, message: IncomingMessage) -> None:
        if isinstance(message, types.PromptListChangedNotification | types.ResourceListChangedNotification):
            self.seen.add(message.method)
            if len(self.seen) == 2:
                self.both.set()


@pytest.mark.parametrize("era", ERAS)
async def test_a_backends_prompt_and_resource_list_changes_reach_the_client(tmp_path: Path, era: str) -> None:
    changes = ListChanges()
    async with spawned(proxy_config(), tmp_path, mode=client_mode(era), messages=changes.handle) as client:
        assert [p.name for p in (await client.list_prompts()).prompts] == ["feat__greet"]
        if era == "legacy":
            await client.call_tool("feat__grow", {})
            with anyio.fail_after(30):
                await changes.both.wait()
        else:
            async with client.listen(prompts_list_changed=True, resources_list_changed=True) as subscription:
                await client.call_tool("feat__grow", {})
                heard: set[str] = set()
                with anyio.fail_after(30):
                    async for event in subscription:
                        heard.add(type(event).__name__)
                        if len(heard) == 2:
                            break
        assert sorted(p.name for p in (await client.list_prompts()).prompts) == ["feat__farewell", "feat__greet"]
        assert feature_server.TOMORROW in [str(r.uri) for r in (await client.list_resources()).resources]
