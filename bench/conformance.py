"""MCP conformance suite pass counts: direct, behind mcp-spec-proxy, behind fastmcp, side by side in one run.

    .venv/bin/python -m bench.conformance [--install-fastmcp] [--no-fastmcp]

For each pinned suite version (tests/conformance_runner.py: 0.1.16 and 0.2.0-alpha.12), every server
scenario (`--suite all`) against:

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

Prints the counts (scenarios passed / run), the scenarios each row loses against direct, the
machine and the load average before and after, and a markdown table for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

from bench.measure import machine_line
from bench.overhead import FASTMCP_PYTHON, FASTMCP_SPEC, FASTMCP_VENV, REPO, free_port, install_fastmcp
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
DIRECT = "direct"
# A row starts what the suite runs against, given the direct server and a folder of its own.
Start = Callable[[Served, Path], AbstractContextManager[Served]]


@contextmanager
def fastmcp_proxy(url: str) -> Iterator[Served]:
    argv = [str(FASTMCP_PYTHON), str(REPO / "bench" / "fastmcp_proxy.py"), "--http", str(free_port()), "--url", url]
    with serving("fastmcp proxy", argv, UVICORN_SERVING, "{0}/mcp") as served:
        yield served


@contextmanager
def _already(served: Served) -> Iterator[Served]:
    yield served


def _ours(review: Callable[[], dict[str, object]], protocol: str = "legacy") -> Start:
    return lambda direct, tmp: mcp_spec_proxy(proxy_config(review(), protocol), tmp)


def rows(with_fastmcp: bool) -> dict[str, Start]:
    found: dict[str, Start] = {
        DIRECT: lambda direct, tmp: _already(direct),
        "mcp-spec-proxy (protocol: legacy, the default)": _ours(lambda: PARITY_REVIEW),
        "mcp-spec-proxy, protocol: auto": _ours(lambda: PARITY_REVIEW, "auto"),
        "mcp-spec-proxy, shipped review": _ours(shipped_review),
    }
    if with_fastmcp:
        found[f"fastmcp {FASTMCP_SPEC.split('==')[1]}"] = lambda direct, tmp: fastmcp_proxy(direct.url)
    return found


def measure(with_fastmcp: bool, tmp: Path) -> dict[tuple[str, str], SuiteRun]:
    """Every (row, suite version) run; every server and proxy up first, then PARALLEL_RUNS suites at a time.

    One process per row serves both versions' runs.
    """
    with ExitStack() as stack:
        direct = stack.enter_context(fixture_server())
        targets = {
            row: stack.enter_context(start(direct, tmp / f"row{index}"))
            for index, (row, start) in enumerate(rows(with_fastmcp).items())
        }
        with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
            futures = {
                (row, version): pool.submit(run_suite, version, target.url, tmp / f"results-{index}-{version}")
                for index, (row, target) in enumerate(targets.items())
                for version in SUITES
            }
            return {key: future.result() for key, future in futures.items()}


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def report(runs: dict[tuple[str, str], SuiteRun], with_fastmcp: bool) -> None:
    names = list(rows(with_fastmcp))
    width = max(len(name) for name in names)
    print(f"{'':{width}}  " + "  ".join(f"{v:>16}" for v in SUITES))
    for name in names:
        cells = [f"{len(runs[name, v].passed):>3} / {len(runs[name, v].outcomes):<3}" for v in SUITES]
        print(f"{name:{width}}  " + "  ".join(f"{c:>16}" for c in cells))
    print()
    for version in SUITES:
        direct = runs[DIRECT, version].passed
        print(f"suite {version}: passing directly ({len(direct)}), but not behind")
        for name in names[1:]:
            lost = sorted(direct - runs[name, version].passed)
            gained = sorted(runs[name, version].passed - direct)
            print(f"  {name} ({len(lost)}): {', '.join(lost) or '-'}")
            if gained:
                print(f"    passing there and not directly: {', '.join(gained)}")
    print("\n| | " + " | ".join(SUITES) + " |")
    print("|---|" + "---:|" * len(SUITES))
    for name in names:
        cells = [f"{len(runs[name, v].passed)} / {len(runs[name, v].outcomes)}" for v in SUITES]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--install-fastmcp", action="store_true", help=f"first install {FASTMCP_SPEC} into {FASTMCP_VENV}"
    )
    parser.add_argument("--no-fastmcp", action="store_true", help="leave fastmcp out even where it is installed")
    args = parser.parse_args()
    if args.install_fastmcp:
        install_fastmcp()
    with_fastmcp = not args.no_fastmcp and FASTMCP_PYTHON.exists()
    if not with_fastmcp and not args.no_fastmcp:
        print(f"fastmcp: not measured ({FASTMCP_VENV} is missing; add --install-fastmcp)", file=sys.stderr)
    print(machine_line())
    load_before = load_average()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-conformance-") as name:
        runs = measure(with_fastmcp, Path(name))
    elapsed = time.perf_counter() - started
    print(f"load average before {load_before}, after {load_average()}; {elapsed:.0f} s\n")
    report(runs, with_fastmcp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
