"""`mcp-spec-proxy audit --session NAME` finds the calls of the session a 2026-07-28 client named NAME (the
`Mcp-Spec-Proxy-Session` header), though the trail calls that session by a digest of its name (and, under
`auth:`, of its principal): over real HTTP with the files store, under `auth:` with the front's own keying,
and from Postgres."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.sessions.barrier import Session
from mcp_spec_proxy.sessions.named_sessions import NamedSessions
from mcp_spec_proxy.store import StatePaths, open_store
from mcp_spec_proxy.store.postgres import read_audit_once, read_audit_principals_once
from mcp_spec_proxy.trajectory import History
from tests.harness import PROXY_COMMAND, proxy_env, toy
from tests.pg import DSN_ENV
from tests.test_first_hour import http_served


def audit(config: Path, state: Path, *args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [PROXY_COMMAND, "-c", str(config), "--state-dir", str(state), "audit", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=proxy_env(),
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.anyio
async def test_audit_finds_a_named_sessions_calls_by_the_name_the_client_sent(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "allow"}}))
    with anyio.fail_after(60):
        async with http_served(tmp_path, config) as (proxy, url):
            async with Client(url, mode="2026-07-28") as client:  # a request that names no session
                await client.call_tool("toy__record", {"value": "unnamed"})
            named = httpx2.AsyncClient(headers={"Mcp-Spec-Proxy-Session": "conversation-1"})
            async with named, Client(streamable_http_client(url, http_client=named), mode="2026-07-28") as client:
                await client.call_tool("toy__record", {"value": "named"})
                await client.call_tool("toy__record", {"value": "named again"})
            proxy.process.send_signal(signal.SIGTERM)
            await proxy.rest()

    found = audit(config, tmp_path / "s", "--session", "conversation-1")

    assert {row["session"] for row in found} == {found[0]["session"]}
    assert found[0]["session"].startswith("named-")
    assert [row.get("tool") for row in found if row["event"] == "held"] == ["toy__record", "toy__record"]
    assert [row["event"] for row in found].count("forwarded") == 2  # the two named calls, not the unnamed one
    assert audit(config, tmp_path / "s", "--session", found[0]["session"]) == found  # its id still works
    assert audit(config, tmp_path / "s", "--session", "conversation-2") == []


@pytest.mark.anyio
async def test_under_auth_a_name_finds_each_principals_session_of_that_name(tmp_path: Path) -> None:
    auth = {"issuer": "https://id.example.com/", "audience": "https://proxy.example.com/mcp"}
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {"toy": {"command": "npx"}}, "auth": auth}))
    ann = Principal(auth["issuer"], "ann", "desktop")
    bob = Principal(auth["issuer"], "bob", None)
    named = NamedSessions(lambda key, principal: Session(key or "unnamed", History(), principal=principal))
    header = {"mcp-spec-proxy-session": "conversation-1"}
    request = type("Request", (), {"headers": header})()
    sessions = [named.session(request, None, who) for who in (ann, bob)]  # the front's own keying
    other = named.session(type("Request", (), {"headers": {"mcp-spec-proxy-session": "other"}})(), None, ann)
    state = tmp_path / "state"
    async with open_store(ProxyConfig(), StatePaths(state), {}) as store:
        for session in [*sessions, other]:
            assert session.principal is not None
            await store.audit.record(
                "held", call=f"c-{session.id}", session=session.id, principal=session.principal.audit_fields()
            )

    found = audit(config, state, "--session", "conversation-1")

    assert {row["session"] for row in found} == {session.id for session in sessions}
    assert [
        row["principal"]["sub"] for row in audit(config, state, "--session", "conversation-1", "--principal", "bob")
    ] == ["bob"]


@pytest.mark.anyio
async def test_postgres_reads_the_rows_of_any_of_several_sessions_and_the_principals_named(pg_dsn: str) -> None:
    config = ProxyConfig.model_validate({"store": {"postgres": {"dsn_env": DSN_ENV}}})
    async with open_store(config, None, {DSN_ENV: pg_dsn}) as store:
        await store.audit.record("held", call="c1", session="a", principal={"sub": "ann", "client_id": "desk"})
        await store.audit.record("held", call="c2", session="b", principal={"sub": "bob", "client_id": None})
        await store.audit.record("held", call="c3", session="c", principal={"sub": "ann", "client_id": "desk"})

    found = await read_audit_once(pg_dsn, 10, ["a", "b"])
    principals = await read_audit_principals_once(pg_dsn, 10)

    assert [row["call"] for row in found] == ["c1", "c2"]
    assert sorted(principals, key=str) == [("ann", "desk"), ("bob", None)]
