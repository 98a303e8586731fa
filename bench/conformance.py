"""MCP conformance suite pass counts: direct, behind mcp-spec-proxy, behind fastmcp, side by side in one run.

    .venv/bin/python -m bench.conformance [--install-fastmcp] [--no-fastmcp]
    .venv/bin/python -m bench.conformance --reference DIR [--suite VERSION] [--per-scenario]

For each pinned suite version (tests/conformance_runner.py: 0.1.16 and 0.2.0-alpha.12; `--suite`
picks one or more), every server scenario (`--suite all`) against:

    direct                          tests/fixtures/conformance_server.py, the project's own server
                                    implementing the suite's contract, on streamable HTTP
    mcp-spec-proxy                  our proxy (`--http`) in front of it on stdio, as
                                    tests/test_conformance.py runs it (protocol: legacy, the default;
                                    review.default: allow)
    ... protocol: auto              the same, the backend spoken to in 2026-07-28 where it offers it
    ... shipped review              the same as the first, with the shipped servers.yaml's `review:`
    fastmcp                         fastmcp 4.x's proxy (bench/fastmcp_proxy.py, its own venv under the
                                    git-ignored .bench/; `--install-fastmcp` makes it) in front of the
                                    direct server's URL

With `--reference DIR`, the server is instead the suite's own reference server: DIR is a checkout of
the conformance repository's examples/servers/typescript with `npm install` run in it (it is not
on any registry; this project never copies it). It is started on Node 22 (`--import tsx
everything-server.ts`, PORT on a free port) and measured directly on its URL, behind mcp-spec-proxy
with it as a URL backend (`namespace: false`: the scenarios call its tools and prompts by its own
names; review.default: allow), in protocol legacy and auto, and behind fastmcp where installed.
Check out the tag that matches the suite version measured (v0.1.16 for 0.1.16; the default branch
for 0.2.0-alpha.*).

Prints the counts (scenarios passed / run), the scenarios each row loses against direct with the
checks that failed there, the machine and the load average before and after, and a markdown table
for docs/BENCHMARKS.md; `--per-scenario` adds each scenario's pass (+) or fail (-) per row.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import peers
from bench.measure import machine_line
from bench.overhead import free_port
from tests.backends import node22
from tests.conformance_runner import (
    PARITY_REVIEW,
    SUITES,
    Served,
    SuiteRun,
    fixture_server,
    mcp_spec_proxy,
    proxy_config,
    run_suite,
    serving,
    shipped_review,
)

PARALLEL_RUNS = 3  # `conformance` processes at once: each is mostly Node starting (~1 s of CPU)
UVICORN_SERVING = re.compile(rb"Uvicorn running on (http://\S+)")
REFERENCE_SERVING = re.compile(rb"MCP endpoint: http://localhost:(\d+)/mcp")
REFERENCE_ENTRY = "everything-server.ts"
REFERENCE_BACKEND = "reference"
DIRECT = "direct"
PROBLEM_WIDTH = 240  # characters of a failed check's line in the report
# A row starts what the suite runs against, given the direct server and a folder of its own.
Start = Callable[[Served, Path], AbstractContextManager[Served]]


@contextmanager
def fastmcp_proxy(url: str) -> Iterator[Served]:
    argv = peers.fastmcp_argv([], url, free_port())
    with serving("fastmcp proxy", argv, UVICORN_SERVING, "{0}/mcp") as served:
        yield served


@contextmanager
def reference_server(folder: Path) -> Iterator[Served]:
    """The suite's reference server from `folder` (npm-installed) on a free loopback port, on Node 22."""
    entry = folder / REFERENCE_ENTRY
    if not entry.is_file() or not (folder / "node_modules" / "tsx").is_dir():
        raise SystemExit(
            f"--reference {folder}: needs {REFERENCE_ENTRY} and node_modules/tsx there: a checkout of the"
            " conformance repository's examples/servers/typescript, with `npm install` run in it"
        )
    argv = [node22(), "--import", "tsx", str(entry)]  # `tsx` resolves from the cwd, the folder
    port = str(free_port())
    with serving(
        "reference server", argv, REFERENCE_SERVING, "http://127.0.0.1:{0}/mcp", env={"PORT": port}, cwd=folder
    ) as served:
        yield served


