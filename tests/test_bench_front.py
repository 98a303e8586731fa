"""bench.front_load and bench.front_profile in their smallest modes, run as a reader runs them: the report's
shape, not its timings. Every target front_load names has a row with its CPU, its wall time and a rate at each
level, and a ratio against ours; a peer that is not installed is named in one line. front_profile's table has a
column for each client era, and each column holds time spent in the proxy's own code: the reads ran while the
profiler was on. Real processes: the time backend, the bare hop, ours over streamable HTTP and, for
`--baseline`, ours again from a named tree (this one)."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from contextlib import AsyncExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, cast

import anyio.abc
import pytest

from bench import front_cannon, front_load, overhead, overhead_report, peers
from bench.front_clients import ClientPool

REPO = Path(__file__).resolve().parent.parent
NUMBER = r"(\d+\.\d+|\d+)"
LOAD_ROW = re.compile(rf"^\| (\S+) \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \|$")
LEVEL_LINE = re.compile(r"^  (\d+) sessions, (\S+): (\d+\.\d) reads/s$")
X = r"\d+\.\d\dx"
RATIO = re.compile(rf"^ours-http / (\S+): CPU per read {X}; throughput 1 sessions {X}, 2 sessions {X}$")
SHARE_ROW = re.compile(rf"^\| (\S+) \| (\d+) \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| (\d+) \|$")


def _time_server() -> Path:
    time_server = overhead.DEFAULT_TIME if overhead.DEFAULT_TIME.exists() else overhead.FALLBACK_TIME
    if not time_server.exists():
        pytest.skip(f"{time_server} is missing: run scripts/install-test-backends.sh")
    return time_server


def run_bench(module: str, *flags: str, bench_dir: Path | None = None, timeout: int = 300) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if bench_dir is not None:
        env["MCP_BENCH_DIR"] = str(bench_dir)
    done = subprocess.run(
        [sys.executable, "-m", module, *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout, done.stderr


def test_front_load_reports_cpu_wall_and_each_level_for_every_target_and_names_the_peers_left_out(
    tmp_path: Path,
) -> None:
    backend = _time_server()
    code, report, err = run_bench(
        "bench.front_load",
        *("--calls", "50", "--levels", "1,2", "--reads", "2", "--rounds", "1", "--clients", "2"),
        *("--baseline", str(REPO), "--backend-command", str(backend)),
        bench_dir=tmp_path,  # an empty bench folder: no peers
    )
    assert "Traceback" not in err, err
    assert code == 0, err
    lines = report.splitlines()
    assert any(line.startswith("fastmcp-http: skipped, not installed") for line in lines), report
    assert any(line.startswith("mcp-proxy-http: skipped, not installed") for line in lines), report
    targets = ["ours-http", "ours-before-http", "bare-http"]
    assert "| target | CPU s per 1,000 reads | wall ms per read | 1 sessions, reads/s | 2 sessions, reads/s |" in lines
    rows = {m[1]: m.groups()[1:] for line in lines if (m := LOAD_ROW.match(line))}
    assert sorted(rows) == sorted(targets), report
    for name, (cpu, wall, *rates) in rows.items():
        # Each target served its reads: its process spent CPU on them, and every level moved reads.
        assert float(cpu) > 0 and float(wall) > 0, (name, cpu, wall)
        assert all(float(rate) > 0 for rate in rates), (name, rates)
    levels = {(m[2], m[1]) for line in lines if (m := LEVEL_LINE.match(line))}
    assert levels == {(name, level) for name in targets for level in ("1", "2")}, report
    ratios = {m[1] for line in lines if (m := RATIO.match(line))}
    assert ratios == {"ours-before-http", "bare-http"}, report
    assert "throughput sessions shared out among 2 client processes" in lines, report
    # The sessions ran in the client processes: each level of each target has its CPU row, and the
    # clients' CPU is theirs (this process makes no throughput read; a few reads may take the target
    # less than one tick of /proc, so only the clients' figure, from their own clocks, must be above 0).
    shares = {(m[1], m[2]): m.groups()[2:] for line in lines if (m := SHARE_ROW.match(line))}
    assert set(shares) == {(name, level) for name in targets for level in ("1", "2")}, report
    for (name, level), (rate, clients, target, backend_ms, whole, busy) in shares.items():
        assert float(rate) > 0 and float(clients) > 0, (name, level, rate, clients)
        parts = float(clients) + float(target) + float(backend_ms)
        assert abs(float(whole) - parts) <= 0.02, (name, level, whole, parts)
        assert 0 <= int(busy) <= 100, (name, level, busy)


def test_front_profile_gives_each_client_era_a_column_with_the_proxys_own_time(tmp_path: Path) -> None:
    backend = _time_server()
    code, report, err = run_bench("bench.front_profile", "--reads", "5", "--backend-command", str(backend))
    assert "Traceback" not in err, err
    assert code == 0, err
    lines = report.splitlines()
    assert "self time per read (ms, profiled), 5 reads per era after 50 unmeasured" in lines, report
    assert "| part | ours, legacy | ours, 2026-07-28 |" in lines, report
    table = {
        cells[0]: [float(cell) for cell in cells[1:]]
        for line in lines
        if line.startswith("| ") and not line.startswith("| part")
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    assert "**total**" in table, report
    assert all(total > 0 for total in table["**total**"]), report
    # The profiler saw the reads themselves: the proxy's front and its backend leg ran in each era.
    for part in ("mcp-spec-proxy: the front", "mcp-spec-proxy: the backend leg"):
        assert part in table and all(value > 0 for value in table[part]), (part, report)


@pytest.mark.parametrize(
    ("module", "flags", "says"),
    [
        ("bench.front_load", ["--levels", "16,many"], "--levels '16,many': give numbers of sessions"),
        ("bench.front_load", ["--calls", "10"], "--calls must be at least 50"),
        ("bench.front_load", ["--clients", "0"], "--clients at least 1"),
        ("bench.front_profile", ["--reads", "0"], "--reads must be at least 1"),
        ("bench.front_profile", ["--baseline", "/nonexistent"], "--baseline /nonexistent: no mcp_spec_proxy package"),
    ],
)
def test_bad_flags_are_one_line_naming_the_fix(module: str, flags: list[str], says: str) -> None:
    code, _, err = run_bench(module, *flags, timeout=60)
    assert code == 2
    assert "Traceback" not in err
    assert says in err


@pytest.mark.anyio
async def test_a_client_process_whose_read_fails_is_named_in_one_line(tmp_path: Path) -> None:
    chosen = argparse.Namespace(backends="time", backend_command=str(_time_server()))
    backend = overhead.backends(chosen, tmp_path, None)[0]
    order = {"url": "", "tool": "no_such_tool", "arguments": {}, "era": "2026-07-28", "roots": False, "reads": 2}
    with pytest.raises(SystemExit) as raised:
        async with AsyncExitStack() as stack:
            target = await front_load.start(stack, "bare-http", backend, tmp_path, None)
            pool = await ClientPool.start(stack, 2)
            await pool.open({**order, "url": target.url}, 3)
    said = str(raised.value)
    assert said.startswith("a client process (pid ") and said.endswith("Unknown tool: no_such_tool"), said
    assert "\n" not in said


class _Answers(BaseHTTPRequestHandler):
    """Answers each POST in turn from `ANSWERS`, noting the session header and the body it came with."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list[tuple[str | None, dict[str, Any]]]] = []
    turn: ClassVar[threading.Lock] = threading.Lock()
    RESULT = b'{"jsonrpc":"2.0","id":"x","result":{"content":[]}}'
    ANSWERS: ClassVar[list[tuple[int, str, bytes]]] = [
        (200, "application/json", RESULT),
        # A priming event before the answer, a comment after it.
        (200, "text/event-stream", b"id: 0\r\ndata: \r\n\r\ndata: " + RESULT + b"\r\n\r\n: bye\r\n\r\n"),
        # One message over two data lines, which EventSource joins with a newline.
        (200, "text/event-stream", b'data: {"jsonrpc":"2.0","id":"x",\ndata: "result":{"content":[]}}\n\n'),
        (200, "application/json", b'{"jsonrpc":"2.0","id":"x","result":{"content":[],"isError":true}}'),
        (200, "application/json", b'{"jsonrpc":"2.0","id":"x","error":{"code":-32602,"message":"no"}}'),
        (500, "text/plain", b"broken"),
        (200, "application/json", b'{"jsonrpc":"2.0","id":"x","result":{}}'),
        (200, "application/json", b'{"jsonrpc":"2.0","id":"x","result":{"content":[],"resultType":"input_required"}}'),
        (202, "application/json", b""),
    ]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.turn:  # the connections' threads take the answers in turn
            status, kind, answer = self.ANSWERS[len(self.seen) % len(self.ANSWERS)]
            self.seen.append((self.headers.get("mcp-session-id"), body))
        self.send_response(status)
        self.send_header("content-type", kind)
        if kind == "text/event-stream":  # as a stream is sent: chunked, here cut in the middle of its message
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            half = len(answer) // 2
            for chunk in (answer[:half], answer[half:], b""):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            return
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def test_autocannon_counts_only_results_and_sends_each_read_with_its_own_id_and_its_session(tmp_path: Path) -> None:
    """The autocannon driver's check, from outside: of eighteen answers cycling through a JSON result, an
    SSE result after a priming event, one split over two data lines, an isError result, a JSON-RPC error,
    a 500, an empty result, an input_required one and a 202, six are reads; every request carried the
    recorded body with an id of its own, and each connection its own session."""
    if why := peers.missing("autocannon"):
        pytest.skip(f"autocannon {why}")
    _Answers.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    call = {"jsonrpc": "2.0", "id": "[<id>]", "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    order = {
        "autocannon": str(peers.autocannon_dir()),
        "url": f"http://127.0.0.1:{server.server_address[1]}/mcp",
        "headers": {"content-type": "application/json", "accept": "application/json, text/event-stream"},
        "body": json.dumps(call),
        "sessions": ["one", "two"],
        "connections": 2,
        "amount": 18,
    }
    (tmp_path / "order.json").write_text(json.dumps(order))
    try:
        done = subprocess.run(
            [peers.node(), str(front_cannon.SCRIPT), str(tmp_path / "order.json")],
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr
    report = front_cannon._report(done)
    assert (report["reads"], report["bad"], report["errors"]) == (6, 12, 0), report
    assert len(_Answers.seen) == 18
    assert {session for session, _ in _Answers.seen} == {"one", "two"}
    ids = [body.pop("id") for _, body in _Answers.seen]
    assert len(set(ids)) == 18 and "[<id>]" not in ids, ids
    assert all(body == {key: value for key, value in call.items() if key != "id"} for _, body in _Answers.seen)


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
def test_front_load_driven_by_autocannon_reports_every_target_with_the_load_generators_cpu(
    tmp_path: Path, era: str
) -> None:
    if why := peers.missing("autocannon"):
        pytest.skip(f"autocannon {why}")
    backend = _time_server()
    code, report, err = run_bench(
        "bench.front_load",
        *("--driver", "autocannon", "--era", era, "--calls", "50", "--levels", "1,3", "--reads", "5"),
        *("--rounds", "1", "--backend-command", str(backend)),
        bench_dir=tmp_path,  # no peers
    )
    assert "Traceback" not in err, err
    assert code == 0, err
    lines = report.splitlines()
    assert "throughput read by npm autocannon, one connection a session" in lines, report
    levels = {(m[2], m[1]) for line in lines if (m := LEVEL_LINE.match(line))}
    assert levels == {(name, level) for name in ("ours-http", "bare-http") for level in ("1", "3")}, report
    shares = {(m[1], m[2]): m.groups()[2:] for line in lines if (m := SHARE_ROW.match(line))}
    assert len(shares) == 4, report
    for (name, level), (rate, clients, *_) in shares.items():
        assert float(rate) > 0 and float(clients) > 0, (name, level, rate, clients)


def test_the_autocannon_driver_not_installed_is_one_line_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(peers, "autocannon_dir", lambda: tmp_path)
    monkeypatch.setattr(sys, "argv", ["front_load", "--driver", "autocannon"])
    with pytest.raises(SystemExit) as raised:
        front_load.main()
    assert raised.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(
        "--driver autocannon: not installed ("
        + str(tmp_path / "node_modules" / "autocannon")
        + " is missing; run scripts/install-test-backends.sh)"
    ), said


class _Refusing(_Answers):
    """A result in every body, under a 503: a read only by its body."""

    seen: ClassVar[list[tuple[str | None, dict[str, Any]]]] = []
    ANSWERS: ClassVar[list[tuple[int, str, bytes]]] = [(503, "application/json", _Answers.RESULT)]


@pytest.mark.anyio
async def test_an_autocannon_level_whose_answers_are_not_2xx_gives_no_figure_in_one_line() -> None:
    if why := peers.missing("autocannon"):
        pytest.skip(f"autocannon {why}")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/mcp"
    call = {"jsonrpc": "2.0", "id": "[<id>]", "method": "tools/call", "params": {"name": "t", "arguments": {}}}
    plan = {
        "autocannon": str(peers.autocannon_dir()),
        "url": url,
        "headers": {"content-type": "application/json", "accept": "application/json, text/event-stream"},
        "body": json.dumps(call),
        "sessions": None,
        "connections": 2,
        "amount": 4,
    }
    try:
        with pytest.raises(SystemExit) as raised:
            await front_cannon.fire(plan)
    finally:
        server.shutdown()
    said = str(raised.value)
    assert len(_Refusing.seen) == 4
    assert said == (
        f"{url}: 0 answers without a result, 0 connection errors, 4 answers not 2xx, 4 of 4 reads answered:"
        " no figure from this level"
    ), said


@pytest.mark.anyio
async def test_an_autocannon_level_measures_the_target_after_its_sessions_open_and_before_they_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's handshakes, first reads and closing are not the level's: the target's CPU is read after
    the sessions are open and again before they close, as the SDK driver's pool has them open first."""
    happened: list[str] = []

    async def open_level(stack: AsyncExitStack, order: dict[str, Any], sessions: int) -> dict[str, Any]:
        happened.append("opened")
        stack.callback(happened.append, "closed")
        return {"amount": sessions * order["reads"]}

    async def fire(plan: dict[str, Any]) -> dict[str, Any]:
        happened.append("fired")
        return {"reads": plan["amount"], "seconds": 1.0, "cpu": 0.5}

    def cpu_seconds(pid: int) -> float:
        happened.append("target CPU")
        return 0.0

    monkeypatch.setattr(front_cannon, "open_level", open_level)
    monkeypatch.setattr(front_cannon, "fire", fire)
    monkeypatch.setattr(front_load, "cpu_seconds", cpu_seconds)
    monkeypatch.setattr(front_load, "descendants_cpu", lambda pid: 0.0)
    process = cast(anyio.abc.Process, SimpleNamespace(pid=os.getpid()))
    target = front_load.Served("ours-http", process, "http://127.0.0.1:1/mcp", "time__get_current_time")
    backend = overhead_report.Backend("time", "time", ["t"], "get_current_time", {"timezone": "UTC"}, ("legacy",))
    rate = await front_load.throughput(None, target, backend, "legacy", 4, 10)
    assert happened == ["opened", "target CPU", "fired", "target CPU", "closed"], happened
    assert rate.reads_per_s == 40.0
