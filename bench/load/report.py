"""What `python -m bench.load` prints: per level, then a markdown table, then the checks."""

from __future__ import annotations

from bench.load.checks import Check
from bench.load.plan import ERAS
from bench.load.sessions import Level
from bench.measure import percentile


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