def reference_config(url: str, protocol: str) -> dict[str, Any]:
    """The proxy in front of the reference server's URL, its tools and prompts under their own names."""
    backend = {"url": url, "namespace": False, "protocol": protocol}
    return {"servers": {REFERENCE_BACKEND: backend}, "review": PARITY_REVIEW}


@contextmanager
def _already(served: Served) -> Iterator[Served]:
    yield served


def _ours(review: Callable[[], dict[str, object]], protocol: str = "legacy") -> Start:
    return lambda direct, tmp: mcp_spec_proxy(proxy_config(review(), protocol), tmp)


def _ours_in_front(protocol: str) -> Start:
    return lambda direct, tmp: mcp_spec_proxy(reference_config(direct.url, protocol), tmp)


def rows(with_fastmcp: bool, reference: bool = False) -> dict[str, Start]:
    found: dict[str, Start] = {DIRECT: lambda direct, tmp: _already(direct)}
    if reference:
        found["mcp-spec-proxy (protocol: legacy, the default)"] = _ours_in_front("legacy")
        found["mcp-spec-proxy, protocol: auto"] = _ours_in_front("auto")
    else:
        found["mcp-spec-proxy (protocol: legacy, the default)"] = _ours(lambda: PARITY_REVIEW)
        found["mcp-spec-proxy, protocol: auto"] = _ours(lambda: PARITY_REVIEW, "auto")
        found["mcp-spec-proxy, shipped review"] = _ours(shipped_review)
    if with_fastmcp:
        found[f"fastmcp {peers.FASTMCP_SPEC.split('==')[1]}"] = lambda direct, tmp: fastmcp_proxy(direct.url)
    return found


