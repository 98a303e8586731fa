"""Running the retail server behind the proxy, and the oracle agent that checks the whole chain.

`proxy_config(state_out, db=...)` is a proxy config with the retail server as backend `retail`
(stdio, its own process, one per task run) and every write allowed (audit only). The oracle
replays a task's gold actions as `retail__<tool>` calls through any `mcp.Client` connected to
such a proxy, adding the `intent` argument the proxy asks of write tools; the end state is then
read from the state file and scored (`scoring.score_task`). Every train task must score 1.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client

from bench.tau2_retail.scoring import gold_actions, instruction

SERVER = "retail"
SEPARATOR = "__"
MODULE = "bench.tau2_retail"
# `bench` is not installed with the product: the server runs as a module from the folder holding it.
ROOT = Path(__file__).resolve().parents[2]


def server_command(state_out: Path | None = None, *, db: Path | None = None) -> list[str]:
    """The command line that starts the retail server for one task run; run it in `ROOT`."""
    command = [sys.executable, "-m", MODULE]
    if db is not None:
        command += ["--db", str(db)]
    if state_out is not None:
        command += ["--state-out", str(state_out)]
    return command


def proxy_config(
    state_out: Path | None = None, *, db: Path | None = None, review: str = "allow", server: str = SERVER
) -> dict[str, Any]:
    """A proxy config (servers.yaml as a dict) serving the retail server as backend `server`.

    Pass `db` explicitly when the data folder comes from `TAU2_RETAIL_DATA`: backends start
    with a minimal environment and would not see the variable.
    """
    command = server_command(state_out, db=db)
    return {
        "servers": {server: {"command": command[0], "args": command[1:], "cwd": str(ROOT)}},
        "review": {"default": review},
    }


@dataclass(frozen=True)
class OracleCall:
    name: str
    arguments: dict[str, Any]
    is_error: bool
    text: str


async def run_oracle(
    task: dict[str, Any], client: Client, *, server: str = SERVER, separator: str = SEPARATOR
) -> list[OracleCall]:
    """Call every gold action of `task` through `client` (a proxy), in order; failures go on.

    Write tools get `intent` = the task's instruction when the proxy's schema asks for it.
    """
    listed = await client.list_tools()
    wants_intent = {tool.name for tool in listed.tools if "intent" in (tool.input_schema.get("properties") or {})}
    calls = []
    for action in gold_actions(task):
        name = f"{server}{separator}{action['name']}"
        arguments = dict(action["arguments"])
        if name in wants_intent:
            arguments["intent"] = instruction(task)
        result = await client.call_tool(name, arguments)
        calls.append(OracleCall(name, arguments, bool(result.is_error), _text(result)))
    return calls


def _text(result: types.CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, types.TextContent))
