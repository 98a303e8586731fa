"""Stdio backends spawned before the SDK is imported, so they boot while the proxy does.

The proxy's interpreter spends most of its start importing the `mcp` SDK; a backend spawned only
after that adds its own start to ours. `launch.main` (the console script) makes one `Prespawned`
and hands it down the command line to the backend pool: it spawns each active stdio server
first, exactly as the stdio transport would (the command found by `commands.resolve_command`,
the SDK's default environment and the server's `env`, its `cwd`, stderr appended to the same log
file, a new session as the SDK's spawn on POSIX), keyed by server name with those parameters.
A server's first connection adopts its process when the parameters it would spawn with are
exactly the same (`claim`); otherwise, and on every reconnect, it spawns as ever. What is never
adopted (a disabled server, a changed config, one that died first) is the owner's to stop when
the command ends (`leftover`; `launch.main` stops them with the SDK's own shutdown).

Nothing here imports the SDK or anyio, and nothing here is module state: the object is the
registry, and whoever made it owns what it spawned.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mcp_spec_proxy.config.commands import default_environment, resolve_command
from mcp_spec_proxy.errors import BackendError
from mcp_spec_proxy.observe.stderr_log import StderrLog

if TYPE_CHECKING:
    from mcp_spec_proxy.config.schema import ProxyConfig


@dataclass(frozen=True)
class SpawnKey:
    """Everything a stdio backend's process is spawned with; an early process is adopted only by an equal key."""

    name: str
    command: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str | None
    errlog: str  # the stderr log file's absolute path

    @staticmethod
    def of(
        name: str, command: str, args: list[str], env: dict[str, str], cwd: str | Path | None, errlog: str
    ) -> SpawnKey:
        where = None if cwd is None else str(cwd)
        return SpawnKey(name, command, tuple(args), tuple(sorted(env.items())), where, os.path.abspath(errlog))


class Prespawned:
    """The processes one launch spawned early, until each is adopted or handed back to be stopped."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[SpawnKey, subprocess.Popen[bytes]]] = {}
        self._refused: list[subprocess.Popen[bytes]] = []
        self.logs: list[StderrLog] = []  # closed (and drained) by the owner once the processes are stopped

    def spawn(self, config: ProxyConfig, log_dir: Path) -> list[str]:
        """Spawn every active stdio server of `config`, stderr to `log_dir/<name>.log`; the names spawned.

        A server whose command cannot be resolved, or whose spawn fails, is left to the transport,
        which reports it as ever.
        """
        if sys.platform == "win32":
            return []  # the SDK's Windows spawn (a Job Object) is not reproduced here
        spawned: list[str] = []
        for name, server in config.active_servers().items():
            if server.transport != "stdio" or server.command is None or name in self._waiting:
                continue
            try:
                command = resolve_command(name, server.command)
            except BackendError:
                continue
            log_dir.mkdir(parents=True, exist_ok=True)
            path = log_dir / f"{name}.log"  # the file the backend pool appends the server's stderr to
            env = default_environment() | server.env
            key = SpawnKey.of(name, command, server.args, env, server.cwd, str(path))
            log = StderrLog(path)  # capped and rotated as the pool's own (`observe/stderr_log.py`)
            self.logs.append(log)
            try:
                process = subprocess.Popen(
                    [command, *server.args],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=env,
                    cwd=server.cwd,
                    start_new_session=True,
                    bufsize=0,
                )
            except OSError:
                continue
            self._waiting[name] = (key, process)
            spawned.append(name)
        return spawned

    def claim(self, key: SpawnKey) -> subprocess.Popen[bytes] | None:
        """The early process for `key.name` if it was spawned with exactly `key` and still runs;
        taken either way (a server adopts at most once: its first connection)."""
        entry = self._waiting.pop(key.name, None)
        if entry is None:
            return None
        found, process = entry
        if found != key or process.poll() is not None:
            # Not what this connection would spawn, or dead: the connection spawns its own.
            self.refuse(process)
            return None
        return process

    def refuse(self, process: subprocess.Popen[bytes]) -> None:
        """Give up an early process: its stdin closes now (a server exits at its end), and the
        owner stops whatever is left of it (`leftover`)."""
        for pipe in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        self._refused.append(process)

    def unclaimed(self) -> list[int]:
        """The PIDs of early processes not adopted (yet)."""
        return [process.pid for _, process in self._waiting.values()]

    def leftover(self) -> list[subprocess.Popen[bytes]]:
        """Every process nobody adopted, handed to the caller to stop; none is adopted after this."""
        processes = [process for _, process in self._waiting.values()] + self._refused
        self._waiting.clear()
        self._refused.clear()
        return processes


__all__ = ["Prespawned", "SpawnKey"]
