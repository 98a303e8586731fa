"""The MCP conformance suite's server scenarios, run directly against this project's fixture and behind proxies.

tests/test_conformance.py (direct, mcp-spec-proxy) and bench/conformance.py (those and fastmcp)
run through here, so the test and the figures in docs/BENCHMARKS.md come from one runner.

The server is tests/fixtures/conformance_server.py, the project's own implementation of the
suite's "everything server" contract, in both protocol eras. Directly, it serves streamable HTTP
(`--http 0`) under the names the scenarios call (`--suite-names`: tool `test_simple_text`, prompt
`test_simple_prompt`, tool `json_schema_2020_12_tool`). Behind mcp-spec-proxy it runs on stdio as
backends `test` and `json` (`--json-schema`, its one tool) with separator `_`: the fixture serves
`simple_text`, and the proxy serves it as `test_` + `simple_text`, the name the scenario calls.
Resource URIs (`test://...`) are not namespaced.

Every process is started with a bounded wait for the line that says it listens, and stopped with
terminate, a bounded wait, then kill. A suite run is bounded by its timeout; what it wrote before
a timeout still counts (a scenario it never reached has no checks and does not pass).
"""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.backends import REPO, conformance_cli
from tests.harness import PROXY_COMMAND

FIXTURE = Path(__file__).parent / "fixtures" / "conformance_server.py"
START_TIMEOUT = 60.0  # seconds for a server or proxy to say it listens
STOP_TIMEOUT = 15.0
SUITE_TIMEOUT = 180.0  # seconds for one `--suite all` run (tens of seconds on a busy 2-core machine)
NOT_OK = ("FAILURE", "WARNING")  # the suite's other statuses: SUCCESS, INFO (a trace of what was sent)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
RESULT_DIR = re.compile(r"server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z")  # the suite's -o layout: server-<scenario>-<time>
PROXY_SERVING = re.compile(rb"serving streamable HTTP on (http://\S+/mcp)")
FIXTURE_SERVING = re.compile(rb"serving streamable HTTP on (http://\S+/mcp)")
# The shipped defaults but for `review.default`: the fixture's tools are all annotated read-only,
# so they pass the gate under `deny` too; `allow` keeps any unannotated one the suite adds unheld.
PARITY_REVIEW: dict[str, Any] = {"default": "allow"}


# The suite's `latest` tag and its newest release (scripts/install-test-backends.sh pins both).
SUITES = ("0.1.16", "0.2.0-alpha.12")


@dataclass(frozen=True)
class Outcome:
    """One scenario's checks.json entries."""

    checks: tuple[dict[str, Any], ...]

    @property
    def passed(self) -> bool:
        """At least one SUCCESS and no FAILURE or WARNING."""
        return any(c["status"] == "SUCCESS" for c in self.checks) and not self.problems

    @property
    def problems(self) -> list[str]:
        return [f"{c['status']} {c['id']}: {c.get('errorMessage', '')}" for c in self.checks if c["status"] in NOT_OK]


@dataclass(frozen=True)
class SuiteRun:
    """Every scenario one `conformance server --suite all` run reached, by name."""

    returncode: int
    output: str
    outcomes: dict[str, Outcome]

    def outcome(self, scenario: str) -> Outcome:
        return self.outcomes.get(scenario, Outcome(()))

    @property
    def passed(self) -> set[str]:
        return {name for name, outcome in self.outcomes.items() if outcome.passed}


def run_suite(suite: str, url: str, results: Path, timeout: float = SUITE_TIMEOUT) -> SuiteRun:
    """All server scenarios of `suite` against `url`, their results under `results` (made here)."""
    results.mkdir(parents=True)
    argv = [*conformance_cli(suite).argv, "server", "--url", url, "--suite", "all", "-o", str(results)]
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=results)
        returncode, output = run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        returncode, output = -1, f"timed out after {timeout:.0f}s\n{partial}"
    outcomes: dict[str, Outcome] = {}
    for path in results.glob("server-*/checks.json"):
        if match := RESULT_DIR.fullmatch(path.parent.name):
            outcomes[match.group(1)] = Outcome(tuple(json.loads(path.read_text())))
    return SuiteRun(returncode, ANSI.sub("", output), outcomes)


