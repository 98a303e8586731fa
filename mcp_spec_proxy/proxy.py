"""The running proxy: config, state, catalog, backends, reviewers and barrier, assembled once.

`running_proxy(config, state_dir)` is an async context manager: on entry every enabled backend
is started in its own task and given until its `startup_timeout` to connect (one that fails is
logged as unavailable and retried with backoff; it never holds up the others); on exit every
child process is stopped. The fronts (`fronts/mcp.py`) serve clients from the `Proxy` it yields.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp.server import Server

from mcp_spec_proxy.audit import AuditLog
from mcp_spec_proxy.backends import BackendPool, Listing
from mcp_spec_proxy.barrier import Barrier
from mcp_spec_proxy.catalog import Catalog
from mcp_spec_proxy.config import ProxyConfig
from mcp_spec_proxy.engine import Engine, Limits
from mcp_spec_proxy.fingerprints import FingerprintStore
from mcp_spec_proxy.gate import Gate
from mcp_spec_proxy.leash.layers import Leash, LeashWatch
from mcp_spec_proxy.models import ChatModel
from mcp_spec_proxy.review import build_reviewers
from mcp_spec_proxy.telemetry import Telemetry

logger = logging.getLogger(__name__)

ChangeListener = Callable[[str], Awaitable[None]]
"""Told `"tools"`, `"prompts"` or `"resources"` when that list changed."""


@dataclass(frozen=True)
class StatePaths:
    root: Path

    @property
    def fingerprints(self) -> Path:
        return self.root / "fingerprints.json"

    @property
    def audit(self) -> Path:
        return self.root / "audit.jsonl"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


@dataclass
class Proxy:
    config: ProxyConfig
    catalog: Catalog
    backends: BackendPool
    barrier: Barrier
    gate: Gate
    audit: AuditLog
    telemetry: Telemetry
    engine: Engine | None = None  # when a strong model is configured: `delegate`, `run`, the gateway
    leash: Leash | None = None
    listeners: list[ChangeListener] = field(default_factory=list)

    async def changed(self, what: str) -> None:
        for listener in list(self.listeners):
            await listener(what)


@asynccontextmanager
async def running_proxy(
    config: ProxyConfig,
    state: StatePaths | None,
    *,
    source: str = "config",
    models: dict[str, ChatModel] | None = None,
    telemetry: Path | None = None,
    in_process: dict[str, Server[Any]] | None = None,
    leash: Leash | None = None,
) -> AsyncIterator[Proxy]:
    """Start the proxy. `models` are the configured endpoints with their keys, `leash` the opened
    banks (the CLI reads keys and opens banks; left out, both are built from the config)."""
    models = models if models is not None else {name: ChatModel(name, cfg) for name, cfg in config.models.items()}
    events = Telemetry(telemetry)
    if leash is None and config.leash is not None:
        weak = models.get("weak")
        leash = Leash.open(config.leash, hidden_model=weak.config.hidden_state_source if weak else "", telemetry=events)
    fingerprints = FingerprintStore(state.fingerprints if state else None)
    catalog = Catalog(config, fingerprints)
    reviewers, repairer = build_reviewers(config, catalog, models, source, leash)
    audit = AuditLog(state.audit if state else None)
    proxy: Proxy | None = None

    async def on_listing(server: str, listing: Listing | None) -> None:
        before = {t.name: t.definition for t in catalog.tools()}
        catalog.set_tools(server, listing.tools if listing else None)
        catalog.set_prompts(server, listing.prompts if listing else None)
        catalog.set_resources(server, listing.resources if listing else None, listing.templates if listing else None)
        if proxy is not None and before != {t.name: t.definition for t in catalog.tools()}:
            await proxy.changed("tools")

    backends = BackendPool(
        config.active_servers(), on_listing, log_dir=state.logs if state else None, in_process=in_process
    )
    gate = Gate(config, backends, reviewers, audit, leash)
    barrier = Barrier(config, catalog, gate, events, repairer)
    engine = None
    strong = models.get(config.review.model)
    if strong is not None:
        limits = Limits(**config.speculation.model_dump())
        engine = Engine(
            catalog,
            gate,
            events,
            weak=models.get("weak"),
            strong=strong,
            policy=config.review.policy,
            unreadable=config.review.unreadable,
            limits=limits,
            watch=LeashWatch(leash) if leash is not None else None,
        )
    proxy = Proxy(config, catalog, backends, barrier, gate, audit, events, engine, leash)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(backends.run)
            logger.info("serving %d tools from %s", len(catalog.tools()), ", ".join(catalog.servers()) or "no backend")
            yield proxy
            tg.cancel_scope.cancel()
    finally:
        audit.close()
        events.close()
        if leash is not None:
            with anyio.CancelScope(shield=True):
                await leash.aclose()
        for model in models.values():
            with anyio.CancelScope(shield=True):
                await model.aclose()
