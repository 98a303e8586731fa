"""Cost of review at the write barrier, measured side by side in one run.

    .venv/bin/python -m bench.review [--writes 200] [--warmup 5] [--session-writes 10]

Part 1, review overhead without model time. A write (`fs__write_file` with an `intent`, to a
small file in a temp dir) called sequentially over stdio through three targets:

    direct  the npm filesystem server itself (no proxy; the same write, without `intent`)
    allow   mcp-spec-proxy, `review: {default: allow}`: the write is held, audited, accepted
    strong  mcp-spec-proxy, `review: {default: strong}`: the verdict comes from the scripted
            model server (real HTTP, the proxy's real `openai` client), which accepts at once

Both proxies are the real command (`mcp-spec-proxy --config <yaml> --state-dir <tmp>
--telemetry <file>`), so both fsync three audit lines per write (held, verdict, forwarded) and
both write a telemetry line: strong - allow leaves those out, allow - direct has them in (one
fsynced append is timed on its own for reference). The targets are measured in blocks that
rotate between them. Each block is a fresh proxy process, so a fresh session (its first
`--warmup` writes are not measured), which keeps the reviewer's committed history and prompt
session-sized; and a fresh model server, which keeps the simulated prefix cache, the costly part
of its answer, as small. The "model time" is each chat request timed at the scripted server,
from arrival to the answer's last byte; `strong` less that, per call, is what review costs the
proxy itself (building the prompt, its openai client, HTTP, parsing the verdict).

Part 2, strong-model tokens per reviewed write on a realistic segment. One session through a
strong proxy: each write is preceded by three reads (read_text_file of a ~2 KB file,
list_directory, get_file_info). Per-call prompt, cached and completion tokens are read from the
proxy's telemetry. Token counts come from the scripted server's approximate tokenizer (a regex,
not a real model's) and its simulated prefix cache (16-token blocks): compare them with each
other, not with a provider's bill.

Prints a machine line, both parts, and markdown tables for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio
import uvicorn
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from bench.accepting import MODEL, accept_everything
from bench.backends import filesystem_argv
from bench.measure import machine_line, percentile
from mcp_spec_proxy.testing import CHAT_PATH, Respond, ScriptedModelServer

VENV_BIN = Path(sys.executable).parent

TARGETS = ("direct", "allow", "strong")
BLOCK = 25
READS_PER_WRITE = 3


def fsync_reference(directory: Path, count: int) -> list[float]:
    """An audit-sized line appended and fsynced, as the audit log does for each event, timed `count` times."""
    line = json.dumps({"ts": time.time(), "event": "verdict", "call": "0" * 12, "reason": "x" * 200}) + "\n"
    samples = []
    with open(directory / "fsync-probe.jsonl", "a", encoding="utf-8") as handle:
        for _ in range(count):
            started = time.perf_counter()
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
            samples.append((time.perf_counter() - started) * 1000)
    return samples


@dataclass
class Proxy:
    """One spawned mcp-spec-proxy: its argv and where its telemetry goes."""

    argv: list[str]
    telemetry: Path

    def decisions(self) -> list[dict[str, Any]]:
        lines = self.telemetry.read_text(encoding="utf-8").splitlines()
        return [event for event in map(json.loads, lines) if event.get("kind") == "decision"]


def spawn_proxy(name: str, review: str, fs_argv: list[str], base_url: str, tmp: Path) -> Proxy:
    config = {
        "servers": {"fs": {"command": fs_argv[0], "args": fs_argv[1:]}},
        "models": {"strong": {"base_url": base_url, "model": MODEL, "max_retries": 0}},
        "review": {"default": review},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    telemetry = tmp / f"telemetry-{name}.jsonl"
    argv = [str(VENV_BIN / "mcp-spec-proxy"), "--config", str(path), "--state-dir", str(tmp / f"state-{name}")]
    return Proxy([*argv, "--telemetry", str(telemetry), "--log-level", "WARNING"], telemetry)


async def connect(stack: AsyncExitStack, argv: list[str], errlog: TextIO) -> Client:
    params = StdioServerParameters(command=argv[0], args=argv[1:])
    return await stack.enter_async_context(Client(stdio_client(params, errlog=errlog), mode="legacy"))


def caller(client: Client, name: str, arguments: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        result = await client.call_tool(name, arguments)
        if result.is_error:
            raise SystemExit(f"{name} failed: {result.content}")

    return call


class TimedModelServer(ScriptedModelServer):
    """The scripted model server, timing each chat request at the server, with Nagle off.

    The time from a request's arrival to its answer's last byte is the "model": what remains of a
    strong write without it is the proxy's own review work, its openai client included. The
    server has no timing hook, so the app it serves is wrapped here (a private override).
    """

    def __init__(self) -> None:
        super().__init__(Respond(accept_everything), models=(MODEL,))
        self.handling_ms: list[float] = []

    def _app(self) -> Starlette:
        app = super()._app()
        app.add_middleware(_Timing, into=self.handling_ms)
        return app

    async def _serve(self, server: uvicorn.Server, sock: socket.socket, stopped: anyio.Event) -> None:
        # The listening socket is made with proto 0, so asyncio does not set TCP_NODELAY on the
        # connections it accepts; uvicorn writes an answer's headers and body separately, and Nagle
        # holds the body until the client's delayed ACK: about 40 ms on every answer. Set on the
        # listener, Linux passes it to every accepted connection. Remove once mcp_spec_proxy/testing/server.py does it.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await super()._serve(server, sock, stopped)


class _Timing:
    """ASGI middleware: appends the wall time of each chat-completions request to `into`."""

    def __init__(self, app: ASGIApp, into: list[float]) -> None:
        self.app = app
        self.into = into

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        await self.app(scope, receive, send)
        if scope["type"] == "http" and scope["path"] == CHAT_PATH:
            self.into.append((time.perf_counter() - started) * 1000)


@dataclass
class Overhead:
    samples: dict[str, list[float]] = field(default_factory=lambda: {t: [] for t in TARGETS})
    model_ms: list[float] = field(default_factory=list)  # each measured strong write's request, timed at the server
    round_trip_ms: list[float] = field(default_factory=list)  # the same request, timed by the proxy around its client
    prompt_tokens: list[int] = field(default_factory=list)
    fsync_ms: list[float] = field(default_factory=list)  # one fsynced audit-sized append, for reference

    def p(self, target: str, q: int) -> float:
        return percentile(self.samples[target], q)

    @property
    def strong_less_model(self) -> list[float]:
        """Each strong write less its own model time: the proxy's review work around the model."""
        return [total - model for total, model in zip(self.samples["strong"], self.model_ms, strict=True)]

    def less_model(self, q: int) -> float:
        return percentile(self.strong_less_model, q)

    def client_side(self, q: int) -> float:
        """What a model call costs the proxy beyond the server's own time (openai client, HTTP)."""
        return percentile([rt - m for rt, m in zip(self.round_trip_ms, self.model_ms, strict=True)], q)