def list_scenarios(suite: str) -> list[str]:
    """The server scenarios `conformance list` names, in its order."""
    run = subprocess.run([*conformance_cli(suite).argv, "list"], capture_output=True, text=True, timeout=60, check=True)
    section = run.stdout.split("Server scenarios", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\s+- (\S+)", section, re.MULTILINE)


@dataclass
class Served:
    """A process that listens on `url`; `log` collects what it printed."""

    url: str
    process: subprocess.Popen[bytes]
    log: list[str] = field(default_factory=list)

    def log_tail(self) -> str:
        return "".join(self.log)[-4000:]


@contextmanager
def serving(
    what: str,
    argv: Sequence[str],
    ready: re.Pattern[bytes],
    url: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Iterator[Served]:
    """Start `argv` (stdout and stderr as one stream) and yield once its output matches `ready`.

    `url` may hold `{0}`, filled with the match's first group; `what` names it in errors.
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    assert proc.stdout is not None
    stream = proc.stdout
    served = Served("", proc)
    # Keeps the pipe drained (and the log at hand for failure messages) once it listens.
    drain = threading.Thread(
        target=lambda: served.log.extend(line.decode(errors="replace") for line in stream), daemon=True
    )
    try:
        found = _read_until(proc, ready, served.log, what)
        served.url = url.format(found.decode())
        drain.start()
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if drain.ident is not None:  # started
            drain.join(timeout=5)
        stream.close()


def _read_until(proc: subprocess.Popen[bytes], ready: re.Pattern[bytes], log: list[str], what: str) -> bytes:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    seen = b""
    deadline = time.monotonic() + START_TIMEOUT
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (found := ready.search(seen)) is None:
            remaining = deadline - time.monotonic()
            chunk = os.read(fd, 65536) if remaining > 0 and selector.select(remaining) else None
            if not chunk:
                log.append(seen.decode(errors="replace"))
                why = "exited" if chunk == b"" else f"did not listen within {START_TIMEOUT:.0f}s"
                raise RuntimeError(f"{what} {why}; its output:\n{''.join(log)[-4000:]}")
            seen += chunk
    log.append(seen.decode(errors="replace"))
    return found.group(1)


@contextmanager
def fixture_server() -> Iterator[Served]:
    """The fixture on streamable HTTP, on a free loopback port, under the names the suite calls."""
    argv = [sys.executable, str(FIXTURE), "--suite-names", "--http", "0"]
    with serving("conformance fixture", argv, FIXTURE_SERVING, "{0}") as served:
        yield served


def fixture_stdio() -> list[str]:
    """The fixture on stdio under the names the suite calls: for a proxy that does not namespace."""
    return [sys.executable, str(FIXTURE), "--suite-names"]


def proxy_config(review: dict[str, Any], protocol: str = "legacy") -> dict[str, Any]:
    """The proxy in front of the fixture on stdio, as `test` and (its one tool) `json`.

    `protocol: legacy` is the default a servers.yaml entry gets; `auto` takes 2026-07-28.
    """
    command = {"command": sys.executable, "protocol": protocol}
    return {
        "servers": {
            "test": {**command, "args": [str(FIXTURE)]},
            "json": {**command, "args": [str(FIXTURE), "--json-schema"]},
        },
        "separator": "_",
        "review": review,
    }


def shipped_review() -> dict[str, Any]:
    """The `review:` section of the servers.yaml the project ships."""
    review: dict[str, Any] = yaml.safe_load((REPO / "servers.yaml").read_text())["review"]
    return review


@contextmanager
def mcp_spec_proxy(config: dict[str, Any], workdir: Path) -> Iterator[Served]:
    """A real `mcp-spec-proxy --http 127.0.0.1:0` process on `config`."""
    workdir.mkdir(parents=True)
    path = workdir / "servers.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [PROXY_COMMAND, "--config", str(path), "--http", "127.0.0.1:0", "--state-dir", str(workdir / "state")]
    with serving("mcp-spec-proxy", argv, PROXY_SERVING, "{0}") as served:
        yield served
