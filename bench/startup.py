"""Start-up of mcp-spec-proxy against its own backends, and its idle memory against a bare SDK hop.

    .venv/bin/python -m bench.startup [--repeat 3]

Time to first `tools/list`: from spawning a process over stdio to the answer of the client's first
`tools/list` (the client's handshake included), for

    direct  the backends themselves, all N spawned at once by N clients (the same contention the
            proxy's N children meet); the figure is the slowest one's, the bar the proxy is held to
    ours    mcp-spec-proxy with the same N backends (`review: {default: deny}`), one client
    late    the same proxy entered at `mcp_spec_proxy.cli:main` instead of the console script
            (`mcp_spec_proxy.launch`): its backends spawn only once the SDK has loaded, as
            before they were spawned early; the difference is what spawning early buys

with N = 1, 5 and 10 backends (mcp-server-time, a Python server, and the npm filesystem server,
alternating), and with N = 5 of which one never answers its handshake (the toy test server with
`--hang-at-start`, `startup_timeout: 30`): there the bar is the other four's direct start (the
hung one spawned beside them, as its start loads the machine under the proxy too), and
ours is also timed with the same config less the hung backend, side by side, to show what the
hung one alone costs the first list. Each row also says how many of the N backends' tools the
proxy's first answer held.

For one backend the bare SDK hop (bench/bare_proxy.py) is timed too: the floor any proxy built
on the SDK pays for starting its own interpreter and importing the SDK before it can spawn.

CPU before the first answer: for ours, the CPU seconds (user + system, from /proc) the proxy
process and, apart, its backends had spent when the first `tools/list` was answered. Once the
backends keep both cores busy, the first answer cannot come before (backends + proxy) / cores
seconds of CPU have run, while direct needs the backends' share alone: the proxy's own CPU, over
the number of cores, is what it adds at the least, however it schedules. The SDK's import is
part of it in any proxy built on the SDK.

Idle memory: RSS of the proxy process (children not counted) once it has answered `tools/list`
and one call and sat idle for a second, ours (`review: deny`, one backend) against
bench/bare_proxy.py (the bare SDK hop) in front of the same backend. Both processes are read from
/proc side by side in one run.

Process start and imports: `python -c "import mcp_spec_proxy.cli, …"` (what serving stdio imports)
against the same for the SDK modules the bare hop imports, and an empty interpreter.

Runs repeat `--repeat` times in rotation (direct, ours); the medians are printed.

`--before DIR` also times, in the same rotation, the console script of the package in DIR (an
earlier commit's tree: `git archive <commit> | tar -x -C DIR`), entered as `launch.main` with
DIR first on the path: a change to the start-up measured against what it replaced, side by side.
With it, the launcher's own critical path is timed for both trees too: from the interpreter's
start to the early spawn of one stdio backend (`/bin/true`), in fresh interpreters, interleaved.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from bench.measure import machine_line
from bench.overhead import DEFAULT_TIME, FALLBACK_NODE_MODULES, FALLBACK_TIME, FS_ENTRY, NODE22, NODE_MODULES, _first

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TOY = REPO / "tests" / "fixtures" / "toy_server.py"
SIZES = (1, 5, 10)
HUNG_SIZE = 5
CORES = os.cpu_count() or 1
BUDGET_S = 0.3  # the target: ours within the slowest backend's own start + this
# The command line without the console script's early spawn: backends start after the SDK loads.
LATE_ENTRY = "from mcp_spec_proxy.cli import main; main(prog_name='mcp-spec-proxy')"
# The console script of another tree's package (`--before`): its `launch.main`, DIR first on the path.
BEFORE_ENTRY = "import sys; sys.path.insert(0, {!r}); from mcp_spec_proxy.launch import main; main()"


@dataclass(frozen=True)
class Backend:
    name: str
    argv: list[str]
    hangs: bool = False


def backend_set(n: int, tmp: Path, *, hung: bool = False) -> list[Backend]:
    time_cmd = str(_first(DEFAULT_TIME, FALLBACK_TIME))
    fs_entry = str(_first(NODE_MODULES / FS_ENTRY, FALLBACK_NODE_MODULES / FS_ENTRY))
    node = str(NODE22) if NODE22.exists() else "node"
    root = tmp / "fsroot"
    root.mkdir(exist_ok=True)
    found = []
    for i in range(n - 1 if hung else n):
        if i % 2 == 0:
            found.append(Backend(f"time{i}", [time_cmd]))
        else:
            found.append(Backend(f"fs{i}", [node, fs_entry, str(root)]))
    if hung:
        found.append(Backend("hung", [sys.executable, str(TOY), "--hang-at-start"], hangs=True))
    return found


def proxy_config(backends: list[Backend], tmp: Path, tag: str) -> Path:
    lines = ["servers:"]
    for backend in backends:
        lines += [
            f"  {backend.name}:",
            f"    command: {_yaml(backend.argv[0])}",
            f"    args: [{', '.join(_yaml(a) for a in backend.argv[1:])}]",
            "    startup_timeout: 30",
        ]
    lines += ["review:", "  default: deny"]
    path = tmp / f"{tag}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _yaml(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


async def _first_list(argv: list[str], errlog: TextIO) -> tuple[float, set[str]]:
    """Seconds from spawn to the first tools/list answer, and the tool names it held."""
    started = time.perf_counter()
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        return time.perf_counter() - started, names


async def direct(backends: list[Backend], errlog: TextIO) -> float:
    """All the backends spawned at once; the slowest answering one's time to its first tools/list.

    A backend that hangs is spawned too, never waited for, and stopped after: its own start loads
    the machine the others start on, as it does under the proxy."""
    times: list[float] = []

    async def one(backend: Backend) -> None:
        elapsed, _ = await _first_list(backend.argv, errlog)
        times.append(elapsed)

    hung = [
        await anyio.open_process(b.argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errlog)
        for b in backends
        if b.hangs
    ]
    try:
        async with anyio.create_task_group() as tg:
            for backend in backends:
                if not backend.hangs:
                    tg.start_soon(one, backend)
    finally:
        for process in hung:
            process.kill()
            await process.wait()
    return max(times)


async def ours(
    config: Path,
    tmp: Path,
    backends: list[Backend],
    errlog: TextIO,
    *,
    late: bool = False,
    tree: Path | None = None,
) -> tuple[float, int, tuple[float, float]]:
    """Seconds to the first list, how many backends it held, and (proxy, backends) CPU seconds then."""
    entry = [sys.executable, "-c", LATE_ENTRY] if late else [str(VENV_BIN / "mcp-spec-proxy")]
    if tree is not None:  # `--before`: another tree's package, its console script
        entry = [sys.executable, "-c", BEFORE_ENTRY.format(str(tree))]
    argv = [*entry, "--config", str(config), "--state-dir", str(tmp / "state"), "--log-level", "WARNING"]
    before = set(_children())
    started = time.perf_counter()
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        elapsed = time.perf_counter() - started
        proxy = next(pid for pid in _children() if pid not in before)
        cpu = (_cpu_s(proxy), sum(_cpu_s(pid) for pid in _children(proxy)))
    present = sum(1 for b in backends if any(name.startswith(f"{b.name}__") for name in names))
    return elapsed, present, cpu


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of one live process (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    label: str
    n: int
    direct: list[float]
    ours: list[float]
    present: list[int]
    late: list[float]  # ours with its backends spawned after the SDK loads (`LATE_ENTRY`)
    bare: list[float]  # the bare SDK hop in front of the same backend: one-backend rows only
    without_hung: list[float]  # ours with the same config less its hung backend: the hung row only
    cpu: list[tuple[float, float]]  # ours: (proxy, its backends) CPU seconds at the first answer
    before: list[float] = field(default_factory=list)  # `--before DIR`: that tree's console script

    def line(self) -> str:
        d, o = statistics.median(self.direct), statistics.median(self.ours)
        late = statistics.median(self.late)
        proxy_cpu = statistics.median(c[0] for c in self.cpu)
        backends_cpu = statistics.median(c[1] for c in self.cpu)
        verdict = "within" if o <= d + BUDGET_S else "ABOVE"
        bare = f"{statistics.median(self.bare):.2f} ({statistics.median(self.bare) - d:+.2f})" if self.bare else "-"
        return (
            f"| {self.label} | {d:.2f} | {o:.2f} | {o - d:+.2f} | {proxy_cpu:.2f} | {backends_cpu:.2f}"
            f" | {proxy_cpu / CORES:+.2f}"
            f" | {late:.2f} ({late - d:+.2f}) | {bare} | {min(self.present)}-{max(self.present)} of {self.n}"
            f" | {verdict} |"
        )


async def startup_rows(tmp: Path, repeat: int, errlog: TextIO, before: Path | None = None) -> list[Row]:
    cases = [(f"{n} backend{'s' if n > 1 else ''}", backend_set(n, tmp)) for n in SIZES]
    cases.append((f"{HUNG_SIZE} backends, one hung", backend_set(HUNG_SIZE, tmp, hung=True)))
    rows = []
    for label, backends in cases:
        print(f"measuring {label} ...", file=sys.stderr, flush=True)
        row = Row(label, len(backends), [], [], [], [], [], [], [])
        config = proxy_config(backends, tmp, f"n{len(backends)}{'h' if label.endswith('hung') else ''}")
        for _ in range(repeat):
            row.direct.append(await direct(backends, errlog))
            elapsed, present, cpu = await ours(config, tmp, backends, errlog)
            row.ours.append(elapsed)
            row.present.append(present)
            row.cpu.append(cpu)
            row.late.append((await ours(config, tmp, backends, errlog, late=True))[0])
            if before is not None:
                row.before.append((await ours(config, tmp, backends, errlog, tree=before))[0])
            if any(b.hangs for b in backends):
                others = [b for b in backends if not b.hangs]
                row.without_hung.append((await ours(proxy_config(others, tmp, "others"), tmp, others, errlog))[0])
            if len(backends) == 1:
                bare = [sys.executable, str(REPO / "bench" / "bare_proxy.py"), "--", *backends[0].argv]
                row.bare.append((await _first_list(bare, errlog))[0])
        rows.append(row)
    return rows


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _children(parent: int | None = None) -> dict[int, str]:
    """The child processes of `parent` (default: this process): pid -> command line."""
    parent = os.getpid() if parent is None else parent
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat.rsplit(b")", 1)[1].split()[1]) == parent:
            found[int(entry)] = cmdline
    return found


async def idle_rss(tmp: Path, errlog: TextIO) -> dict[str, float]:
    """RSS of ours and of the bare hop, each in front of mcp-server-time, idle after one list and call."""
    backend = backend_set(1, tmp)[0]
    config = proxy_config([backend], tmp, "rss")
    targets = {
        "bare": [sys.executable, str(REPO / "bench" / "bare_proxy.py"), "--", *backend.argv],
        "ours": [str(VENV_BIN / "mcp-spec-proxy"), "--config", str(config), "--state-dir", str(tmp / "rss-state")],
        "late": [sys.executable, "-c", LATE_ENTRY, "--config", str(config), "--state-dir", str(tmp / "rss-late")],
    }
    found: dict[str, float] = {}
    async with AsyncExitStack() as stack:
        for target, argv in targets.items():
            before = set(_children())
            params = StdioServerParameters(command=argv[0], args=argv[1:])
            client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog), mode="legacy"))
            tools = (await client.list_tools()).tools
            name = next(t.name for t in tools if t.name.endswith("get_current_time"))
            await client.call_tool(name, {"timezone": "UTC"})
            pid = next(pid for pid in _children() if pid not in before)
            found[target] = pid
        await anyio.sleep(1.0)
        return {target: _rss_mib(int(pid)) for target, pid in found.items()}


IMPORTS = {
    "interpreter": "pass",
    "sdk": "import mcp.client.stdio, mcp.server.lowlevel, mcp.server.stdio",  # what bare_proxy.py imports
    # What serving stdio imports: the command line loads the proxy and its fronts only when it serves.
    "ours": "import mcp_spec_proxy.cli, mcp_spec_proxy.proxy, mcp_spec_proxy.fronts.mcp, mcp_spec_proxy.fronts.stdio",
}


# The launcher up to its early spawn, in a fresh interpreter; either tree's `start_backends`.
SPAWN_PROBE = """import sys, time
started = time.perf_counter()
sys.path.insert(0, {tree!r})
import inspect
from mcp_spec_proxy import launch
handed = ()
if len(inspect.signature(launch.start_backends).parameters) > 1:  # the launcher hands its processes down
    from mcp_spec_proxy.prespawn import Prespawned
    handed = (Prespawned(),)