async def measure_overhead(args: argparse.Namespace, tmp: Path, errlog: TextIO) -> Overhead:
    root = tmp / "overhead"
    root.mkdir()
    fs_argv = filesystem_argv(root)
    out = Overhead()
    done = rounds = 0
    while done < args.writes:
        block = min(BLOCK, args.writes - done)
        order = TARGETS[rounds % 3 :] + TARGETS[: rounds % 3]
        for target in order:
            proxy = model = None
            # A fresh process per block is a fresh session, so the reviewer's history stays session-sized;
            # a fresh model server keeps its simulated prefix cache (the costly part of its answer) as small.
            async with AsyncExitStack() as stack:
                path = str(root / f"{target}.txt")
                if target == "direct":
                    client = await connect(stack, fs_argv, errlog)
                    call = caller(client, "write_file", {"path": path, "content": "hello\n"})
                else:
                    model = await stack.enter_async_context(TimedModelServer())
                    proxy = spawn_proxy(f"{target}-{rounds}", target, fs_argv, model.base_url, tmp)
                    client = await connect(stack, proxy.argv, errlog)
                    arguments = {"path": path, "content": "hello\n", "intent": "the user asked to save a greeting"}
                    call = caller(client, "fs__write_file", arguments)
                for _ in range(args.warmup):
                    await call()
                samples = out.samples[target]
                for _ in range(block):
                    started = time.perf_counter()
                    await call()
                    samples.append((time.perf_counter() - started) * 1000)
            if proxy is None or model is None:
                continue
            decisions = proxy.decisions()
            if len(decisions) != args.warmup + block or any(d["action"] != "forwarded" for d in decisions):
                raise SystemExit(f"expected {args.warmup + block} forwarded writes in {proxy.telemetry}")
            if target == "strong":
                calls = [d["model_calls"] for d in decisions[args.warmup :]]
                server_ms = model.handling_ms[args.warmup :]
                if len(server_ms) != block or any(len(c) != 1 or not c[0]["ok"] for c in calls):
                    raise SystemExit(f"expected one successful model call per write in {proxy.telemetry}")
                out.model_ms += server_ms
                out.round_trip_ms += [c[0]["latency_ms"] for c in calls]
                out.prompt_tokens += [c[0]["prompt_tokens"] for c in calls]
        done += block
        rounds += 1
    return out


