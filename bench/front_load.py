"""The HTTP front under reads: CPU per 1,000 reads and throughput at many sessions, side by side in one run.

    .venv/bin/python -m bench.front_load [--calls 1000] [--levels 16,64] [--reads 20] [--rounds 2]
                                         [--era legacy] [--baseline DIR] [--roots] [--clients 4]
                                         [--driver sdk|autocannon]

Targets, each serving streamable HTTP on 127.0.0.1 in front of mcp-server-time over stdio:
ours-http (mcp-spec-proxy, `review: {default: deny}`: reads go at once), ours-before-http (another
checkout's `mcp_spec_proxy`, `--baseline DIR`), bare-http (bench/bare_proxy.py: the SDK alone),
fastmcp-http and mcp-proxy-http (the peers bench/peers.py installs under `.bench/`, when there).

1. CPU: sequential `get_current_time` reads, `--calls` per target in rotating blocks, and the CPU
   time (user + system, from /proc, Linux only) the serving process spent on them, its children
   (the backend) left out; per 1,000 reads, beside the wall time per read.
2. Throughput: for each level, that many client sessions open on one target at a time, shared out
   among `--clients` client processes (bench/front_clients.py, each session in a task of its own),
   each sending `--reads` reads one after another, all sessions from a common start; reads per
   second = all reads / the time from the first start to the last answer. Targets take turns level
   by level, `--rounds` times; the best round is reported (the load of a shared machine only ever
   slows a round down), with the CPU per read its clients, the target and the target's backend spent
   and how busy the whole machine was: where the client processes, the target and its backend
   together fill the machine's cores, the figure is the machine's, and a ratio between targets tends
   to the ratio of their whole read's CPU (clients + target + backend), the client's included.
   `--driver autocannon` reads with npm autocannon instead, replaying the read the SDK sent over one
   connection a session (bench/front_cannon.py): a far lighter client, so the figure is the targets'.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp import Client

from bench import front_cannon, peers
from bench.front_clients import ClientPool
from bench.measure import machine_line
from bench.overhead import (
    DEFAULT_TIME,
    _caller,
    _stop,
    backends,
    declaring,
    free_port,
    load_average,
    spawn_argv,
    spawn_env,
    wait_for_port,
)
from bench.overhead_report import Backend

TICKS = os.sysconf("SC_CLK_TCK")
BLOCK = 50
CLIENTS = 4


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` itself (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def targets(baseline: Path | None) -> tuple[list[str], list[str]]:
    """The targets measured, and one line for each left out."""
    chosen, left = ["ours-http"], []
    if baseline is not None:
        chosen.append("ours-before-http")
    chosen.append("bare-http")
    if peers.fastmcp_python().exists():
        chosen.append("fastmcp-http")
    else:
        left.append("fastmcp-http: skipped, not installed (add --install-fastmcp to bench.overhead)")
    if peers.mcp_proxy_entry().exists():
        chosen.append("mcp-proxy-http")
    else:
        left.append("mcp-proxy-http: skipped, not installed (add --install-mcp-proxy to bench.overhead)")
    return chosen, left


class Served:
    """One target's process and its URL."""

    def __init__(self, name: str, process: anyio.abc.Process, url: str, tool: str) -> None:
        self.name, self.process, self.url, self.tool = name, process, url, tool


