"""Shared test plumbing: configs for the toy and reference backends, and proxied clients.

`proxied(...)` runs the proxy in this process (real backends, real stdio to them) and connects
an `mcp.Client` to its front in-process, so tests can look at the proxy's state; with
`in_process=toy_twins(config)` the flagless toys run as in-process twins instead of processes
(the same tools and the same ledger: use them unless the process is the thing under test);
`spawned(...)`
runs the real `mcp-spec-proxy` command and talks to it over stdio, as Claude Desktop would — on
the package this test imports (`PROXY_ROOT` leads its `PYTHONPATH`), never another checkout's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import mcp_types as types
import yaml
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import ElicitationFnT, ListRootsFnT, MessageHandlerFnT
from mcp.client.stdio import get_default_environment
from mcp.server import Server

import mcp_spec_proxy
from mcp_spec_proxy import prompts
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import Proxy, StatePaths, running_proxy
from tests.backends import BackendCommand
from tests.fixtures import toy_server

TOY = Path(__file__).parent / "fixtures" / "toy_server.py"
PROXY_COMMAND = str(Path(sys.executable).parent / "mcp-spec-proxy")
PROXY_ROOT = str(Path(mcp_spec_proxy.__file__).resolve().parents[1])


def proxy_env() -> dict[str, str]:
    """The environment a spawned proxy gets over stdio: the SDK's default, and this package first."""
    return {**get_default_environment(), "PYTHONPATH": PROXY_ROOT}


ERAS = ["legacy", "2026-07-28"]


def toy(record_file: Path, *flags: str, **extra: Any) -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": [str(TOY), *flags],
        "env": {"TOY_RECORD_FILE": str(record_file)},
        **extra,
    }


def toy_twins(config: dict[str, Any]) -> dict[str, Server[Any]]:
    """In-process twins of the config's toy backends started without flags, by server name.

    Each records to its stdio toy's $TOY_RECORD_FILE, so `recorded(...)` reads the same ledger.
    A flagged toy (`--legacy-only`, `--hang-at-start`) stays a process."""
    twins: dict[str, Server[Any]] = {}
    for name, server in config.get("servers", {}).items():
        if server.get("args") == [str(TOY)]:
            env = server.get("env", {})
            twins[name] = toy_server.build(Path(env["TOY_RECORD_FILE"]), env.get("TOY_NAME", "toy"))
    return twins


def stdio(backend: BackendCommand, **extra: Any) -> dict[str, Any]:
    return {"command": backend.command, "args": backend.args, "env": backend.env, **extra}


def recorded(record_file: Path) -> list[str]:
    return record_file.read_text().splitlines() if record_file.exists() else []


def request_meta(entries: Mapping[str, object]) -> types.RequestParamsMeta:
    """`entries` as a request's `_meta`: an open map on the wire, whose keys beyond the progress
    token (the proxy's own, the reserved `io.modelcontextprotocol/*`) mypy cannot see yet (the
    TypedDict's PEP 728 `extra_items`)."""
    return cast(types.RequestParamsMeta, dict(entries))


def text_of(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def call_error(client: Client, tool: str, arguments: dict[str, Any]) -> types.ErrorData:
    """The JSON-RPC error a tools/call is answered with; a result instead fails the test."""
    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:
        return exc.error
    raise AssertionError(f"{tool} answered a result, not an error: {result}")


@dataclass
class Proxied:
    client: Client
    proxy: Proxy
    state: StatePaths


@asynccontextmanager
async def proxied(
    config: dict[str, Any],
    state_dir: Path,
    *,
    mode: str = "legacy",
    elicitation: ElicitationFnT | None = None,
    messages: MessageHandlerFnT | None = None,
    telemetry: Path | None = None,
    in_process: dict[str, Server[Any]] | None = None,
    twins: bool = False,
) -> AsyncIterator[Proxied]:
    """`twins=True` runs the config's flagless toys in-process (`toy_twins`) instead of as processes."""
    if twins:
        in_process = {**toy_twins(config), **(in_process or {})}
    parsed = ProxyConfig.model_validate(config)
    state = StatePaths(state_dir)
    with anyio.fail_after(60):
        async with running_proxy(parsed, state, telemetry=telemetry, in_process=in_process) as proxy:
            front = McpFront(proxy)
            async with Client(
                front.server, mode=mode, elicitation_callback=elicitation, message_handler=messages
            ) as client:
                yield Proxied(client, proxy, state)


@asynccontextmanager
async def spawned(
    config: dict[str, Any],
    tmp: Path,
    *,
    mode: str = "legacy",
    elicitation: ElicitationFnT | None = None,
    messages: MessageHandlerFnT | None = None,
    list_roots: ListRootsFnT | None = None,
) -> AsyncIterator[Client]:
    config_file = tmp / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config))
    params = StdioServerParameters(
        command=PROXY_COMMAND,
        args=["--config", str(config_file), "--state-dir", str(tmp / "state"), "--log-level", "WARNING"],
        env=proxy_env(),
    )
    with anyio.fail_after(90):
        async with Client(
            params,
            mode=mode,
            elicitation_callback=elicitation,
            message_handler=messages,
            list_roots_callback=list_roots,
        ) as client:
            yield client


def approve(answer: bool, note: str = "") -> ElicitationFnT:
    async def callback(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"approve": answer, "note": note})

    return callback


def verdict(accepted_steps: int, reason: str = "ok", replacement: dict[str, Any] | None = None) -> str:
    """A scripted verifier's answer, as the strong model would write it."""
    return json.dumps({"reason": reason, "accepted_steps": accepted_steps, "replacement_action": replacement})


def segment_length(request: Any) -> int:
    """How many steps the verification request's segment block holds."""
    return prompts.segment_length(request.messages)
