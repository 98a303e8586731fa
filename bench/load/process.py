"""The one `mcp-spec-proxy --http` process every level runs against: spawned, watched through /proc, stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import anyio
import yaml
from mcp import Client

from bench.accepting import MODEL
from bench.backends import FS_ENTRY, MEMORY_ENTRY, NODE22, require
from bench.load.plan import CALL_TIMEOUT_S

VENV_BIN = Path(sys.executable).parent
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


@dataclass
class ProxyProcess:
    process: subprocess.Popen[bytes]
    port: int
    state: Path
    telemetry: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int:
        return self.process.pid

    def children(self) -> dict[int, str]:
        """Every live descendant of the proxy, with a label: fs, memory or its command name."""
        found: dict[int, str] = {}
        for pid in descendants(self.pid):
            cmdline = read_proc(pid, "cmdline").replace("\0", " ")
            label = "fs" if "server-filesystem" in cmdline else "memory" if "server-memory" in cmdline else ""
            found[pid] = label or read_proc(pid, "comm").strip()
        return found

    def reset_peaks(self) -> None:
        for pid in [self.pid, *self.children()]:
            with contextlib.suppress(OSError):  # a child that just exited
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS

    def peaks_mib(self) -> tuple[float, dict[str, float]]:
        return vm_hwm_mib(self.pid), {label: vm_hwm_mib(pid) for pid, label in self.children().items()}

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the proxy, and by its live children together."""
        return cpu_s(self.pid), sum(cpu_s(pid) for pid in self.children())

    def stop(self) -> int | None:
        """SIGTERM (the proxy stops its backends), then kill; bounded."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        return self.process.returncode


def read_proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_proc(int(entry.name), "stat")
            if stat:
                children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    found: list[int] = []
    todo = list(children[root])
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children[pid]
    return found


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (fields 14 and 15 of /proc/PID/stat)."""
    fields = read_proc(pid, "stat").rsplit(")", 1)[-1].split()
    if len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_mib(pid: int) -> float:
    for line in read_proc(pid, "status").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_proxy(tmp: Path, root: Path, memory_file: Path, base_url: str) -> ProxyProcess:
    require(NODE22, FS_ENTRY, MEMORY_ENTRY)
    config = {
        "servers": {
            "fs": {"command": str(NODE22), "args": [str(FS_ENTRY), str(root)]},
            "memory": {
                "command": str(NODE22),
                "args": [str(MEMORY_ENTRY)],
                "env": {"MEMORY_FILE_PATH": str(memory_file)},
            },
        },
        "models": {"strong": {"base_url": base_url, "model": MODEL, "max_retries": 0, "timeout": 30}},
        "review": {"default": "strong", "timeout": CALL_TIMEOUT_S - 10},
    }
    config_file = tmp / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    state, telemetry, log = tmp / "state", tmp / "telemetry.jsonl", tmp / "proxy.log"
    argv = [
        str(VENV_BIN / "mcp-spec-proxy"),
        *("--config", str(config_file), "--state-dir", str(state), "--http", f"127.0.0.1:{port}"),
        *("--telemetry", str(telemetry), "--log-level", "WARNING"),
    ]
    with log.open("wb") as err:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    return ProxyProcess(process, port, state, telemetry, log)


async def wait_ready(proxy: ProxyProcess, wanted: set[str]) -> None:
    """Until the proxy listens and lists the tools of both backends; bounded."""
    for _ in range(int(START_TIMEOUT_S / 0.2)):
        if proxy.process.poll() is not None:
            raise SystemExit(f"the proxy exited with {proxy.process.returncode}; see {proxy.log}")
        try:
            stream = await anyio.connect_tcp("127.0.0.1", proxy.port)
        except OSError:
            await anyio.sleep(0.2)  # not listening yet
            continue
        await stream.aclose()
        with anyio.fail_after(START_TIMEOUT_S):
            async with Client(proxy.url, mode="legacy") as client:
                for _ in range(int(START_TIMEOUT_S / 0.2)):
                    if wanted <= {tool.name for tool in (await client.list_tools()).tools}:
                        return
                    await anyio.sleep(0.2)  # a backend is still starting
        break
    raise SystemExit(f"the proxy did not list {sorted(wanted)} within {START_TIMEOUT_S:g}s; see {proxy.log}")
