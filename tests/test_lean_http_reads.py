"""Reads over an established handshake-era HTTP backend session, past the SDK's client session
(`backends/lean_http.py`), give the client what the SDK's full path gives it.

Each scenario runs twice against a real server over streamable HTTP on port 0 (the toy, and the
asking server whose reads ask the client something on the call's own stream): once as the proxy
sends reads, once with the lean path switched off. The backend (`HandshakeOnly`) records the id of
each `tools/call` it hears, so each run shows which path carried the reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_spec_proxy.backends import lean_http
from mcp_spec_proxy.calls.results import CALL_META
from tests.fixtures import asking_server, toy_server
from tests.harness import call_error, text_of
from tests.test_pooled_legs import HandshakeOnly, front_over, over_http
from tests.test_relay import ClientSide

pytestmark = pytest.mark.anyio

Reads = list[tuple[str, dict[str, Any]]]
TOY_READS: Reads = [("echo", {"text": 'héllo ✓ \u2028 "quoted"'}), ("big", {"size": 70_000}), ("echo", {"text": ""})]
# Elicitation only: in process, the server's sampling and roots requests warn as deprecated (SEP-2577).
ASKING_READS: Reads = [("ask_user", {})] * 3


async def reads(
    tmp_path: Path, app: Any, era: str, calls: list[tuple[str, dict[str, Any]]], *, asks: bool
) -> tuple[list[Any], list[Any], list[str]]:
    """What the client got for each call (its call id left out), what it was asked (`asks`: a client that
    answers sampling, elicitation and roots), and the ids of the calls the backend heard."""
    backend = HandshakeOnly(app)
    side = ClientSide()
    servers = {"far": {"url": "", "tools": {"overrides": {"*": {"read_only": True}}}}}
    with anyio.fail_after(90):
        async with over_http(backend) as url:
            servers["far"]["url"] = url
            async with (
                front_over(servers, tmp_path) as (_, front),
                side.client(front, era) if asks else Client(front, mode=era) as client,
            ):
                got = []
                for name, arguments in calls:
                    called = await client.call_tool(f"far__{name}", arguments)
                    result = called.model_dump(mode="json", by_alias=True)
                    assert result["_meta"].pop(CALL_META)  # every call names itself: a fresh id each time
                    got.append(result)
    return got, side.asked, [str(call.get("id")) for call in backend.calls]


def apps(tmp_path: Path) -> dict[str, tuple[Any, list[tuple[str, dict[str, Any]]]]]:
    return {
        "toy": (toy_server.build(tmp_path / "ledger").streamable_http_app(host="127.0.0.1"), TOY_READS),
        "asking": (asking_server.build(None).streamable_http_app(host="127.0.0.1"), ASKING_READS),
    }


@pytest.mark.parametrize(("server", "era"), [("toy", "legacy"), ("toy", "2026-07-28"), ("asking", "legacy")])
async def test_a_read_past_the_sdk_client_gives_what_the_full_path_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: str, era: str
) -> None:
    app, calls = apps(tmp_path)[server]
    lean, asked_lean, ids_lean = await reads(tmp_path / "lean", app, era, calls, asks=server == "asking")
    monkeypatch.setattr(lean_http.LeanLeg, "of", classmethod(lambda cls, guard, client: None))
    app, calls = apps(tmp_path)[server]
    full, asked_full, ids_full = await reads(tmp_path / "full", app, era, calls, asks=server == "asking")
    assert lean == full
    assert asked_lean == asked_full and (
        server != "asking" or asked_lean == ["elicitation: ask_user: who are you?"] * 3
    )
    # A session's first read may go out before the server has taken its `notifications/initialized`:
    # the SDK's path carries it. Every later one goes past the SDK client.
    assert ids_lean[1:] and all(key.startswith(lean_http.PREFIX) for key in ids_lean[1:]), ids_lean
    assert ids_full and not any(key.startswith(lean_http.PREFIX) for key in ids_full), ids_full


async def test_a_read_past_the_sdk_client_that_runs_out_of_time_is_cancelled_at_the_backend(tmp_path: Path) -> None:
    backend = HandshakeOnly(toy_server.build(tmp_path / "ledger").streamable_http_app(host="127.0.0.1"))
    with anyio.fail_after(60):
        async with (
            over_http(backend) as url,
            front_over({"far": {"url": url, "timeout": 2}}, tmp_path) as (_, front),
            Client(front) as client,
        ):
            await client.call_tool("far__echo", {"text": "first"})  # the session's first read: the SDK's
            error = await call_error(client, "far__hang", {})
            cancelled = text_of(await client.call_tool("far__was_cancelled", {}))
    assert "did not answer tools/call hang within 2s" in error.message, error.message
    assert cancelled == "true"  # the backend heard notifications/cancelled for the read it was running
    assert str(backend.calls[1]["id"]).startswith(lean_http.PREFIX)  # and the read went out past the SDK