async def start(stack: AsyncExitStack, name: str, backend: Backend, tmp: Path, baseline: Path | None) -> Served:
    port = free_port()
    argv = spawn_argv(name, backend, tmp, port)
    env = spawn_env(name, baseline)
    process = await anyio.open_process(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    stack.push_async_callback(_stop, process)
    await wait_for_port(port, process)
    tool = f"{backend.name}__{backend.tool}" if name.startswith("ours") else backend.tool
    return Served(name, process, f"http://127.0.0.1:{port}/mcp", tool)


async def cpu_per_reads(
    served: list[Served], backend: Backend, era: str, calls: int, roots: bool = False
) -> dict[str, tuple[float, float]]:
    """Per target: CPU seconds per 1,000 reads, and wall milliseconds per read."""
    async with AsyncExitStack() as stack:
        callers: dict[str, Callable[[], Any]] = {}
        for target in served:
            client = await stack.enter_async_context(Client(target.url, mode=era, **declaring(roots)))
            callers[target.name] = _caller(client, target.tool, backend.arguments)
            for _ in range(30):
                await callers[target.name]()
        used = dict.fromkeys(callers, 0.0)
        wall = dict.fromkeys(callers, 0.0)
        done = 0
        while done < calls:
            for target in served:
                pid = target.process.pid
                before, started = cpu_seconds(pid), time.perf_counter()
                for _ in range(BLOCK):
                    await callers[target.name]()
                wall[target.name] += time.perf_counter() - started
                used[target.name] += cpu_seconds(pid) - before
            done += BLOCK
    return {name: (used[name] / done * 1000, wall[name] / done * 1000) for name in callers}


@dataclass(frozen=True)
class Rate:
    """One target at one level: reads per second, and the CPU each side spent per read meanwhile."""

    reads_per_s: float
    client_ms: float  # the client processes, CPU ms per read
    target_ms: float  # the serving process itself
    backend_ms: float  # its children: the backend
    busy: float  # the whole machine's CPU in use, % of all its cores (everyone's work, not only this run's)

    @property
    def whole_ms(self) -> float:
        return self.client_ms + self.target_ms + self.backend_ms


def descendants_cpu(pid: int) -> float:
    """CPU seconds of every live descendant of `pid` (a target's backend)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # it ended meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    total, todo = 0.0, list(children.get(pid, []))
    while todo:
        child = todo.pop()
        todo += children.get(child, [])
        with suppress(OSError, IndexError, ValueError):  # it ended meanwhile
            total += cpu_seconds(child)
    return total


def machine_ticks() -> tuple[int, int]:
    """All CPU ticks of the machine so far, and the idle ones among them (/proc/stat)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields), fields[3] + fields[4]


async def throughput(
    pool: ClientPool | None, target: Served, backend: Backend, era: str, sessions: int, reads: int, roots: bool = False
) -> Rate:
    """`sessions` client sessions reading at once from a common start, shared out among the pool's
    processes (or, with no pool, autocannon's connections); reads per second from the first start to
    the last answer."""
    order = {"url": target.url, "tool": target.tool, "arguments": backend.arguments, "era": era, "roots": roots}
    order["reads"] = reads
    async with AsyncExitStack() as level:  # the level's sessions, opened before its start, closed after its end
        if pool is not None:
            await pool.open(order, sessions)
        else:
            plan = await front_cannon.open_level(level, order, sessions)
        pid = target.process.pid
        served, backed, ticks = cpu_seconds(pid), descendants_cpu(pid), machine_ticks()
        if pool is not None:
            shares = await pool.go()
            done = sum(share.reads for share in shares)
            wall = max(share.end for share in shares) - min(share.start for share in shares)
            client_s = sum(share.cpu for share in shares)
        else:
            report = await front_cannon.fire(plan)
            done, wall, client_s = report["reads"], report["seconds"], report["cpu"]
        served, backed = cpu_seconds(pid) - served, descendants_cpu(pid) - backed
        total, idle = (now - then for now, then in zip(machine_ticks(), ticks, strict=True))
    per_read = 1000 / done
    busy = 100 * (total - idle) / max(total, 1)
    return Rate(done / wall, client_s * per_read, served * per_read, backed * per_read, busy)


