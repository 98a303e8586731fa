"""Stdio backends spawned before the SDK is imported, so they boot while the proxy does.

The proxy's interpreter spends most of its start importing the `mcp` SDK; a backend spawned only
after that adds its own start to ours. `launch.main` (the console script) calls `spawn_early`
first: each active stdio server is started exactly as the stdio transport would start it (the
command resolved by `resolve_command`, the SDK's default environment and the server's `env`,
its `cwd`, stderr appended to the same log file, a new session as the SDK's spawn on POSIX), and
kept here under its server name with those parameters. `backends/stdio.py` adopts a process on
that server's first connection when the parameters it would spawn with are exactly the same
(`claim`); otherwise, and on every reconnect, it spawns as ever. Whatever is never adopted (a
disabled server, a changed config, one that died first) is stopped at exit (`stop_unclaimed`).

Nothing here imports the SDK or anyio: this module runs before them.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mcp_spec_proxy.errors import BackendError
from mcp_spec_proxy.stderr_log import StderrLog

if TYPE_CHECKING:
    from mcp_spec_proxy.config import ProxyConfig

# The SDK's `mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS` on POSIX (importing that module costs the
# whole SDK); a test holds `default_environment` equal to the SDK's `get_default_environment`.
_INHERITED_ENV_VARS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")
_STOP_GRACE_S = 2.0


def default_environment() -> dict[str, str]:
    """What a stdio backend inherits of our environment: the SDK's whitelist, less shell functions."""
    return {
        key: value
        for key in _INHERITED_ENV_VARS
        if (value := os.environ.get(key)) is not None and not value.startswith("()")
    }


def resolve_command(name: str, command: str) -> str:
    """The executable to spawn: as given if it has a path, else from PATH, else beside our Python.

    The last rule lets a server installed into the proxy's own virtual environment (for example
    `mcp-server-git`) be named bare even when the client (Claude Desktop) starts the proxy
    with a PATH that does not include that environment.
    """
    if "/" in command:
        if not Path(command).exists():
            raise BackendError(name, f"failed to start: command {command!r} does not exist — fix `command`")
        return command
    beside = str(Path(sys.executable).parent)
    found = shutil.which(command) or shutil.which(command, path=beside)
    if found is None:
        searched = f"on PATH ({os.environ.get('PATH', '')}) nor in {beside}"
        elsewhere = _installed_elsewhere(command)
        if elsewhere is not None:
            # A desktop app starts the proxy with a minimal PATH: "install Node.js" would send the
            # user to install what they have.
            raise BackendError(
                name,
                f"failed to start: command {command!r} is not {searched}, but {elsewhere} exists — set"
                f" `command: {elsewhere}`, or give the proxy a PATH that holds {os.path.dirname(elsewhere)}",
            )
        hint = {
            "npx": "install Node.js (npm ships npx)",
            "uvx": "install uv, or pip-install the server and name its command",
            "node": "install Node.js",
            "docker": "install Docker",
        }.get(command, "install it")
        raise BackendError(
            name,
            f"failed to start: command {command!r} not found {searched} — {hint}, or set `command` to its full path",
        )
    return found


# Where installers put commands that a desktop app's minimal PATH leaves out (Homebrew, nvm,
# volta, pipx and uv, npm's global prefix), so a miss can say "it is there" instead of "install it".
_USUAL_PLACES = (
    "/usr/local/bin",
    "/opt/homebrew/bin",
    "/opt/local/bin",
    "~/.local/bin",
    "~/.volta/bin",
    "~/.cargo/bin",
    "~/.npm-global/bin",
    "~/.nvm/versions/node/*/bin",
    "/usr/bin",
    "/bin",
)


def _installed_elsewhere(command: str) -> str | None:
    """The first executable `command` in `_USUAL_PLACES`, or None."""
    for place in _USUAL_PLACES:
        for folder in sorted(glob.glob(os.path.expanduser(place)), reverse=True):  # nvm's versions: highest name first
            candidate = os.path.join(folder, command)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
    return None


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


@dataclass
class _Registry:
    waiting: dict[str, tuple[SpawnKey, subprocess.Popen[bytes]]] = field(default_factory=dict)
    logs: list[StderrLog] = field(default_factory=list)
    refused: list[subprocess.Popen[bytes]] = field(default_factory=list)
    hooked: bool = False


_registry = _Registry()


def spawn_early(config: ProxyConfig, log_dir: Path) -> list[str]:
    """Spawn every active stdio server of `config`, stderr to `log_dir/<name>.log`; the names spawned.

    A server whose command cannot be resolved, or whose spawn fails, is left to the transport,
    which reports it as ever.
    """
    if sys.platform == "win32":
        return []  # the SDK's Windows spawn (a Job Object) is not reproduced here
    if not _registry.hooked:
        atexit.register(stop_unclaimed)
        _registry.hooked = True
    spawned: list[str] = []
    for name, server in config.active_servers().items():
        if server.transport != "stdio" or server.command is None or name in _registry.waiting:
            continue
        try:
            command = resolve_command(name, server.command)
        except BackendError:
            continue
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"{name}.log"  # the file the backend pool appends the server's stderr to
        env = default_environment() | server.env
        key = SpawnKey.of(name, command, server.args, env, server.cwd, str(path))
        log = StderrLog(path)  # capped and rotated as the pool's own (`stderr_log.py`)
        _registry.logs.append(log)
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
        _registry.waiting[name] = (key, process)
        spawned.append(name)
    return spawned


def claim(key: SpawnKey) -> subprocess.Popen[bytes] | None:
    """The early process for `key.name` if it was spawned with exactly `key` and still runs; taken
    from the registry either way (a server adopts at most once: its first connection)."""
    entry = _registry.waiting.pop(key.name, None)
    if entry is None:
        return None
    found, process = entry
    if found != key or process.poll() is not None:
        # Not what this connection would spawn, or dead: the connection spawns its own.
        refuse(process)
        return None
    return process


def refuse(process: subprocess.Popen[bytes]) -> None:
    """Give up an early process: its stdin closes now (a server exits at its end), and the exit
    hook ends whatever is left of it."""
    _close_pipes(process)
    _registry.refused.append(process)


def unclaimed() -> list[int]:
    """The PIDs of early processes not adopted (yet)."""
    return [process.pid for _, process in _registry.waiting.values()]


def stop_unclaimed() -> None:
    """Stop every early process nobody adopted: close its pipes, give it the SDK's grace to exit, then
    end its whole group (SIGTERM, then SIGKILL) as the SDK's shutdown does."""
    processes = [process for _, process in _registry.waiting.values()] + _registry.refused
    _registry.waiting.clear()
    _registry.refused.clear()
    _stop(*processes)
    for log in _registry.logs:
        log.close()
    for log in _registry.logs:
        log.drain()  # the processes are stopped: their last lines reach the file
    _registry.logs.clear()


def _close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout):
        with contextlib.suppress(OSError):
            if pipe is not None:
                pipe.close()


def _stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        _close_pipes(process)
    _wait(processes)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)  # the leader's pid is its group's (start_new_session)
        if _wait(processes):
            break


def _wait(processes: tuple[subprocess.Popen[bytes], ...]) -> bool:
    """Whether all of `processes` exited (and were reaped) within the grace period."""
    deadline = time.monotonic() + _STOP_GRACE_S
    while any(process.poll() is None for process in processes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


__all__ = [
    "SpawnKey",
    "claim",
    "default_environment",
    "refuse",
    "resolve_command",
    "spawn_early",
    "stop_unclaimed",
    "unclaimed",
]
