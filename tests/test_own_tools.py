"""The proxy's own tools: `delegate` is offered only with the modes its engine can run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from mcp_spec_proxy.engine import MODES, Engine
from mcp_spec_proxy.fronts.own_tools import runnable_modes
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer
from tests import backends
from tests.harness import Proxied, proxied, stdio, text_of

pytestmark = pytest.mark.anyio


def test_runnable_modes_follow_the_weak_model_and_leash() -> None:
    def engine(weak: object | None, watch: object | None) -> Engine:
        return cast(Engine, SimpleNamespace(weak=weak, watch=watch))

    assert runnable_modes(None) == ()
    assert runnable_modes(engine(None, None)) == ("strong-only",)
    assert runnable_modes(engine(object(), None)) == ("spec", "weak-only", "strong-only")
    assert runnable_modes(engine(object(), object())) == MODES


@asynccontextmanager
async def proxy_with(tmp_path: Path, models: list[str], answer: Respond | None = None) -> AsyncIterator[Proxied]:
    """The proxy over the filesystem server, with the named models (all served by one script)."""
    root = tmp_path / "files"
    root.mkdir()
    async with ScriptedModelServer(answer or Respond(lambda request: "unused")) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0}
        config = {
            "servers": {"fs": stdio(backends.filesystem(root))},
            "models": {name: {**endpoint, "model": f"{name}-model"} for name in models},
            "review": {"default": "strong" if "strong" in models else "deny"},
        }
        async with proxied(config, tmp_path / "state") as p:
            yield p


async def test_delegate_with_only_the_strong_model_offers_and_runs_strong_only(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> Reply | str:
        assert request.model == "strong-model"
        return "Nothing to change."

    async with proxy_with(tmp_path, ["strong"], Respond(answer)) as p:
        listed = {tool.name: tool for tool in (await p.client.list_tools()).tools}
        ran = await p.client.call_tool("delegate", {"task": "Anything to do?"})
        spec = await p.client.call_tool("delegate", {"task": "Anything to do?", "mode": "spec"})
    mode = listed["delegate"].input_schema["properties"]["mode"]
    assert mode["enum"] == ["strong-only"] and mode["default"] == "strong-only"
    assert "weak model" not in (listed["delegate"].description or "")
    assert not ran.is_error and text_of(ran).startswith("Nothing to change.")
    assert spec.is_error and "mode must be one of strong-only" in text_of(spec)


async def test_delegate_with_both_models_offers_every_mode_but_leash(tmp_path: Path) -> None:
    async with proxy_with(tmp_path, ["weak", "strong"]) as p:
        listed = {tool.name: tool for tool in (await p.client.list_tools()).tools}
    mode = listed["delegate"].input_schema["properties"]["mode"]
    assert mode["enum"] == ["spec", "weak-only", "strong-only"] and mode["default"] == "spec"


async def test_delegate_is_not_listed_without_the_strong_model(tmp_path: Path) -> None:
    async with proxy_with(tmp_path, ["weak"]) as p:
        listed = {tool.name for tool in (await p.client.list_tools()).tools}
    assert "delegate" not in listed and "report_outcome" not in listed
    assert any(name.startswith("fs__") for name in listed)