async def run(args: argparse.Namespace, tmp: Path) -> None:
    chosen = argparse.Namespace(backends="time", backend_command=args.backend_command)
    backend = backends(chosen, tmp, None)[0]
    names, left = targets(args.baseline)
    print(machine_line())
    print(f"load average (1, 5, 15 min) before: {load_average()}")
    for line in left:
        print(line)
    started = time.monotonic()
    async with AsyncExitStack() as stack:
        served = [await start(stack, name, backend, tmp, args.baseline) for name in names]
        cpu = await cpu_per_reads(served, backend, args.era, args.calls, args.roots)
        pool = await ClientPool.start(stack, args.clients) if args.driver == "sdk" else None
        rates: dict[tuple[str, int], list[Rate]] = {}
        for _ in range(args.rounds):
            for level in args.levels:
                for target in served:
                    rate = await throughput(pool, target, backend, args.era, level, args.reads, args.roots)
                    rates.setdefault((target.name, level), []).append(rate)
                    print(f"  {level} sessions, {target.name}: {rate.reads_per_s:.1f} reads/s", flush=True)
    print(f"load average (1, 5, 15 min) after: {load_average()}; {time.monotonic() - started:.0f}s")
    best = {key: max(rounds, key=lambda rate: rate.reads_per_s) for key, rounds in rates.items()}
    roots = ", clients declare roots" if args.roots else ""
    print(f"\n{backend.label}, client era {args.era}{roots}, {args.calls} sequential reads per target for CPU,")
    if args.driver == "sdk":
        print(f"throughput sessions shared out among {args.clients} client processes\n")
    else:
        print("throughput read by npm autocannon, one connection a session\n")
    levels = " | ".join(f"{n} sessions, reads/s" for n in args.levels)
    print(f"| target | CPU s per 1,000 reads | wall ms per read | {levels} |")
    print("|---|---|---|" + "---|" * len(args.levels))
    for name in names:
        cells = [f"{best[(name, level)].reads_per_s:.0f}" for level in args.levels]
        print(f"| {name} | {cpu[name][0]:.2f} | {cpu[name][1]:.2f} | " + " | ".join(cells) + " |")
    print()
    for other in names[1:]:
        ratios = [best[("ours-http", n)].reads_per_s / best[(other, n)].reads_per_s for n in args.levels]
        shown = ", ".join(f"{n} sessions {r:.2f}x" for n, r in zip(args.levels, ratios, strict=True))
        print(f"ours-http / {other}: CPU per read {cpu['ours-http'][0] / cpu[other][0]:.2f}x; throughput {shown}")
    cores = os.cpu_count()
    print(f"\nCPU per read in the best throughput round (ms), and the machine's CPU in use (% of {cores} cores)\n")
    print("| target | sessions | reads/s | clients | target | its backend | the whole read | machine busy % |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        for level in args.levels:
            rate = best[(name, level)]
            print(
                f"| {name} | {level} | {rate.reads_per_s:.0f} | {rate.client_ms:.2f} | {rate.target_ms:.2f}"
                f" | {rate.backend_ms:.2f} | {rate.whole_ms:.2f} | {rate.busy:.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000, help="sequential reads per target for CPU (default 1000)")
    parser.add_argument("--levels", default="16,64", help="concurrent sessions, comma-separated (default 16,64)")
    parser.add_argument("--reads", type=int, help="reads per session at each level (default 20; autocannon 200)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of every target at every level (default 2)")
    parser.add_argument("--era", choices=("legacy", "2026-07-28"), default="legacy", help="the clients' era")
    parser.add_argument("--baseline", type=Path, help="also measure ours from DIR/mcp_spec_proxy (ours-before-http)")
    parser.add_argument("--backend-command", default=str(DEFAULT_TIME), help="the stdio backend (mcp-server-time)")
    parser.add_argument("--roots", action="store_true", help="every client declares roots (as most IDE clients do)")
    parser.add_argument(
        "--clients",
        type=int,
        default=CLIENTS,
        help=f"client processes the sessions are shared out among (default {CLIENTS})",
    )
    parser.add_argument(
        "--driver",
        choices=("sdk", "autocannon"),
        default="sdk",
        help="who reads in the throughput levels: SDK clients (default) or npm autocannon (bench/front_cannon.py)",
    )
    args = parser.parse_args()
    if args.driver == "autocannon" and (why := peers.missing("autocannon")):
        parser.error(f"--driver autocannon: {why}")
    if args.reads is None:
        args.reads = 20 if args.driver == "sdk" else 200
    try:
        args.levels = [int(n) for n in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels {args.levels!r}: give numbers of sessions, comma-separated, such as 16,64")
    if args.calls < BLOCK or min(args.levels) < 1 or args.reads < 1 or args.rounds < 1 or args.clients < 1:
        parser.error(f"--calls must be at least {BLOCK}; --levels, --reads, --rounds and --clients at least 1")
    if not sys.platform.startswith("linux"):
        parser.error("CPU time is read from /proc: Linux only")
    if args.baseline is not None and not (args.baseline / "mcp_spec_proxy" / "__init__.py").exists():
        parser.error(f"--baseline {args.baseline}: no mcp_spec_proxy package there")
    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(run, args, Path(tmp))


if __name__ == "__main__":
    main()