def measure(
    with_fastmcp: bool,
    tmp: Path,
    versions: Sequence[str] = SUITES,
    reference: Path | None = None,
    parallel: int = PARALLEL_RUNS,
) -> dict[tuple[str, str], SuiteRun]:
    """Every (row, suite version) run; every server and proxy up first, then `parallel` suites at a time.

    One process per row serves both versions' runs.
    """
    with ExitStack() as stack:
        direct = stack.enter_context(fixture_server() if reference is None else reference_server(reference))
        targets = {
            row: stack.enter_context(start(direct, tmp / f"row{index}"))
            for index, (row, start) in enumerate(rows(with_fastmcp, reference is not None).items())
        }
        with ThreadPoolExecutor(max_workers=parallel) as pool:
            futures = {
                (row, version): pool.submit(run_suite, version, target.url, tmp / f"results-{index}-{version}")
                for index, (row, target) in enumerate(targets.items())
                for version in versions
            }
            runs = {key: future.result() for key, future in futures.items()}
        for index, target in enumerate(targets.values()):  # beside the results, for a failure's other side
            (tmp / f"row{index}.log").write_text("".join(target.log))
        return runs


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def _clip(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= PROBLEM_WIDTH else line[: PROBLEM_WIDTH - 3] + "..."


def report(
    runs: dict[tuple[str, str], SuiteRun],
    names: Sequence[str],
    versions: Sequence[str] = SUITES,
    per_scenario: bool = False,
) -> None:
    width = max(len(name) for name in names)
    print(f"{'':{width}}  " + "  ".join(f"{v:>16}" for v in versions))
    for name in names:
        cells = [f"{len(runs[name, v].passed):>3} / {len(runs[name, v].outcomes):<3}" for v in versions]
        print(f"{name:{width}}  " + "  ".join(f"{c:>16}" for c in cells))
    print()
    for version in versions:
        direct = runs[DIRECT, version].passed
        print(f"suite {version}: passing directly ({len(direct)}), but not behind")
        for name in names[1:]:
            run = runs[name, version]
            lost = sorted(direct - run.passed)
            gained = sorted(run.passed - direct)
            print(f"  {name} ({len(lost)}): {', '.join(lost) or '-'}")
            for scenario in lost:
                problems = run.outcome(scenario).problems or ["no checks (the run never reached it, or timed out)"]
                for problem in problems:
                    print(f"      {scenario}: {_clip(problem)}")
            if gained:
                print(f"    passing there and not directly: {', '.join(gained)}")
        if runs[DIRECT, version].returncode == -1:
            print(f"  direct run timed out: {runs[DIRECT, version].output[:200]}")
    if per_scenario:
        for version in versions:
            scenarios = sorted({s for name in names for s in runs[name, version].outcomes})
            print(f"\nsuite {version}, per scenario (+ passed, - failed or not reached), rows: {', '.join(names)}")
            column = max((len(s) for s in scenarios), default=0)
            for scenario in scenarios:
                marks = " ".join("+" if runs[name, version].outcome(scenario).passed else "-" for name in names)
                print(f"  {scenario:{column}}  {marks}")
    print("\n| | " + " | ".join(versions) + " |")
    print("|---|" + "---:|" * len(versions))
    for name in names:
        cells = [f"{len(runs[name, v].passed)} / {len(runs[name, v].outcomes)}" for v in versions]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--install-fastmcp", action="store_true", help=f"first install {peers.FASTMCP_SPEC}")
    parser.add_argument("--no-fastmcp", action="store_true", help="leave fastmcp out even where it is installed")
    parser.add_argument(
        "--reference",
        metavar="DIR",
        type=Path,
        help="measure the suite's reference server instead of the project's fixture: DIR is a checkout of the"
        " conformance repository's examples/servers/typescript, `npm install`ed",
    )
    parser.add_argument(
        "--suite",
        dest="versions",
        action="append",
        choices=SUITES,
        metavar="VERSION",
        help=f"a suite version to run (repeatable; default: all of {', '.join(SUITES)})",
    )
    parser.add_argument(
        "--parallel",
        metavar="N",
        type=int,
        default=PARALLEL_RUNS,
        help=f"suite runs at once (default {PARALLEL_RUNS}; each row's runs share its one server or proxy)",
    )
    parser.add_argument("--per-scenario", action="store_true", help="also print each scenario's outcome per row")
    parser.add_argument(
        "--results",
        metavar="DIR",
        type=Path,
        help="keep every run's checks.json (results-<row>-<version>/) and each row's server or proxy log"
        " (row<row>.log) under DIR (made; must not exist)",
    )
    args = parser.parse_args()
    if args.install_fastmcp:
        peers.install_fastmcp()
    with_fastmcp = not args.no_fastmcp and peers.fastmcp_python().exists()
    if not with_fastmcp and not args.no_fastmcp:
        print(f"fastmcp: not measured, {peers.missing('fastmcp')}", file=sys.stderr)
    versions = [v for v in SUITES if v in (args.versions or SUITES)]
    reference = args.reference.resolve() if args.reference else None
    print(machine_line())
    if reference is not None:
        print(f"server: the suite's reference server from {reference}")
    load_before = load_average()
    started = time.perf_counter()
    with ExitStack() as stack:
        if args.results is not None:
            args.results.mkdir(parents=True)
            tmp = args.results.resolve()
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-conformance-")))
        runs = measure(with_fastmcp, tmp, versions, reference, max(1, args.parallel))
    elapsed = time.perf_counter() - started
    print(f"load average before {load_before}, after {load_average()}; {elapsed:.0f} s\n")
    report(runs, list(rows(with_fastmcp, reference is not None)), versions, args.per_scenario)
    return 0


if __name__ == "__main__":
    sys.exit(main())
