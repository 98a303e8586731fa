"""The running proxy: config, state, catalog, backends, reviewers and barrier, assembled once.

`running_proxy(config, state_dir)` is an async context manager: on entry every enabled backend
is started in its own task and given until its `startup_timeout` to connect (one that fails is
logged as unavailable and retried with backoff). It yields once the backends are ready in the
sense of `BackendPool.ready`: all settled, or the rest quiet (none settling, our child processes
neither running, waiting for a CPU nor reading from disk) for a short window. A backend hung in
its handshake then never holds up the others for its `startup_timeout`; when it connects, its
tools enter the catalog through the same checks as everyone's and `Proxy.changed("tools")` tells
the fronts, which announce the change to their clients. On exit every child process is stopped.
The fronts (`fronts/mcp.py`) serve clients from the `Proxy` it yields.

Models (the `openai` client) and LEASH (numpy, FAISS) are imported only when the config names
them: a plain proxy does not pay for them in start-up time or memory.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.lowlevel import Server

from mcp_spec_proxy.backends import BackendPool, Listing, Notice, OnNotice
from mcp_spec_proxy.backends.oauth import BackendAuth, backend_logins
from mcp_spec_proxy.calls.access import Access
from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.calls.gate import Gate
from mcp_spec_proxy.config.identity import introspection_secret
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.engine import Engine
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.models import ChatModel
from mcp_spec_proxy.observe.telemetry import Telemetry, Tracing, open_tracing, otel_missing
from mcp_spec_proxy.prespawn import Prespawned
from mcp_spec_proxy.review.build import build_reviewers, console_queue
from mcp_spec_proxy.review.console import ConsoleQueue
from mcp_spec_proxy.sessions.barrier import Barrier
from mcp_spec_proxy.store import StatePaths as StatePaths  # where commands and tests have always found it
from mcp_spec_proxy.store import Store, open_store, postgres_dsn, token_stores
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash
    from mcp_spec_proxy.observe.metrics import Metrics  # the Prometheus client: only where `/metrics` is served

logger = logging.getLogger(__name__)

ChangeListener = Callable[[str], Awaitable[None]]
"""Told `"tools"`, `"prompts"` or `"resources"` when that list changed."""


@dataclass
class Proxy:
    config: ProxyConfig
    catalog: Catalog
    backends: BackendPool
    barrier: Barrier
    gate: Gate
    audit: AuditSink
    telemetry: Telemetry
    store: Store
    engine: Engine | None = None  # when a strong model is configured: `delegate`, `run`, the gateway
    leash: Leash | None = None
    listeners: list[ChangeListener] = field(default_factory=list)
    console: ConsoleQueue | None = None  # the held writes the approval console front shows
    logins: Mapping[str, BackendAuth] = field(default_factory=dict)  # the URL backends' OAuth clients, by server
    notices: list[OnNotice] = field(default_factory=list)  # told each backend's log message and resource update
    metrics: Metrics | None = None  # what `/metrics` shows (observe/metrics.py); None where nothing serves it
    access: Access = field(default_factory=lambda: Access(()))  # what each principal sees (calls/access.py)
    auth_secret: str | None = None  # the introspection client's secret (`auth.introspection`), read at start

    async def changed(self, what: str) -> None:
        for listener in list(self.listeners):
            await listener(what)

    async def notice(self, notice: Notice) -> None:
        for listener in list(self.notices):
            await listener(notice)


def _lists(catalog: Catalog) -> dict[str, Any]:
    """What clients are shown of each list, to tell which changed (each is announced on its own)."""
    return {
        "tools": {tool.name: tool.definition for tool in catalog.tools()},
        "prompts": [(entry.name, prompt) for entry, prompt in catalog.prompts()],
        "resources": (list(catalog.resources()), list(catalog.resource_templates())),
    }


def open_models(config: ProxyConfig, environ: Mapping[str, str], source: str = "config") -> dict[str, ChatModel]:
    """The configured endpoints with their API keys, read from `environ` (the CLI hands it the
    process environment). The one way models are built: a key named in `api_key_env` is never
    dropped; unset, it is a `ConfigError`."""
    models = {}
    for name, endpoint in config.models.items():
        models[name] = ChatModel(name, endpoint, api_key=_key(environ, endpoint.api_key_env, f"models.{name}", source))
    return models


def open_leash(
    config: ProxyConfig,
    environ: Mapping[str, str],
    source: str = "config",
    *,
    telemetry: Telemetry | None = None,
    strict: bool = False,
) -> Leash | None:
    """The configured LEASH (its banks opened), or None without a `leash:` section."""
    if config.leash is None:
        return None
    from mcp_spec_proxy.leash.layers import Leash  # numpy and FAISS: paid for only by a config that uses them

    embedding = config.leash.embedding
    key = _key(environ, embedding.api_key_env if embedding else None, "leash.embedding", source)
    weak = config.models.get("weak")
    hidden = weak.hidden_state_source if weak else ""
    native = weak is not None and weak.hidden_states == "native"  # else `hidden`'s fallback stands in
    dsn = postgres_dsn(config, environ, source)
    if dsn is None:
        return Leash.open(
            config.leash, api_key=key, hidden_model=hidden, hidden_native=native, telemetry=telemetry, strict=strict
        )
    try:
        from mcp_spec_proxy.leash.pgvector import PgBank  # the banks of every replica, in pgvector
    except ImportError as exc:
        raise ConfigError(
            source, "store.postgres", f"{exc.name} is not installed", "pip install 'mcp-spec-proxy[postgres]'"
        ) from None
    opener = PgBank.opener(dsn)
    return Leash.open(
        config.leash,
        api_key=key,
        hidden_model=hidden,
        hidden_native=native,
        telemetry=telemetry,
        strict=strict,
        open_bank=opener,
    )


def _key(environ: Mapping[str, str], variable: str | None, where: str, source: str) -> str | None:
    if not variable:
        return None
    key = environ.get(variable)
    if not key:
        raise ConfigError(
            source,
            f"{where}.api_key_env",
            f"environment variable {variable} is not set",
            "export it, or remove api_key_env for a server that needs no key",
        )
    return key


async def validate(config: ProxyConfig, environ: Mapping[str, str], source: str = "config") -> None:
    """Everything `running_proxy` checks before it starts a backend: keys, LEASH's banks, the
    reviewers every review mode needs. `mcp-spec-proxy check` runs this, so `ok` means the proxy starts."""
    postgres_dsn(config, environ, source)  # its variable is set (the database is reached at start)
    token_stores(config, Path(), environ, source)  # the key of the tokens it keeps in the database is set
    introspection_secret(config.auth, environ, source)
    _otlp(config, source)  # the exporter is installed (the receiver is reached only by the spans)
    models = open_models(config, environ, source)
    leash: Leash | None = None
    try:
        leash = open_leash(config, environ, source)
        build_reviewers(config, Catalog(config, FingerprintStore(None)), models, source, leash)
    finally:
        with anyio.CancelScope(shield=True):
            if leash is not None:
                await leash.aclose()
            for model in models.values():
                await model.aclose()


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
    environ: Mapping[str, str] | None = None,
    early: Prespawned | None = None,
    metered: bool = True,
) -> AsyncIterator[Proxy]:
    """Start the proxy. Models and LEASH are built from the config with the keys in `environ`
    (the CLI hands it the process environment; a key named but not there is a `ConfigError`);
    tests may hand in `models` or an opened `leash` instead. `early` is the launcher's stdio
    processes, which the backends' first connections adopt. `metered`: count calls, verdicts and
    backend states for `/metrics` (a front on stdio, which serves no `/metrics`, leaves it off, and
    with it the Prometheus client's import)."""
    environ = environ if environ is not None else {}
    auth_secret = introspection_secret(config.auth, environ, source)
    models = models if models is not None else open_models(config, environ, source)
    logins = (
        backend_logins(
            config.active_servers(), state.root, environ, source, token_stores(config, state.root, environ, source)
        )
        if state is not None
        else {}
    )
    events = Telemetry(telemetry)
    try:
        async with open_store(config, state, environ, source) as store:
            # After the store: a Postgres store has migrated the tables its banks live in.
            if leash is None:
                leash = open_leash(config, environ, source, telemetry=events)
            # After the store too: it numbers the replica the spans name. Before the fronts, which
            # keep the SDK's span middleware only where a tracer provider is installed.
            async with (
                open_tracing(_otlp(config, source), getattr(store, "replica", None)) as tracing,
                _running(
                    config, state, store, models, events, in_process, leash, source, tracing, early, logins, metered
                ) as proxy,
            ):
                proxy.auth_secret = auth_secret
                yield proxy
    finally:
        events.close()
        if leash is not None:
            with anyio.CancelScope(shield=True):
                await leash.aclose()
        for model in models.values():
            with anyio.CancelScope(shield=True):
                await model.aclose()


def _otlp(config: ProxyConfig, source: str) -> str | None:
    """The OTLP receiver of `telemetry.otlp`; set without the `otel` extra, a `ConfigError`."""
    if config.otlp is not None and (missing := otel_missing()) is not None:
        raise ConfigError(source, "telemetry.otlp", f"{missing} is not installed", "pip install 'mcp-spec-proxy[otel]'")
    return config.otlp


@asynccontextmanager
async def _running(
    config: ProxyConfig,
    state: StatePaths | None,
    store: Store,
    models: dict[str, ChatModel],
    events: Telemetry,
    in_process: dict[str, Server[Any]] | None,
    leash: Leash | None,
    source: str,
    tracing: Tracing,
    early: Prespawned | None = None,
    logins: Mapping[str, BackendAuth] | None = None,
    metered: bool = True,
) -> AsyncIterator[Proxy]:
    catalog = Catalog(config, store.fingerprints)
    reviewers, repairer = build_reviewers(config, catalog, models, source, leash)
    metrics: Metrics | None = None
    audit: AuditSink = store.audit
    if metered:
        from mcp_spec_proxy.observe.metrics import MeteredAudit, Metrics

        metrics = Metrics()
        audit = MeteredAudit(store.audit, metrics)
        events.listeners.append(metrics.telemetry)
    proxy: Proxy | None = None

    async def on_listing(server: str, listing: Listing | None) -> None:
        before = _lists(catalog)
        catalog.set_tools(server, listing.tools if listing else None, listing.only_tools if listing else None)
        catalog.set_prompts(server, listing.prompts if listing else None, listing.only_prompts if listing else None)
        catalog.set_resources(server, listing.resources if listing else None, listing.templates if listing else None)
        after = _lists(catalog)
        announced = listing.announced if listing else frozenset()
        for what in ("tools", "prompts", "resources"):
            if proxy is not None and (before[what] != after[what] or what in announced):
                await proxy.changed(what)

    async def on_notice(notice: Notice) -> None:
        if proxy is not None:
            await proxy.notice(notice)

    backends = BackendPool(
        config.active_servers(),
        on_listing,
        log_dir=state.logs if state else None,
        in_process=in_process,
        on_notice=on_notice,
        early=early,
        logins=logins,
    )
    if metrics is not None:
        metrics.watch_backends(backends)
    gate = Gate(config, backends, reviewers, audit, leash, catalog, tracing)
    barrier = Barrier(config, catalog, gate, events, repairer, store.sessions)
    engine = None
    strong = models.get(config.review.model)
    if strong is not None:
        watch = None
        if leash is not None:
            from mcp_spec_proxy.leash.watch import LeashWatch

            watch = LeashWatch(leash)
        engine = Engine(
            catalog,
            gate,
            events,
            weak=models.get("weak"),
            strong=strong,
            policy=config.review.policy,
            unreadable=config.review.unreadable,
            limits=config.speculation,
            watch=watch,
        )
    proxy = Proxy(config, catalog, backends, barrier, gate, audit, events, store, engine, leash, metrics=metrics)
    proxy.access = Access(config.access)
    proxy.console = console_queue(reviewers)
    proxy.logins = logins or {}
    waiting = [auth for auth in proxy.logins.values() if auth.interactive]
    if waiting:
        # A login a person finishes: shown on the approval console ("log in to SERVER"), served for
        # that alone where no review waits there, and a call to the server's tools meanwhile says where.
        queue = proxy.console if proxy.console is not None else ConsoleQueue(config.review.timeout)
        proxy.console = queue
        catalog.login_note = queue.login_note
        for auth in waiting:
            auth.watchers.append(queue.login)
    async with anyio.create_task_group() as tg:
        await tg.start(store.run)
        await tg.start(backends.run)
        # Start-up may wait: a shared store's first listings are merged (its database judges a first
        # listing; until then their tools are held), bounded by the store's timeout.
        await catalog.refresh_fingerprints(settle=True)
        logger.info("serving %d tools from %s", len(catalog.tools()), ", ".join(catalog.servers()) or "no backend")
        yield proxy
        tg.cancel_scope.cancel()
