"""`/metrics` scraped over real HTTP after a read, a write that ran, one refused and one held.

The counts are checked against the backend's ledger and the audit trail, the ground truth they
are read from: a call that ran is counted once, as what its audit line says became of it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client, MCPError
from prometheus_client.parser import text_string_to_metric_families

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.observe.metrics import Metrics
from mcp_spec_proxy.observe.telemetry import Telemetry
from mcp_spec_proxy.proxy import Proxy, StatePaths, running_proxy
from mcp_spec_proxy.review.console import Decision
from tests.harness import recorded, toy, toy_twins

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def scraped_proxy(tmp: Path) -> AsyncIterator[tuple[str, Proxy]]:
    raw = {
        "servers": {
            "a": toy(tmp / "a-rec"),
            "b": toy(tmp / "b-rec", tools={"overrides": {"record": {"review": "deny"}}}),
            "c": toy(tmp / "c-rec", tools={"overrides": {"record": {"review": "console"}}}),
        },
        "review": {"default": "allow", "intent": False},
    }
    config = ProxyConfig.model_validate(raw)
    async with (
        running_proxy(config, StatePaths(tmp / "state"), in_process=toy_twins(raw)) as proxy,
        anyio.create_task_group() as tg,
    ):
        port = await tg.start(lambda task_status: serve_http(McpFront(proxy), "127.0.0.1", 0, task_status=task_status))
        yield f"http://127.0.0.1:{port}", proxy
        tg.cancel_scope.cancel()


async def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.get(f"{base}/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def calls(server: str, tool: str, effect: str, outcome: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    labels = {"server": server, "tool": tool, "effect": effect, "outcome": outcome}
    return ("mcp_spec_proxy_calls_total", tuple(sorted(labels.items())))


def sample(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


async def test_metrics_count_each_call_as_its_audit_line_says_with_verdicts_held_calls_and_backends(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with scraped_proxy(tmp_path) as (base, proxy), Client(f"{base}/mcp") as client:
            await client.call_tool("a__echo", {"text": "a read"})
            ran = await client.call_tool("a__record", {"value": "ran"})
            refused = await client.call_tool("b__record", {"value": "refused"})
            assert not ran.is_error and refused.is_error
            queue = proxy.console
            assert queue is not None
            queue.url = "http://127.0.0.1:9/"  # as the console front sets it while it serves
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "c__record", {"value": "held"})
                while not queue.pending():
                    await queue.changed_since(queue.version)
                during = await scrape(base)
                item = queue.pending()[0]
                queue.decide(item.id, item.digest, Decision("approve"))
            after = await scrape(base)

    assert during[sample("mcp_spec_proxy_held_calls")] == 1.0
    assert after[sample("mcp_spec_proxy_held_calls")] == 0.0
    assert after[calls("a", "a__echo", "read", "forwarded")] == 1.0
    assert after[calls("a", "a__record", "write", "forwarded")] == 1.0
    assert after[calls("b", "b__record", "write", "blocked")] == 1.0
    assert after[calls("c", "c__record", "write", "forwarded")] == 1.0
    assert during.get(calls("c", "c__record", "write", "forwarded"), 0.0) == 0.0  # counted once it settled
    assert after[sample("mcp_spec_proxy_verdicts_total", reviewer="allow", verdict="accepted")] == 1.0
    assert after[sample("mcp_spec_proxy_verdicts_total", reviewer="deny", verdict="rejected")] == 1.0
    assert after[sample("mcp_spec_proxy_verdicts_total", reviewer="console", verdict="accepted")] == 1.0
    assert after[sample("mcp_spec_proxy_review_seconds_count", reviewer="console")] == 1.0
    for server in ("a", "b", "c"):
        assert after[sample("mcp_spec_proxy_backend_up", server=server)] == 1.0
        assert after[sample("mcp_spec_proxy_backend_state", server=server, state="connected")] == 1.0
        assert after[sample("mcp_spec_proxy_backend_restarts_total", server=server)] == 0.0
    assert after.get(sample("mcp_spec_proxy_store_errors_total", operation="record"), 0.0) == 0.0
    # The ground truth the counts stand for: the ledgers.
    assert [json.loads(line)["value"] for line in recorded(tmp_path / "a-rec")] == ["ran"]
    assert recorded(tmp_path / "b-rec") == []
    assert [json.loads(line)["value"] for line in recorded(tmp_path / "c-rec")] == ["held"]


async def test_metrics_show_a_backend_that_died_restarting_and_back(tmp_path: Path) -> None:
    raw = {"servers": {"toy": toy(tmp_path / "rec")}}  # a real process: its death is the thing under test
    config = ProxyConfig.model_validate(raw)
    with anyio.fail_after(60):
        async with (
            running_proxy(config, StatePaths(tmp_path / "state")) as proxy,
            anyio.create_task_group() as tg,
        ):
            port = await tg.start(
                lambda task_status: serve_http(McpFront(proxy), "127.0.0.1", 0, task_status=task_status)
            )
            base = f"http://127.0.0.1:{port}"
            async with Client(f"{base}/mcp") as client:
                with pytest.raises(MCPError):
                    await client.call_tool("toy__crash", {})  # the process exits at once
            backend = proxy.backends.get("toy")
            while True:  # the death is seen, and the restart made, on the backend's own time
                if backend.restarts >= 1 and backend.status == "connected":
                    break
                await anyio.sleep(0.05)
            after = await scrape(base)
            tg.cancel_scope.cancel()
    assert after[sample("mcp_spec_proxy_backend_restarts_total", server="toy")] == 1.0
    assert after[sample("mcp_spec_proxy_backend_up", server="toy")] == 1.0
    assert after[calls("toy", "toy__crash", "read", "forwarded")] == 1.0


async def test_leash_decisions_are_counted_from_its_telemetry_records() -> None:
    metrics = Metrics()
    events = Telemetry(None)  # no file: the records are still heard
    events.listeners.append(metrics.telemetry)
    await events.record("leash", layer="route", strong_led=True)
    await events.record("leash", layer="escalate", tool="t")
    await events.record("leash", layer="observe", tool="t", flagged=False)
    await events.record("leash", layer="observe", tool="t", flagged=True)
    await events.record("leash", layer="label", stored=3)  # a label is no decision
    text = metrics.render().decode()
    found = {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "mcp_spec_proxy_leash_decisions_total"
    }
    assert found == {
        (("decision", "strong"), ("layer", "route")): 1.0,
        (("decision", "escalate"), ("layer", "escalate")): 1.0,
        (("decision", "pass"), ("layer", "observe")): 1.0,
        (("decision", "flag"), ("layer", "observe")): 1.0,
    }
