"""The real `mcp-spec-proxy --http` command as an operator runs it: a process, its log, its port.

`serving(config, tmp, *args)` starts the command and yields a `Running`: its stderr lines as they
come (`line` waits for one to match), the probes' base URL (known from the first log line, before
the proxy serves), and `stop()` to send SIGTERM and wait for its exit code. What the process does
on its own timers is observed from outside (`until`), never slept on.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import yaml

from tests.harness import PROXY_COMMAND

PROBES = re.compile(r"probes on (http://\S+)/readyz")
SERVING = re.compile(r"serving streamable HTTP on (http://\S+/mcp)")


async def until(check: Callable[[], bool], every: float = 0.05) -> None:
    """Wait until `check()` holds; bound it with `anyio.fail_after`."""
    while True:
        if check():
            return
        await anyio.sleep(every)


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)
    base: str = ""

    async def line(self, pattern: re.Pattern[str]) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            if self.proc.poll() is not None and not found:
                raise AssertionError(f"the proxy exited ({self.proc.returncode}):\n{self.log()}")
            found.extend(m for m in (pattern.search(line) for line in list(self.lines)) if m)
            return bool(found)

        await until(seen)
        return found[0]

    def log(self) -> str:
        return "".join(self.lines)[-12000:]

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self) -> int:
        """The exit code, once it has exited."""
        await until(lambda: self.proc.poll() is not None)
        return int(self.proc.returncode)

    async def get(self, path: str, **kwargs: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            return await http.get(path, **kwargs)


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


@asynccontextmanager
async def serving(
    config: dict[str, Any], tmp: Path, *args: str, env: dict[str, str] | None = None
) -> AsyncIterator[Running]:
    config_file = tmp / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config))
    argv = [PROXY_COMMAND, "--config", str(config_file), "--state-dir", str(tmp / "state"), "--http", "127.0.0.1:0"]
    proc = _start([*argv, *args], {**os.environ, **(env or {})})
    assert proc.stderr is not None
    stderr = proc.stderr
    running = Running(proc)
    reader = threading.Thread(target=lambda: running.lines.extend(line.decode(errors="replace") for line in stderr))
    reader.start()
    try:
        with anyio.fail_after(60):
            running.base = (await running.line(PROBES)).group(1)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=15)
        reader.join(timeout=5)
        stderr.close()