@dataclass
class Review:
    """What the strong model was sent for one reviewed write."""

    segment: int
    prompt: int
    cached: int
    completion: int

    @property
    def uncached(self) -> int:
        return self.prompt - self.cached


async def measure_tokens(args: argparse.Namespace, tmp: Path, errlog: TextIO) -> list[Review]:
    root = tmp / "session"
    root.mkdir()
    notes = root / "notes.md"
    notes.write_text(realistic_notes())
    fs_argv = filesystem_argv(root)
    async with ScriptedModelServer(Respond(accept_everything), models=(MODEL,)) as model, AsyncExitStack() as stack:
        proxy = spawn_proxy("session", "strong", fs_argv, model.base_url, tmp)
        client = await connect(stack, proxy.argv, errlog)
        for n in range(1, args.session_writes + 1):
            await caller(client, "fs__read_text_file", {"path": str(notes)})()
            await caller(client, "fs__list_directory", {"path": str(root)})()
            await caller(client, "fs__get_file_info", {"path": str(notes)})()
            arguments = {
                "path": str(root / f"summary-{n}.md"),
                "content": f"# Summary {n}\n\nThe release moves to Thursday; owners are listed in notes.md.\n",
                "intent": f"the user asked for summary {n} of notes.md, saved next to it",
            }
            await caller(client, "fs__write_file", arguments)()
    reviews = []
    for decision in proxy.decisions():
        (call,) = decision["model_calls"]
        reviews.append(
            Review(len(decision["segment"]), call["prompt_tokens"], call["cached_tokens"], call["completion_tokens"])
        )
    if len(reviews) != args.session_writes or any(r.segment != READS_PER_WRITE + 1 for r in reviews):
        raise SystemExit(f"session: expected {args.session_writes} reviews of 4-step segments in {proxy.telemetry}")
    return reviews


def realistic_notes() -> str:
    """About 2 KB of meeting notes: prose, a list, a table, the kind of file an agent reads."""
    lines = ["# Release planning, week 48", ""]
    lines += [
        "The release was planned for Tuesday. Two blockers remain: the migration script fails on",
        "databases created before 2024, and the installer still asks for a licence key on macOS.",
        "",
        "## Decisions",
        "",
        "- Move the release to Thursday; announce it in the changelog and on the mailing list.",
        "- Ship the migration fix behind a flag; default it on once support has tried it.",
        "- Drop the licence prompt: the key is read from the environment since 3.2.",
        "",
        "## Owners",
        "",
        "| item | owner | due |",
        "|---|---|---|",
    ]
    lines += [
        f"| task {i}: review and merge the open pull request | engineer {i} | day {i % 5 + 1} |" for i in range(15)
    ]
    lines += ["", "## Open questions", ""]
    lines += [f"{i}. Does the change in area {i} need a note in the upgrade guide?" for i in range(1, 7)]
    return "\n".join(lines) + "\n"


def mean(values: list[int]) -> float:
    return statistics.fmean(values) if values else 0.0


def token_row(label: str, reviews: list[Review]) -> list[str]:
    prompt = sum(r.prompt for r in reviews)
    share = sum(r.cached for r in reviews) / prompt if prompt else 0.0
    return [
        label,
        str(len(reviews)),
        f"{mean([r.prompt for r in reviews]):.0f}",
        f"{mean([r.cached for r in reviews]):.0f}",
        f"{mean([r.uncached for r in reviews]):.0f}",
        f"{mean([r.completion for r in reviews]):.0f}",
        f"{share:.0%}",
    ]


