"""`/readyz` of a replica on the shared Postgres: not ready while its database does not answer,
ready again once it does — the load balancer stops sending it calls it would refuse — and not
ready on a database whose schema lacks a step this replica needs."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

from mcp_spec_proxy.fronts.probes import STORE_CHECK_S
from tests.harness import recorded, toy
from tests.pg import database_down, database_name, database_up, replica, rows

pytestmark = pytest.mark.anyio


KUBELET_PROBE_S = 1.0  # a kubelet's default `timeoutSeconds`: a slower answer is a failed probe


async def readyz(base: str, within: float = 30) -> httpx.Response:
    async with httpx.AsyncClient(timeout=within) as http:
        return await http.get(f"{base}/readyz")


async def test_readyz_is_not_ready_while_the_store_does_not_answer(
    tmp_path: Path, pg_dsn: str, postgres_server: str
) -> None:
    config = {"servers": {"toy": toy(tmp_path / "rec")}}
    with replica(config, tmp_path, pg_dsn, "a") as running:  # the store's default 5 s timeout
        base = running.url.removesuffix("/mcp")
        with anyio.fail_after(90):
            assert (await readyz(base)).json() == {"status": "ready"}
            name = database_name(pg_dsn)
            database_down(postgres_server, name)
            try:
                while True:  # the answer of a second ago is remembered: the next probes see the outage
                    answer = await readyz(base)
                    if answer.status_code == 503:
                        break
                    await anyio.sleep(0.1)
                assert answer.json()["reasons"] == ["store: the database does not answer"]
                for _ in range(5):  # as a kubelet probes: each answer within its default 1 s timeout
                    assert (await readyz(base, within=KUBELET_PROBE_S)).status_code == 503
                    await anyio.sleep(STORE_CHECK_S)  # past the remembered answer: the store is asked again
            finally:
                database_up(postgres_server, name)
            while True:
                if (await readyz(base)).status_code == 200:
                    break
                await anyio.sleep(0.1)


async def test_readyz_is_not_ready_on_a_schema_older_than_the_replica(tmp_path: Path, pg_dsn: str) -> None:
    config = {"servers": {"toy": toy(tmp_path / "rec")}}
    with replica(config, tmp_path, pg_dsn, "a") as running:
        base = running.url.removesuffix("/mcp")
        with anyio.fail_after(90):
            assert (await readyz(base)).status_code == 200
            rows(pg_dsn, "DELETE FROM schema_version WHERE version = 1 RETURNING version")  # as an older database
            while True:
                answer = await readyz(base)
                if answer.status_code == 503:
                    break
                await anyio.sleep(0.1)
            assert answer.json()["reasons"] == [
                "store: the database's schema is older than this proxy's (run `mcp-spec-proxy store migrate`)"
            ]


async def test_metrics_count_the_audit_lines_the_store_refused_and_the_write_they_stopped(
    tmp_path: Path, pg_dsn: str, postgres_server: str
) -> None:
    ledger = tmp_path / "rec"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    with replica(config, tmp_path, pg_dsn, "a", timeout=2) as running:
        base = running.url.removesuffix("/mcp")
        with anyio.fail_after(90):
            name = database_name(pg_dsn)
            async with (
                httpx2.AsyncClient(timeout=60) as http,
                Client(streamable_http_client(running.url, http_client=http)) as client,
            ):
                await client.list_tools()
                database_down(postgres_server, name)
                try:
                    with pytest.raises(MCPError, match="was not forwarded"):
                        await client.call_tool("toy__record", {"value": "no audit, no write"})
                finally:
                    database_up(postgres_server, name)
            async with httpx.AsyncClient(timeout=30) as probe:
                text = (await probe.get(f"{base}/metrics")).text
    assert recorded(ledger) == []
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("mcp_spec_proxy_store_errors_total", (("operation", "record"),))] >= 1.0
    assert samples[("mcp_spec_proxy_held_calls", ())] == 0.0  # the refused write holds nothing
