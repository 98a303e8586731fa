"""The probes as a kubelet or a load balancer meets them: the real `--http` command, its port.

The port listens before the proxy serves (a TCP check passes at once), so `/readyz` is what says
when to send traffic: "starting" while the backends start, not ready while one of them is not
connected, ready only once tools/list answers. The probes answer without the token and whatever
the Host; `/metrics` and `/mcp` do not.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.harness import toy
from tests.ops_world import SERVING, serving

pytestmark = pytest.mark.anyio


async def tool_names(url: str, token: str | None = None) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        return sorted(tool.name for tool in (await client.list_tools()).tools)


def release(fifo: Path) -> None:
    """Let a toy started with `--start-after fifo` go on (opening the pipe blocks until it reads)."""
    with open(fifo, "wb"):
        pass


async def test_readyz_says_starting_until_the_proxy_serves_and_ready_once_tools_list_answers(tmp_path: Path) -> None:
    fifo = tmp_path / "start"
    os.mkfifo(fifo)
    config = {"servers": {"late": toy(tmp_path / "rec", "--start-after", str(fifo), startup_timeout=600)}}
    async with serving(config, tmp_path) as proxy:
        with anyio.fail_after(60):
            assert (await proxy.get("/healthz")).json() == {"status": "ok"}  # alive while it starts
            ready = await proxy.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.json()["reasons"] == ["starting: the proxy does not serve yet"]
            early = await proxy.get("/mcp")
            assert early.status_code == 503 and "starting" in early.text  # the port answers, the front does not
            assert not [line for line in proxy.lines if SERVING.search(line)]

            await anyio.to_thread.run_sync(release, fifo)
            url = (await proxy.line(SERVING)).group(1)
            ready = await proxy.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json() == {"status": "ready"}
            assert "late__echo" in await tool_names(url)  # ready means tools/list answers


async def test_readyz_is_not_ready_while_a_backend_is_not_connected_though_the_others_serve(tmp_path: Path) -> None:
    fifo = tmp_path / "start"
    os.mkfifo(fifo)
    config = {
        "servers": {
            "fast": toy(tmp_path / "fast-rec"),
            "late": toy(tmp_path / "late-rec", "--start-after", str(fifo), startup_timeout=600),
        }
    }
    async with serving(config, tmp_path) as proxy:
        with anyio.fail_after(60):
            url = (await proxy.line(SERVING)).group(1)
            assert "fast__echo" in await tool_names(url)  # the proxy serves what is connected
            ready = await proxy.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.json()["reasons"] == ["1 of 2 backends not connected"]  # a count, never a name

            await anyio.to_thread.run_sync(release, fifo)
            while True:  # a probe's period: the backend connects on its own time
                if (await proxy.get("/readyz")).status_code == 200:
                    break
                await anyio.sleep(0.05)
            assert "late__echo" in await tool_names(url)


async def test_probes_need_no_token_nor_host_but_metrics_and_the_front_do(tmp_path: Path) -> None:
    config = {"servers": {"toy": toy(tmp_path / "rec")}}
    async with serving(config, tmp_path, "--token-env", "OPS_TOKEN", env={"OPS_TOKEN": "s3cret"}) as proxy:
        with anyio.fail_after(60):
            url = (await proxy.line(SERVING)).group(1)
            pod = {"Host": "10.1.2.3:8080"}  # a kubelet reaches the pod by its address, with no token
            assert (await proxy.get("/healthz", headers=pod)).status_code == 200
            ready = await proxy.get("/readyz", headers=pod)
            assert ready.status_code == 200 and ready.json() == {"status": "ready"}
            assert (await proxy.get("/metrics", headers=pod)).status_code == 401
            scraped = await proxy.get("/metrics", headers={**pod, "Authorization": "Bearer s3cret"})
            assert scraped.status_code == 200 and "mcp_spec_proxy_backend_up" in scraped.text
            async with httpx2.AsyncClient(timeout=30) as http:
                refused = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert refused.status_code == 401
            assert "toy__echo" in await tool_names(url, "s3cret")


async def test_metrics_without_a_token_refuse_a_foreign_host(tmp_path: Path) -> None:
    config = {"servers": {"toy": toy(tmp_path / "rec")}}
    async with serving(config, tmp_path) as proxy:
        with anyio.fail_after(60):
            await proxy.line(SERVING)
            assert (await proxy.get("/metrics", headers={"Host": "evil.example"})).status_code == 421
            assert (await proxy.get("/readyz", headers={"Host": "evil.example"})).status_code == 200
            assert (await proxy.get("/metrics")).status_code == 200
