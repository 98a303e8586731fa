"""`GET /v1/models` lists what can run with this config, nothing more: `spec+leash` only with a `leash:`
section, `spec` and `weak-only` only with a weak model (asked over HTTP, as a client asks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.proxy import StatePaths, running_proxy

pytestmark = pytest.mark.anyio

MODEL = {"base_url": "http://127.0.0.1:9/v1", "model": "never-called", "max_retries": 0}


async def listed(tmp_path: Path, **config: Any) -> list[str]:
    with anyio.fail_after(60):
        async with (
            running_proxy(ProxyConfig.model_validate(config), StatePaths(tmp_path / "state")) as proxy,
            anyio.create_task_group() as tg,
        ):
            front = Gateway(proxy)
            port = await tg.start(lambda task_status: serve_gateway(front, "127.0.0.1", 0, task_status=task_status))
            async with httpx.AsyncClient() as http:
                answer = await http.get(f"http://127.0.0.1:{port}/v1/models")
            tg.cancel_scope.cancel()
    assert answer.status_code == 200
    return [model["id"] for model in answer.json()["data"]]


async def test_spec_leash_is_listed_only_with_leash(tmp_path: Path) -> None:
    models = {"weak": MODEL, "strong": MODEL}

    without = await listed(tmp_path / "a", models=models)
    with_leash = await listed(
        tmp_path / "b", models=models, leash={"encoder": "hashing", "bank_dir": str(tmp_path / "banks")}
    )

    assert without == ["mcp-spec-proxy", "spec", "weak-only", "strong-only"]
    assert with_leash == ["mcp-spec-proxy", "spec", "weak-only", "strong-only", "spec+leash"]


async def test_a_strong_model_alone_lists_strong_only(tmp_path: Path) -> None:
    assert await listed(tmp_path, models={"strong": MODEL}) == ["strong-only"]
