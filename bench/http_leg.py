"""The HTTP backend leg alone: a read past the SDK client (`backends/lean_http.py`) against the same
read through the SDK's client session, on one established backend session, side by side in one run.

    .venv/bin/python -m bench.http_leg [--calls 1000] [--block 20]

npm server-everything on streamable HTTP (handshake era) behind one `Backend` in this process (no
front: the leg is what is measured). `echo` is called `--calls` times each way after a warm-up, in
rotating blocks of `--block`; the SDK's way is the lean path switched off for its blocks. Prints p50
and p99 of each and their ratio, with the machine and the load average.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import anyio

from bench.measure import machine_line, percentile
from mcp_spec_proxy.backends import Backend, lean_http
from mcp_spec_proxy.backends.listing import Listing
from mcp_spec_proxy.config.schema import ServerConfig
from tests.test_remote_backends import everything_over

WAYS = ("lean", "sdk")


async def measure(calls: int, block: int, warmup: int) -> dict[str, list[float]]:
    taken: dict[str, list[float]] = {way: [] for way in WAYS}
    lean_of = lean_http.LeanLeg.of

    async def listed(name: str, listing: Listing | None) -> None:
        return None

    async with everything_over("streamableHttp") as url, anyio.create_task_group() as tg:
        backend = Backend("far", ServerConfig(url=url, isolation="shared"), listed)
        tg.start_soon(backend.run)
        with anyio.fail_after(60):
            await backend.connected.wait()
        for _ in range(warmup):
            await backend.call_tool_json("echo", {"message": "warm"})
        done = 0
        while done < calls:
            for way in WAYS:
                off: Any = classmethod(lambda cls, guard, client: None)
                lean_http.LeanLeg.of = lean_of if way == "lean" else off  # type: ignore[method-assign]
                for _ in range(block):
                    start = time.perf_counter()
                    await backend.call_tool_json("echo", {"message": "hello"})
                    taken[way].append((time.perf_counter() - start) * 1000)
            done += block
        lean_http.LeanLeg.of = lean_of  # type: ignore[method-assign]
        tg.cancel_scope.cancel()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="measured calls each way (default 1000)")
    parser.add_argument("--block", type=int, default=20, help="calls per way per block (default 20)")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured calls first (default 50)")
    args = parser.parse_args()
    before = os.getloadavg()
    started = time.monotonic()
    taken = anyio.run(measure, args.calls, args.block, args.warmup)
    after = os.getloadavg()
    print(machine_line())
    print(f"load average: before {', '.join(f'{v:.2f}' for v in before)}; after {', '.join(f'{v:.2f}' for v in after)}")
    print(f"calls each way: {len(taken['lean'])}, blocks of {args.block} rotating; {time.monotonic() - started:.0f}s")
    for way in WAYS:
        print(f"  {way:5}  p50 {percentile(taken[way], 50):7.2f} ms   p99 {percentile(taken[way], 99):7.2f} ms")
    for q in (50, 99):
        print(f"  lean/sdk at p{q}: {percentile(taken['lean'], q) / percentile(taken['sdk'], q):.2f}x")


if __name__ == "__main__":
    main()
