"""Where a read's CPU goes in the HTTP front: cProfile inside the proxy, by library, before and after.

    .venv/bin/python -m bench.front_profile [--reads 500] [--baseline DIR]

The proxy serves streamable HTTP in front of mcp-server-time (`review: {default: deny}`) under
cProfile with a CPU-time clock, switched on only around the measured reads (SIGUSR1 on, SIGUSR2
off and saved), so start-up and warm-up are left out. For each client era: 50 unmeasured reads,
then `--reads` measured ones, one after another. Printed: each library's self time per read, for
ours and, with `--baseline DIR`, for the `mcp_spec_proxy` in DIR (the code before). cProfile
inflates every figure several times over: compare the shares and the before and after, and take
the real CPU per read from `bench.front_load`. The proxy runs under bench/profiled_proxy.py.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import anyio
from mcp import Client

from bench.overhead import DEFAULT_TIME, ERAS, free_port, wait_for_port

GROUPS = (
    ("h11", "HTTP server: uvicorn and h11"),
    ("uvicorn", "HTTP server: uvicorn and h11"),
    ("httptools", "HTTP server: uvicorn and h11"),
    ("anyio", "anyio: tasks, cancel scopes, memory streams"),
    ("sniffio", "anyio: tasks, cancel scopes, memory streams"),
    ("sse_starlette", "sse-starlette"),
    ("starlette", "Starlette"),
    ("site-packages/mcp_types", "MCP SDK: transport, dispatcher, runner, types"),
    ("site-packages/mcp/", "MCP SDK: transport, dispatcher, runner, types"),
    ("pydantic", "pydantic"),
    ("mcp_spec_proxy/calls", "mcp-spec-proxy: the gate's read"),
    ("mcp_spec_proxy/backends", "mcp-spec-proxy: the backend leg"),
    ("mcp_spec_proxy", "mcp-spec-proxy: the front"),
    ("asyncio", "asyncio"),
    ("json", "json"),
)
WARMUP = 50
PROFILED = Path(__file__).resolve().parent / "profiled_proxy.py"


def group(filename: str) -> str:
    return next((name for key, name in GROUPS if key in filename), "builtins and the rest")


def by_library(path: Path, reads: int) -> dict[str, float]:
    """Self time per read (ms) of each library in the profile at `path`."""
    out: dict[str, float] = {}
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    for (filename, _line, _name), (_cc, _nc, self_time, _cum, _callers) in stats.items():
        out[group(filename)] = out.get(group(filename), 0.0) + self_time / reads * 1000
    return out


async def profile(name: str, tmp: Path, backend: str, reads: int, baseline: Path | None) -> dict[str, Path]:
    """Profile `name` (ours, or ours-before from `baseline`): one profile per client era."""
    config = tmp / f"{name}.yaml"
    config.write_text(f"servers:\n  time:\n    command: {backend}\n    args: []\nreview:\n  default: deny\n")
    port = free_port()
    prefix = tmp / name
    argv = [
        sys.executable,
        str(PROFILED),
        str(prefix),
        "--config",
        str(config),
    ]
    argv += ["--state-dir", str(tmp / f"state-{name}"), "--http", f"127.0.0.1:{port}"]
    env = {**os.environ, "PYTHONPATH": str(baseline)} if baseline is not None else None
    process = await anyio.open_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        await wait_for_port(port, process)
        for era in ERAS:
            async with Client(f"http://127.0.0.1:{port}/mcp", mode=era) as client:
                for _ in range(WARMUP):
                    await client.call_tool("time__get_current_time", {"timezone": "UTC"})
                process.send_signal(signal.SIGUSR1)
                await anyio.sleep(0.2)
                for _ in range(reads):
                    result = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
                    if result.is_error:
                        raise SystemExit(f"{name}: the read failed: {result.content}")
                process.send_signal(signal.SIGUSR2)
                await anyio.sleep(0.5)
    finally:
        process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
    return {era: Path(f"{prefix}.{n}") for n, era in enumerate(ERAS)}


async def run(args: argparse.Namespace, tmp: Path) -> None:
    columns: dict[str, dict[str, float]] = {}
    targets = [("ours", None)] + ([("ours-before", args.baseline)] if args.baseline is not None else [])
    for name, baseline in targets:
        for era, path in (await profile(name, tmp, args.backend_command, args.reads, baseline)).items():
            columns[f"{name}, {era}"] = by_library(path, args.reads)
    parts = sorted(
        {part for column in columns.values() for part in column},
        key=lambda p: -max(c.get(p, 0.0) for c in columns.values()),
    )
    print(f"self time per read (ms, profiled), {args.reads} reads per era after {WARMUP} unmeasured\n")
    print("| part | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for part in parts:
        print(f"| {part} | " + " | ".join(f"{column.get(part, 0.0):.2f}" for column in columns.values()) + " |")
    print("| **total** | " + " | ".join(f"{sum(column.values()):.2f}" for column in columns.values()) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reads", type=int, default=500, help="measured reads per client era (default 500)")
    parser.add_argument("--baseline", type=Path, help="also profile the mcp_spec_proxy in DIR (the code before)")
    parser.add_argument("--backend-command", default=str(DEFAULT_TIME), help="the stdio backend (mcp-server-time)")
    args = parser.parse_args()
    if args.reads < 1:
        parser.error("--reads must be at least 1")
    if args.baseline is not None and not (args.baseline / "mcp_spec_proxy" / "__init__.py").exists():
        parser.error(f"--baseline {args.baseline}: no mcp_spec_proxy package there")
    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(run, args, Path(tmp))


if __name__ == "__main__":
    main()