launch.start_backends(["--config", {config!r}, "--state-dir", {state!r}], *handed)
print(time.perf_counter() - started)
"""


def spawn_times(tmp: Path, trees: dict[str, Path], repeat: int) -> dict[str, float]:
    """Median seconds from a fresh interpreter's start to the early spawn, each tree's, interleaved."""
    config = tmp / "spawn.yaml"
    config.write_text("servers:\n  t:\n    command: /bin/true\nreview: {default: deny}\n")
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(repeat):
        for name, tree in trees.items():
            code = SPAWN_PROBE.format(tree=str(tree), config=str(config), state=str(tmp / "spawn-state"))
            out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
            samples[name].append(float(out.stdout.split()[-1]))
    return {name: statistics.median(found) for name, found in samples.items()}


def import_times(repeat: int) -> dict[str, float]:
    """Median wall seconds of `python -c <import>`, the three interleaved."""
    samples: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(repeat):
        for name, code in IMPORTS.items():
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(found) for name, found in samples.items()}


async def measure(args: argparse.Namespace, tmp: Path, errlog: TextIO) -> tuple[list[Row], dict[str, float]]:
    rows = await startup_rows(tmp, args.repeat, errlog, args.before.resolve() if args.before else None)
    print("measuring idle RSS ...", file=sys.stderr, flush=True)
    rss = await idle_rss(tmp, errlog)
    return rows, rss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case, medians printed (default 3)")
    parser.add_argument("--before", type=Path, help="also time the console script of the package in this tree")
    args = parser.parse_args()
    print(f"machine: {machine_line()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("measuring import times ...", file=sys.stderr, flush=True)
    imports = import_times(max(5, args.repeat))
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as name:
        tmp = Path(name)
        if args.before is not None:
            trees = {"before": args.before.resolve(), "ours": REPO}
            spawned = spawn_times(tmp, trees, max(15, args.repeat))
        with open(tmp / "stderr.log", "w") as errlog:
            rows, rss = anyio.run(measure, args, tmp, errlog)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\ntime to first tools/list, seconds (median of {args.repeat}); target: ours ≤ direct + {BUDGET_S} s")
    print(
        "| backends | direct, slowest (s) | ours (s) | ours - direct | proxy CPU (s) | backends' CPU (s)"
        f" | proxy CPU / {CORES} cores | late spawn (s, - direct) | bare hop (s, - direct)"
        " | backends in ours' first list | target |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row.line())
    if args.before is not None:
        print(f"\nbefore and after, side by side (the package in {args.before} against this one):")
        print("| backends | direct (s) | before (s, - direct) | ours (s, - direct) | ours - before (s) |")
        print("|---|---|---|---|---|")
        for row in rows:
            d, b, o = (statistics.median(x) for x in (row.direct, row.before, row.ours))
            print(f"| {row.label} | {d:.2f} | {b:.2f} ({b - d:+.2f}) | {o:.2f} ({o - d:+.2f}) | {o - b:+.2f} |")
        print(
            f"the launcher to its early spawn (median of {max(15, args.repeat)}): before {spawned['before']:.3f} s,"
            f" ours {spawned['ours']:.3f} s ({spawned['ours'] - spawned['before']:+.3f})"
        )
    for row in rows:
        if row.without_hung:
            cost = statistics.median(row.ours) - statistics.median(row.without_hung)
            print(
                f"\n{row.label}: ours {statistics.median(row.ours):.2f} s, ours without the hung backend"
                f" {statistics.median(row.without_hung):.2f} s: the hung backend costs the first list {cost:+.2f} s"
            )
    print(
        f"\nprocess start and imports, seconds (median of {max(5, args.repeat)}): interpreter alone"
        f" {imports['interpreter']:.2f}, the SDK as the bare hop imports it {imports['sdk']:.2f},"
        f" mcp_spec_proxy.cli {imports['ours']:.2f} (ours - sdk {imports['ours'] - imports['sdk']:+.2f})"
    )
    gap = rss["ours"] - rss["bare"]
    print(
        f"\nidle RSS, review: deny, one backend: ours {rss['ours']:.1f} MiB, bare hop {rss['bare']:.1f} MiB,"
        f" difference {gap:+.1f} MiB ({'within' if gap <= 15 else 'ABOVE'} the 15 MiB target);"
        f" late spawn {rss['late']:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
