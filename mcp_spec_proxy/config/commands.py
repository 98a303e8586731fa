"""Where a stdio backend's command is found, and what of our environment it inherits.

One place for both, used by the transport (`backends/transports.py`), by `check`, and by the
launcher's early spawn (`prespawn.py`), which runs before the SDK is imported: nothing here
imports the SDK or anyio.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

from mcp_spec_proxy.errors import BackendError

# The SDK's `mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS` on POSIX (importing that module costs the
# whole SDK); a test holds `default_environment` equal to the SDK's `get_default_environment`.
_INHERITED_ENV_VARS = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")


def default_environment() -> dict[str, str]:
    """What a stdio backend inherits of our environment: the SDK's whitelist, less shell functions."""
    return {
        key: value
        for key in _INHERITED_ENV_VARS
        if (value := os.environ.get(key)) is not None and not value.startswith("()")
    }


# The shipped servers.yaml's PyPI servers: the `servers` extra installs them beside the proxy.
_SERVERS_EXTRA = ("mcp-server-git", "mcp-server-time")
_SERVERS_EXTRA_HINT = (
    "install the proxy with its `servers` extra (pip install 'mcp-spec-proxy[servers]'; with pipx,"
    " pipx inject mcp-spec-proxy mcp-server-git mcp-server-time)"
)


def resolve_command(name: str, command: str) -> str:
    """The executable to spawn: as given if it has a path, else from PATH, else beside our Python.

    The last rule lets a server installed into the proxy's own virtual environment (for example
    `mcp-server-git`) be named bare even when the client (Claude Desktop) starts the proxy
    with a PATH that does not include that environment.
    """
    if "/" in command:
        if Path(command).exists():
            return command
        if not Path(command).is_absolute():  # "does not exist" alone misleads where it exists from another folder
            raise BackendError(
                name,
                f"failed to start: command {command!r} is not in {os.getcwd()}, the folder the proxy started in,"
                " which a relative path is taken from — start the proxy in the folder the path is relative to,"
                " or give `command` (and any relative path in `args`) as an absolute path",
            )
        raise BackendError(name, f"failed to start: command {command!r} does not exist — fix `command`")
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
            **dict.fromkeys(_SERVERS_EXTRA, _SERVERS_EXTRA_HINT),
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


__all__ = ["default_environment", "resolve_command"]
