"""What a backend session per client session costs: the first call of a new client session (which
opens its own backend session) against its later calls, and the proxy's memory per open session.

    .venv/bin/python -m bench.session_legs [--sessions 40]

npm server-everything on streamable HTTP (a URL backend that keeps per-session state), behind a real
`mcp-spec-proxy --http` process, under `isolation: per_session` (the URL default) and `isolation:
shared`, side by side in one run. Each of `--sessions` handshake-era clients (the `mcp` SDK over
HTTP) connects, calls the read `echo` five times, and stays connected; the proxy's resident memory
(VmRSS) is read before the first client and once all are connected. Prints medians of the first
call and of the later calls for each isolation, and the memory per session.
"""

from __future__ import annotations

import argparse
import os
import time
from contextlib import AsyncExitStack
from pathlib import Path
from tempfile import TemporaryDirectory

import anyio
from mcp import Client

from bench.measure import machine_line, percentile
from tests.conformance_runner import mcp_spec_proxy
from tests.test_remote_backends import everything_over


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def measure(url: str, pid: int, sessions: int) -> tuple[list[float], list[float], int]:
    first: list[float] = []
    later: list[float] = []
    before = rss_kib(pid)
    async with AsyncExitStack() as stack:
        for _ in range(sessions):
            client = await stack.enter_async_context(Client(url, mode="legacy"))
            for call in range(5):
                started = time.perf_counter()
                await client.call_tool("remote__echo", {"message": "hi"})
                (first if call == 0 else later).append((time.perf_counter() - started) * 1000)
        await anyio.sleep(0.5)
        grown = rss_kib(pid) - before
    return first, later, grown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=40)
    args = parser.parse_args()
    print(machine_line())
    print(f"load average before: {os.getloadavg()}")
    rows = []

    async def everything() -> None:
        async with everything_over("streamableHttp") as backend:
            for isolation in ("per_session", "shared"):
                config = {
                    "servers": {"remote": {"url": backend, "isolation": isolation}},
                    "review": {"default": "deny"},
                }
                with TemporaryDirectory() as tmp, mcp_spec_proxy(config, Path(tmp) / "proxy") as proxy:
                    first, later, grown = await measure(proxy.url, proxy.process.pid, args.sessions)
                rows.append((isolation, percentile(first, 50), percentile(later, 50), grown / args.sessions))

    anyio.run(everything)
    print(f"load average after: {os.getloadavg()}")
    print(f"\n{args.sessions} client sessions, 5 reads each, one proxy process per isolation")
    print("| isolation | first call of a session, p50 | later calls, p50 | proxy memory per open session |")
    print("|---|---:|---:|---:|")
    for isolation, first_ms, later_ms, kib in rows:
        print(f"| {isolation} | {first_ms:.1f} ms | {later_ms:.1f} ms | {kib:.0f} KiB |")


if __name__ == "__main__":
    main()
