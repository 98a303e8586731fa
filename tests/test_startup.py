"""Start-up: what a plain proxy loads, and backends that are slow or hang in their handshake.

A proxy without models or LEASH never imports `openai`, numpy or FAISS, and one serving stdio without
`auth:` or a `client_credentials` login never imports httpx, PyJWT or the Prometheus client (the probe
runs the real command in its own process and reads its `sys.modules` at exit; the same probe sees
them load when the config names a model or LEASH). A backend still in its handshake does not hold up the
first `tools/list`: the others are served, and its tools arrive later as a list change, through
the same catalog checks (classification, rug-pull guard) as tools listed at start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp_spec_proxy.backends import progress
from mcp_spec_proxy.tools.fingerprints import SERVERS
from tests.harness import ERAS, proxied, text_of, toy
from tests.test_cli import TOY_TOOLS, effects, parse_rows, run_proxy, toy_config
from tests.test_resilience import ToolChanges

pytestmark = pytest.mark.anyio

# Loaded only where a config asks for them: a model, LEASH; `auth:` at an HTTP front (httpx, jwt), a
# `client_credentials` login (jwt), `/metrics` (prometheus_client).
HEAVY = ("openai", "numpy", "faiss", "httpx", "jwt", "prometheus_client")

# Runs the real command line in its own process; at exit, writes which heavy modules it imported.
PROBE = f"""
import atexit, json, sys
HEAVY = {HEAVY!r}
out = sys.argv.pop(1)
def report():
    with open(out, "w") as f:
        json.dump(sorted(m for m in HEAVY if m in sys.modules), f)
atexit.register(report)
from mcp_spec_proxy.cli import main
main(prog_name="mcp-spec-proxy")
"""


async def _heavy_modules_after_serving(tmp: Path, extra: dict[str, Any]) -> list[str]:
    config = {"servers": {"toy": toy(tmp / "rec")}, "review": {"default": "deny"}, **extra}
    (tmp / "servers.yaml").write_text(yaml.safe_dump(config))
    out = tmp / "modules.json"
    args = ["-c", PROBE, str(out), "--config", str(tmp / "servers.yaml"), "--state-dir", str(tmp / "state")]
    params = StdioServerParameters(command=sys.executable, args=[*args, "--log-level", "WARNING"])
    with anyio.fail_after(60), open(tmp / "stderr.log", "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            assert "toy__echo" in [t.name for t in (await client.list_tools()).tools]
            assert text_of(await client.call_tool("toy__echo", {"text": "hi"})) == "hi"
            held = await client.call_tool("toy__record", {"x": 1, "intent": "test"})
            assert held.is_error  # the write went through the gate, to the deny reviewer
    assert out.exists(), (tmp / "stderr.log").read_text()
    found: list[str] = json.loads(out.read_text())
    return found


async def test_plain_stdio_proxy_imports_no_model_client_leash_http_client_jwt_or_metrics(tmp_path: Path) -> None:
    assert await _heavy_modules_after_serving(tmp_path, {}) == []


async def test_a_configured_model_loads_the_openai_client_and_nothing_else(tmp_path: Path) -> None:
    models = {"models": {"strong": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 0}}}
    assert await _heavy_modules_after_serving(tmp_path, models) == ["openai"]


async def test_configured_leash_loads_numpy_and_faiss(tmp_path: Path) -> None:
    leash = {"leash": {"encoder": "hashing", "dim": 64, "bank_dir": str(tmp_path / "banks")}}
    found = await _heavy_modules_after_serving(tmp_path, leash)
    assert "numpy" in found and "faiss" in found


async def test_backend_hung_in_its_handshake_does_not_hold_the_first_tools_list(tmp_path: Path) -> None:
    # Its startup_timeout is far past the test's own bound: waiting for it would fail the test.
    cfg = {
        "servers": {
            "stuck": toy(tmp_path / "rec", "--hang-at-start", startup_timeout=600),
            "toy": toy(tmp_path / "rec"),
        }
    }
    async with proxied(cfg, tmp_path / "state") as p:
        names = [t.name for t in (await p.client.list_tools()).tools]
        assert "toy__echo" in names
        assert not any(name.startswith("stuck__") for name in names)
        assert p.proxy.backends.get("stuck").status == "starting"
        assert text_of(await p.client.call_tool("toy__echo", {"text": "fine"})) == "fine"


# A backend that names itself with bytes that are not UTF-8 (any process may: its executable's
# name cut at 15 bytes, prctl, pthread_setname_np), then never answers its handshake.
BADLY_NAMED = "import ctypes, time\nctypes.CDLL(None).prctl(15, b'hung\\xff\\xfe\\xc3', 0, 0, 0)\ntime.sleep(600)"


async def test_a_process_named_in_bytes_that_are_not_utf8_does_not_stop_the_start(tmp_path: Path) -> None:
    """Readiness reads every process's and thread's stat file, whose command name is the process's own bytes."""
    cfg = {
        "servers": {
            "stuck": {"command": sys.executable, "args": ["-c", BADLY_NAMED], "startup_timeout": 600},
            "toy": toy(tmp_path / "rec"),
        }
    }
    async with proxied(cfg, tmp_path / "state") as p:
        assert "toy__echo" in await _tool_names(p.client)
        assert p.proxy.backends.get("stuck").status == "starting"


def _late_config(tmp: Path, fifo: Path) -> dict[str, Any]:
    return {
        "servers": {
            "late": toy(tmp / "late-rec", "--start-after", str(fifo), startup_timeout=600),
            "toy": toy(tmp / "rec"),
        },
        "review": {"default": "deny"},
    }