def report(
    args: argparse.Namespace, overhead: Overhead, reviews: list[Review], machine: str, elapsed: float, load: str
) -> None:
    o = overhead

    def both(values: list[float]) -> str:
        return f"p50 {percentile(values, 50):7.2f} ms   p99 {percentile(values, 99):7.2f} ms"

    print(f"machine: {machine}")
    print(
        f"part 1: {args.writes} writes per target in blocks of {BLOCK} rotating, each block a fresh session "
        f"after {args.warmup} warm-up writes; part 2: {args.session_writes} writes x {READS_PER_WRITE} reads "
        f"(the file read is {len(realistic_notes().encode())} bytes); "
        f"{elapsed:.0f}s; load average (1 min) {load}"
    )
    print("\nwrite_file, client-side latency:")
    for target in TARGETS:
        print(f"  {target:<6} {both(o.samples[target])}")
    print(f"  model time (scripted server, per request)     {both(o.model_ms)}")
    print(f"  model round trip seen by the proxy            {both(o.round_trip_ms)}")
    print(f"  strong less its model time                    {both(o.strong_less_model)}")
    added = (o.less_model(50) - o.p("allow", 50), o.less_model(99) - o.p("allow", 99))
    print(f"  allow - direct                    p50 {o.p('allow', 50) - o.p('direct', 50):+7.2f} ms")
    print(f"  strong - allow                    p50 {o.p('strong', 50) - o.p('allow', 50):+7.2f} ms")
    print(
        f"  review overhead without model time: (strong less model) - allow  p50 {added[0]:+.2f}  p99 {added[1]:+.2f}"
    )
    print(f"  of which the model call's client side (round trip - model time)  p50 {o.client_side(50):.2f} ms")
    print(f"  reference: one fsynced audit-sized append (3 per write) {both(o.fsync_ms)}")
    print(f"  strong prompts: {min(o.prompt_tokens)} to {max(o.prompt_tokens)} tokens (session depth grows per block)")

    print("\n| write_file | p50 (ms) | p99 (ms) | added over `allow`, p50 / p99 (ms) |")
    print("|---|---|---|---|")
    rows = [
        ("direct to server-filesystem (no proxy)", o.samples["direct"], "—"),
        ("proxy, `review: allow` (audit only)", o.samples["allow"], "—"),
        (
            "proxy, `review: strong` (scripted model, accepts at once)",
            o.samples["strong"],
            f"{o.p('strong', 50) - o.p('allow', 50):.2f} / {o.p('strong', 99) - o.p('allow', 99):.2f}",
        ),
        ("… model time (at the scripted server)", o.model_ms, ""),
        ("… model round trip (seen by the proxy)", o.round_trip_ms, ""),
        ("… `strong` less its model time, per call", o.strong_less_model, f"**{added[0]:.2f} / {added[1]:.2f}**"),
        ("reference: one fsynced audit-sized append (both proxies do 3 per write)", o.fsync_ms, ""),
    ]
    for label, values, extra in rows:
        print(f"| {label} | {percentile(values, 50):.2f} | {percentile(values, 99):.2f} | {extra} |")

    print("\n| reviewed writes | n | prompt | cached | uncached | completion | cached share of prompt |")
    print("|---|---|---|---|---|---|---|")
    print("| " + " | ".join(token_row("first write", reviews[:1])) + " |")
    print("| " + " | ".join(token_row("later writes", reviews[1:])) + " |")
    print("| " + " | ".join(token_row("all writes", reviews)) + " |")
    print("\nper write (prompt / cached / uncached / completion):")
    for n, r in enumerate(reviews, 1):
        print(f"  {n:>2}: {r.prompt:>6} / {r.cached:>6} / {r.uncached:>5} / {r.completion:>3}")
    print("token counts: the scripted server's approximate tokenizer and simulated prefix cache, not a real model's")


async def run(args: argparse.Namespace, tmp: Path, errlog: TextIO) -> tuple[Overhead, list[Review]]:
    print("part 1: write overhead ...", file=sys.stderr, flush=True)
    overhead = await measure_overhead(args, tmp, errlog)
    overhead.fsync_ms = await anyio.to_thread.run_sync(fsync_reference, tmp, args.writes)
    print("part 2: tokens per reviewed write ...", file=sys.stderr, flush=True)
    reviews = await measure_tokens(args, tmp, errlog)
    return overhead, reviews


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=200, help="measured writes per target (default 200)")
    parser.add_argument(
        "--warmup", type=int, default=5, help="unmeasured writes at the start of each block's session (default 5)"
    )
    parser.add_argument("--session-writes", type=int, default=10, help="reviewed writes in part 2 (default 10)")
    args = parser.parse_args()
    if args.writes < 2 or args.session_writes < 2 or args.warmup < 0:
        parser.error("--writes and --session-writes must be at least 2, --warmup at least 0")
    machine = machine_line()
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-review-") as name:
        tmp = Path(name)
        with open(tmp / "stderr.log", "w") as errlog:
            # asyncio: the scripted model server runs uvicorn on this event loop.
            overhead, reviews = anyio.run(run, args, tmp, errlog, backend="asyncio")
    # Other work on the machine moves absolute figures; interleaving spreads it, the load line shows it.
    load = f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after"
    report(args, overhead, reviews, machine, time.perf_counter() - started, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
