"""`python -m bench.load`: the command (its help is the package's docstring)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

import bench.load
from bench.accepting import MODEL, accept_everything
from bench.load.checks import Check, Evidence, attribute_model_calls, check_promises, memory_info, proxy_log_problems
from bench.load.plan import Plan, notes_text, plan
from bench.load.process import ProxyProcess, spawn_proxy, wait_ready
from bench.load.report import report
from bench.load.sessions import Level, run_level
from bench.measure import machine_line
from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.testing import Respond, ScriptedModelServer

DEFAULT_LEVELS = "1,8,32,128"


def model_server() -> ScriptedModelServer:
    """The scripted strong model, accepting every write."""
    return ScriptedModelServer(Respond(accept_everything), models=(MODEL,))


def parse_levels(text: str, calls: int) -> list[tuple[int, int]]:
    levels = []
    for item in text.split(","):
        sessions, _, own = item.strip().partition(":")
        levels.append((int(sessions), int(own) if own else calls))
    if any(s < 1 or c < 1 for s, c in levels):
        raise ValueError("sessions and calls must be at least 1")
    return levels


@dataclass
class Measured:
    levels: list[Level]
    plans: list[Plan]
    proxy: ProxyProcess
    memory_file: Path
    idle: tuple[float, dict[str, float]]  # peak RSS after start, before the first level
    model_verifications: int
    exit_code: int | None


async def measure(args: argparse.Namespace, tmp: Path) -> Measured:
    root = tmp / "files"
    root.mkdir()
    notes = root / "notes.md"
    notes.write_text(notes_text())
    memory_file = tmp / "memory.jsonl"
    levels: list[Level] = []
    plans: list[Plan] = []
    async with model_server() as model:
        proxy = spawn_proxy(tmp, root, memory_file, model.base_url)
        try:
            await wait_ready(proxy, {"fs__write_file", "memory__create_entities", "memory__read_graph"})
            idle = proxy.peaks_mib()
            for n, (sessions, calls) in enumerate(args.levels):
                print(f"level {n + 1}/{len(args.levels)}: {sessions} sessions x {calls} calls ...", file=sys.stderr)
                level_plans = [plan(sessions, s, calls, root, notes) for s in range(sessions)]
                level = Level(sessions, calls)
                await run_level(proxy, level_plans, level)
                levels.append(level)
                plans += level_plans
        finally:
            code = await anyio.to_thread.run_sync(proxy.stop)
        return Measured(levels, plans, proxy, memory_file, idle, len(model.chat_requests), code)


def analyse(m: Measured) -> tuple[list[Check], list[str]]:
    audit_file = m.proxy.state / "audit.jsonl"
    audit = read_audit(audit_file) if audit_file.exists() else []
    telemetry = read_audit(m.proxy.telemetry) if m.proxy.telemetry.exists() else []
    issued = [call for level in m.levels for call in level.writes_issued]
    checks = check_promises(Evidence(audit, telemetry, issued, m.plans, m.model_verifications), m.levels)
    attribute_model_calls(m.levels, telemetry)
    checks.append(Check("the proxy stopped cleanly on SIGTERM", m.exit_code == 0, f"exit status {m.exit_code}"))
    problems = proxy_log_problems(m.proxy.log)
    info = [memory_info(m.plans, m.memory_file), f"proxy log: {len(problems)} WARNING/ERROR records"]
    info += [f"  {line[:400]}" for line in problems[:10]]
    return checks, info


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load",
        description=bench.load.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--levels",
        default=DEFAULT_LEVELS,
        help=f"sessions per level, comma-separated; SESSIONS:CALLS overrides --calls (default {DEFAULT_LEVELS})",
    )
    parser.add_argument("--calls", type=int, default=20, help="calls per session (default 20: 16 reads, 4 writes)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (proxy log, audit, telemetry)")
    args = parser.parse_args()
    try:
        args.levels = parse_levels(args.levels, args.calls)
    except ValueError as exc:
        parser.error(f"--levels: {exc}")
    print(f"machine: {machine_line()}; load average {os.getloadavg()[0]:.2f} at the start")
    started = time.perf_counter()
    work = contextlib.nullcontext(tempfile.mkdtemp(prefix="bench-load-")) if args.keep else None
    with work or tempfile.TemporaryDirectory(prefix="bench-load-") as name:
        if args.keep:
            print(f"work directory (kept): {name}")
        # asyncio: the scripted model server runs uvicorn on this event loop.
        measured = anyio.run(measure, args, Path(name), backend="asyncio")
        checks, info = analyse(measured)
    report(measured.levels, checks, info, measured.idle)
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    return 0 if all(check.ok for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