def _let_start(fifo: Path) -> None:
    os.close(os.open(fifo, os.O_WRONLY))  # the toy's open() returns; it reads EOF and serves


async def _tool_names(client: Client) -> list[str]:
    return [t.name for t in (await client.list_tools()).tools]


async def test_late_backend_is_announced_to_a_legacy_client(tmp_path: Path) -> None:
    fifo = tmp_path / "start"
    os.mkfifo(fifo)
    changes = ToolChanges()
    async with proxied(_late_config(tmp_path, fifo), tmp_path / "state", messages=changes) as p:
        first = await _tool_names(p.client)
        assert "toy__echo" in first and "late__echo" not in first
        # Before it arrives, its tools are unknown: a clear error at once, not a wait.
        with pytest.raises(MCPError, match="not in the catalog \\(is its backend running\\?\\)"):
            await p.client.call_tool("late__echo", {"text": "too soon"})
        _let_start(fifo)
        with anyio.fail_after(30):
            while "late__echo" not in await _tool_names(p.client):
                await changes.next()
        assert changes.count >= 1
        assert text_of(await p.client.call_tool("late__echo", {"text": "here"})) == "here"
    assert not (tmp_path / "late-rec").exists()


async def test_late_backend_is_announced_on_a_2026_07_28_subscription(tmp_path: Path) -> None:
    fifo = tmp_path / "start"
    os.mkfifo(fifo)
    async with proxied(_late_config(tmp_path, fifo), tmp_path / "state", mode="2026-07-28") as p:
        assert "late__echo" not in await _tool_names(p.client)
        async with p.client.listen(tools_list_changed=True) as subscription:
            _let_start(fifo)
            with anyio.fail_after(30):
                async for _event in subscription:
                    if "late__echo" in await _tool_names(p.client):
                        break
        assert text_of(await p.client.call_tool("late__echo", {"text": "here"})) == "here"


class CatalogChanges:
    """Lets a test wait for the proxy's next tools change, whatever its clients' era."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    async def __call__(self, what: str) -> None:
        if what == "tools":
            self._event.set()

    async def next(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


@pytest.mark.parametrize("mode", ERAS)
async def test_late_tools_meet_the_same_catalog_checks(tmp_path: Path, mode: str) -> None:
    """A late tool whose definition changed since an earlier run is held like one listed at start."""
    fifo = tmp_path / "start"
    os.mkfifo(fifo)
    state = tmp_path / "state"
    state.mkdir()
    # An earlier run accepted a different `echo` from `late`: the rug-pull guard must catch it now too.
    seen = {"accepted": "0" * 64, "latest": "0" * 64, "first_seen": 0}
    (state / "fingerprints.json").write_text(json.dumps({SERVERS: {"late": {"first_listing": 0}}, "late/echo": seen}))
    changed = CatalogChanges()
    async with proxied(_late_config(tmp_path, fifo), state, mode=mode) as p:
        p.proxy.listeners.append(changed)
        assert "late__echo" not in await _tool_names(p.client)
        _let_start(fifo)
        with anyio.fail_after(30):
            while "late__echo" not in await _tool_names(p.client):
                await changed.next()
        echo = p.proxy.catalog.lookup("late__echo")
        assert (echo.effect, echo.reason) == ("write", "changed-definition")
        held = await p.client.call_tool("late__echo", {"text": "x", "intent": "test"})
        assert held.is_error and "Blocked at the write barrier" in text_of(held)
        record = await p.client.call_tool("late__record", {"x": 1, "intent": "test"})
        assert record.is_error
    assert not (tmp_path / "late-rec").exists()  # the late backend's ledger: nothing reached it


def test_children_that_work_are_busy_and_children_that_wait_are_quiet() -> None:
    """What tells a backend still starting (busy) from one hung in its handshake (asleep)."""
    window = 0.05
    waits = "print('up', flush=True); input()"
    with subprocess.Popen([sys.executable, "-c", waits], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as hung:
        assert hung.stdout is not None and hung.stdin is not None
        assert hung.stdout.readline() == b"up\n"
        before = progress.snapshot()
        time.sleep(window)
        after = progress.snapshot()
        assert before is not None and after is not None and before.precise
        assert not progress.busy(before, after, window)  # asleep on its stdin: quiet
        spins = "import time; end = time.monotonic() + 30\nwhile time.monotonic() < end: pass"
        with subprocess.Popen([sys.executable, "-c", spins]) as working:
            started = progress.snapshot()
            assert progress.busy(after, started, window)  # a process appeared: starting
            time.sleep(0.2)
            before = progress.snapshot()
            time.sleep(window)
            assert progress.busy(before, progress.snapshot(), window)  # on a CPU: working
            working.kill()
        before = progress.snapshot()
        time.sleep(window)
        assert not progress.busy(before, progress.snapshot(), window)  # only the sleeper again
        hung.stdin.close()


def test_tools_command_waits_for_a_hung_backend_to_give_up_and_says_why(tmp_path: Path) -> None:
    """A one-shot command hears no list change: it reports every backend, not those ready first."""
    stuck = toy(tmp_path / "rec", "--hang-at-start", startup_timeout=2)
    result = run_proxy("--config", str(toy_config(tmp_path, stuck=stuck)), "--state-dir", str(tmp_path / "s"), "tools")
    assert result.returncode == 0, result.stderr
    assert effects(parse_rows(result.stdout)) == TOY_TOOLS
    unavailable = [line for line in result.stderr.splitlines() if line.startswith("unavailable  ")]
    assert len(unavailable) == 1
    assert unavailable[0].startswith("unavailable  stuck: backend 'stuck' did not finish its handshake within 2s")
