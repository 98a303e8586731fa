"""Error fidelity: a backend's JSON-RPC error reaches the client as the backend sent it, except a
code of the proxy's own band, which reaches it as the backend's (`as_passed`); the proxy's own
errors (its timeout, a connection that really closed) carry the proxy's own codes.

The proxy runs as the real `mcp-spec-proxy` process over stdio, as a client would run it, and
every error is compared with the one the same backend gives a client directly, in both client
eras: a read (the lean path, and the SDK's path when the call carries a progress token), a write
(through the gate), a prompt and a resource. The codes sent include the ones the SDK and the
proxy use for their own words (-32000, -32001, the proxy's -32012 and -32013), which a backend
may send too: they are the backend's, passed on, never read as the proxy's own — the SDK's as they
were sent, the proxy's as Internal Error with the backend's code beside its data
(`tests/test_own_words.py` holds the rest of that promise).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import ErrorData

from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.errors import BACKEND_CLOSED, BACKEND_TIMEOUT
from tests.harness import ERAS, call_error, spawned, toy

pytestmark = pytest.mark.anyio

ERRING = Path(__file__).parent / "fixtures" / "erring_server.py"
DATA = {"field": "value", "why": ["too", "long"], "limit": 3, "none": None}
SENT: list[dict[str, Any]] = [
    {"code": -32001, "message": "the backend's own timeout", "data": DATA},
    {"code": -32000, "message": "Connection closed"},  # the SDK's own words, sent by a backend
    {"code": -32000, "message": "backend-defined failure", "data": {"retry": False}},
    {"code": -32099, "message": "returned too much, says the backend", "data": [1, 2, 3]},
    {"code": -32602, "message": "invalid params", "data": DATA},
    {"code": -32012, "message": "closed its connection, says the backend", "data": "a string"},
    {"code": -32013, "message": "did not answer within 60s, says the backend"},
]
RESOURCE_CODES = (-32001, -32000, -32099, -32602, -32012, -32013, -32016)
OWN_BAND = range(-32019, -32009)  # errors.py: the proxy's codes

Ask = Callable[[str, dict[str, Any]], Awaitable[ErrorData]]


def erring(ledger: Path) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(ERRING)], "env": {"TOY_RECORD_FILE": str(ledger)}}


async def no_progress(progress: float, total: float | None, message: str | None) -> None:
    pass


async def errors_of(client: Client, prefix: str) -> list[ErrorData]:
    """Every error the erring backend is asked for, over every path, in one order."""
    caught: list[ErrorData] = []

    async def expect(call: Awaitable[Any]) -> None:
        try:
            answer = await call
        except MCPError as exc:
            caught.append(exc.error)
            return
        raise AssertionError(f"an answer, not an error: {answer}")

    for sent in SENT:
        await expect(client.call_tool(f"{prefix}fail_read", sent))
        await expect(client.call_tool(f"{prefix}fail_read", sent, progress_callback=no_progress))
        await expect(client.call_tool(f"{prefix}fail_write", sent))
        arguments = {"code": str(sent["code"]), "message": sent["message"]}
        if "data" in sent:
            arguments["data"] = json.dumps(sent["data"])
        await expect(client.get_prompt(f"{prefix}fail", arguments))
    for code in RESOURCE_CODES:
        await expect(client.read_resource(f"fail://{code}"))
    return caught


@asynccontextmanager
async def direct(ledger: Path, mode: str) -> AsyncIterator[Client]:
    params = StdioServerParameters(command=sys.executable, args=[str(ERRING)], env={"TOY_RECORD_FILE": str(ledger)})
    with anyio.fail_after(60):
        async with Client(params, mode=mode) as client:
            yield client


def as_passed(error: ErrorData) -> ErrorData:
    """A backend's error as the proxy passes it on: a code of the proxy's band becomes -32603, with
    the code sent in `data` (and a `data` that is no object beside it); any other as it was sent."""
    if error.code not in OWN_BAND:
        return error
    sent = error.data
    moved = {"mcp-spec-proxy/backend-code": error.code}
    data = {**sent, **moved} if isinstance(sent, dict) else {**moved, "mcp-spec-proxy/backend-data": sent}
    return ErrorData(code=-32603, message=error.message, data=data if sent is not None else moved)


@pytest.mark.parametrize("mode", ERAS)
async def test_backend_json_rpc_errors_reach_the_client_as_the_backend_sent_them(tmp_path: Path, mode: str) -> None:
    async with direct(tmp_path / "direct-ledger", mode) as client:
        expected = await errors_of(client, "")
    config = {"servers": {"e": erring(tmp_path / "ledger")}, "review": {"default": "allow"}}
    async with spawned(config, tmp_path, mode=mode) as client:
        with anyio.fail_after(60):
            got = await errors_of(client, "e__")
    assert [error.model_dump() for error in got] == [as_passed(error).model_dump() for error in expected]
    assert len(got) == 4 * len(SENT) + len(RESOURCE_CODES)
    assert got[0] == ErrorData(code=-32001, message="the backend's own timeout", data=DATA)  # not the proxy's words


@pytest.mark.parametrize("mode", ERAS)
async def test_the_proxys_own_timeout_and_a_backend_death_carry_its_own_codes(tmp_path: Path, mode: str) -> None:
    config = {"servers": {"toy": toy(tmp_path / "rec", timeout=0.5)}, "review": {"default": "allow"}}
    async with spawned(config, tmp_path, mode=mode) as client:
        with anyio.fail_after(60):
            hung = await call_error(client, "toy__hang", {})
            crashed = await call_error(client, "toy__crash", {})
    assert hung.code == BACKEND_TIMEOUT and set(hung.data or {}) == {CALL_META}  # only the call's id
    assert hung.message == (
        "backend 'toy' did not answer tools/call hang within 0.5s, this server's `timeout`;"
        " the proxy stopped waiting and asked it to cancel, so it may still have run"
    )
    assert crashed.code == BACKEND_CLOSED and set(crashed.data or {}) == {CALL_META}
    assert crashed.message == (
        "backend 'toy' closed its connection during tools/call crash, before answering, so it may have run;"
        " the proxy restarts it"  # a stdio server's process is started again (an HTTP one is reconnected)
    )
