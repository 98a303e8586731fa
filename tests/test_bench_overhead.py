"""bench.overhead in its smallest mode (two calls a target), run as a reader runs it: the report's shape, not
its timings. Every measured target has its p50 and p99 in every row, every ratio of ours to another proxy is
given at both percentiles, and a peer that is not installed (or cannot front a backend) is named in one line,
never a traceback. Real processes: the backends, the bare hop, ours and, where installed, npm mcp-proxy."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from bench import overhead, peers

REPO = Path(__file__).resolve().parent.parent
TARGET = re.compile(r"^  (\S+)\s+p50\s+-?\d+\.\d\d ms\s+p99\s+-?\d+\.\d\d ms$")
RATIO = re.compile(r"^  (\S+)/(\S+) overhead: p50 (-?\d+\.\d\dx|n/a)\s+p99 (-?\d+\.\d\dx|n/a)")
ROW = re.compile(r"^(.+), client era (legacy|2026-07-28):$")
OURS_AND_BARE = ["direct", "bare", "ours", "bare-http", "ours-http"]


def _need_backends() -> None:
    time_server = overhead.DEFAULT_TIME if overhead.DEFAULT_TIME.exists() else overhead.FALLBACK_TIME
    for path in (time_server, overhead.NODE_MODULES / overhead.EVERYTHING_ENTRY):
        if not path.exists():
            pytest.skip(f"{path} is missing: run scripts/install-test-backends.sh")


def run_bench(*flags: str, bench_dir: Path | None = None) -> tuple[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if bench_dir is not None:
        env["MCP_BENCH_DIR"] = str(bench_dir)
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", "--calls", "2", "--warmup", "0", "--block", "1", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def rows(report: str) -> dict[tuple[str, str], tuple[set[str], dict[tuple[str, str], tuple[str, str]]]]:
    """(backend label, era) -> (targets with p50 and p99, {(ours, other): (p50 ratio, p99 ratio)})."""
    found: dict[tuple[str, str], tuple[set[str], dict[tuple[str, str], tuple[str, str]]]] = {}
    current: tuple[set[str], dict[tuple[str, str], tuple[str, str]]] | None = None
    for line in report.splitlines():
        if (row := ROW.match(line)) is not None:
            current = found.setdefault((row[1], row[2]), (set(), {}))
        elif current is not None and (target := TARGET.match(line)) is not None:
            current[0].add(target[1])
        elif current is not None and (ratio := RATIO.match(line)) is not None:
            current[1][(ratio[1], ratio[2])] = (ratio[3], ratio[4])
    return found


def test_a_run_without_the_peers_reports_p50_and_p99_for_every_target_and_names_the_peers_left_out(
    tmp_path: Path,
) -> None:
    _need_backends()
    report, _ = run_bench("--backends", "time,http", bench_dir=tmp_path)  # an empty bench folder: no peers
    skipped = [line for line in report.splitlines() if ": skipped" in line]
    assert any(line.startswith("fastmcp, fastmcp-http: skipped, not installed") for line in skipped), report
    assert any(line.startswith("mcp-proxy-http: skipped, not installed") for line in skipped), report
    assert all("--install-" in line for line in skipped), skipped
    found = rows(report)
    eras = ["legacy", "2026-07-28"]
    assert sorted(found) == sorted((label, era) for label in _labels(found) for era in eras)
    assert len(_labels(found)) == 2 and any("`url:`" in label for label in _labels(found)), sorted(found)
    for (label, era), (targets, ratios) in found.items():
        assert targets == set(OURS_AND_BARE), (label, era, targets)
        assert set(ratios) == {("ours", "bare"), ("ours-http", "bare-http")}, (label, era, ratios)
    assert "| ours / bare (p50 / p99) | ours-http / bare-http (p50 / p99) |" in report
    assert "fastmcp overhead" not in report and "mcp-proxy-http overhead" not in report
    # The client's own CPU per call, a column for each target, every row: each call cost the client something.
    assert "| backend | client era | direct | bare | ours | bare-http | ours-http |" in report, report
    cpu_rows = [line for line in report.splitlines() if line.startswith("| ") and line.count("|") == 8]
    cpu_rows = [line for line in cpu_rows if re.fullmatch(r"\| .+ \| (legacy|2026-07-28)( \| \d+\.\d\d){5} \|", line)]
    assert len(cpu_rows) == 4, report
    assert all(float(cell) > 0 for line in cpu_rows for cell in line.strip("| ").split(" | ")[2:]), cpu_rows


def test_mcp_proxy_is_measured_in_front_of_stdio_backends_and_named_where_it_cannot_go() -> None:
    _need_backends()
    if (why := peers.missing("mcp-proxy")) is not None:
        pytest.skip(f"mcp-proxy: {why}")
    report, _ = run_bench("--backends", "time,http", "--no-fastmcp")
    assert "mcp-proxy-http: skipped behind web, mcp-proxy fronts stdio servers only" in report
    assert "fastmcp, fastmcp-http: skipped (--no-fastmcp)" in report
    for (label, era), (targets, ratios) in rows(report).items():
        behind_http = "`url:`" in label
        assert ("mcp-proxy-http" in targets) is not behind_http, (label, era, targets)
        assert (("ours-http", "mcp-proxy-http") in ratios) is not behind_http, (label, era, ratios)
        assert set(OURS_AND_BARE) <= targets
    assert "| ours-http / mcp-proxy-http (p50 / p99) |" in report


def test_a_bad_backend_name_is_one_line_naming_the_choices() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", "--backends", "time,ftp"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "--backends ftp: choose from time, fs, http" in done.stderr


def _labels(found: Mapping[tuple[str, str], object]) -> set[str]:
    return {label for label, _ in found}
