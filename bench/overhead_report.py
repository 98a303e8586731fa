"""bench/overhead.py's rows and what it prints: p50 and p99 per target, the overheads, the ratios of
ours to each other proxy at both percentiles, the targets left out, and markdown for docs/BENCHMARKS.md."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from bench.measure import percentile

TARGET_RATIO = 1.0


@dataclass
class Backend:
    name: str  # also the server name in the generated config
    label: str
    argv: list[str]
    tool: str
    arguments: dict[str, Any]
    eras: tuple[str, ...]  # eras the backend itself speaks
    url: str | None = None  # a streamable HTTP backend (`url:`); argv is then empty


@dataclass
class Row:
    backend: Backend
    era: str
    targets: tuple[str, ...]
    samples: dict[str, list[float]] = field(default_factory=dict)
    client_cpu: dict[str, float] = field(default_factory=dict)  # the client's own CPU seconds, per target

    def __post_init__(self) -> None:
        self.samples = {t: [] for t in self.targets}
        self.client_cpu = dict.fromkeys(self.targets, 0.0)

    def client_ms(self, target: str) -> float:
        """The client's own CPU per call to `target`, ms, the mean: its framing depends on what the target
        answers (an SSE body costs the client more than a JSON one), and a tenth or so of it comes after
        the call has returned (the POST's stream closing) beside the next call, so against a p50 overhead
        it is a close bound, not a strict floor."""
        return self.client_cpu[target] / max(len(self.samples[target]), 1) * 1000

    def p(self, target: str, q: int) -> float:
        return percentile(self.samples[target], q)

    def overhead(self, target: str, q: int) -> float:
        return self.p(target, q) - self.p("direct", q)

    def ratio(self, ours: str, other: str, q: int = 50) -> float:
        theirs = self.overhead(other, q)
        return self.overhead(ours, q) / theirs if theirs > 0 else float("inf")

    def ratios(self) -> list[tuple[str, str, float, float]]:
        """(ours, other, ours/other at p50, at p99) for each other proxy measured on the same transport."""
        return [(a, b, self.ratio(a, b, 50), self.ratio(a, b, 99)) for a, b in RATIO_PAIRS if self.has(a, b)]

    def has(self, *targets: str) -> bool:
        return all(t in self.samples for t in targets)


RATIO_PAIRS = [
    ("ours", "bare"),
    ("ours-http", "bare-http"),
    ("ours", "fastmcp"),
    ("ours-http", "fastmcp-http"),
    ("ours-http", "mcp-proxy-http"),
    ("ours", "ours-asyncio"),
    ("ours", "ours-before"),
    ("ours-http", "ours-before-http"),
    ("ours-guarded", "ours"),
    ("ours-guarded-http", "ours-http"),
]


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x" if ratio != float("inf") else "n/a"  # the other's overhead is not above zero


def report(
    rows: list[Row],
    args: argparse.Namespace,
    machine: str,
    load: tuple[str, str],
    elapsed: float,
    skipped: list[str],
    order: tuple[str, ...],
) -> int:
    print(f"machine: {machine}")
    print(f"load average (1, 5, 15 min): before {load[0]}; after {load[1]}")
    print(f"calls per target: {args.calls} (+{args.warmup} warmup), blocks of {args.block} rotating; {elapsed:.0f}s")
    if args.roots:
        print("clients declare roots (--roots)")
    for line in skipped:
        print(line)
    for row in rows:
        print(f"\n{row.backend.label}, client era {row.era}:")
        for target in row.targets:
            print(f"  {target:<14} p50 {row.p(target, 50):7.2f} ms   p99 {row.p(target, 99):7.2f} ms")
        for target in row.targets[1:]:
            print(
                f"  overhead {target:<14} p50 {row.overhead(target, 50):+7.2f} ms"
                f"   p99 {row.overhead(target, 99):+7.2f} ms"
            )
        for ours, other, p50, p99 in row.ratios():
            verdict = ""
            if other.startswith("bare"):
                verdict = f" (p50 {'within' if p50 <= TARGET_RATIO else 'ABOVE'} the {TARGET_RATIO}x target,"
                verdict += f" p99 {'within' if p99 <= TARGET_RATIO else 'ABOVE'})"
            print(f"  {ours}/{other} overhead: p50 {_x(p50)}   p99 {_x(p99)}{verdict}")
    proxies = [t for t in order if any(t in row.targets for row in rows)]
    print(
        "\n| backend | client era | direct p50 / p99 (ms) | "
        + " | ".join(f"{t} overhead p50 / p99" for t in proxies)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(proxies))
    for row in rows:
        note = "" if row.era in row.backend.eras else " ¹"
        cells = [row.backend.label, row.era, f"{row.p('direct', 50):.2f} / {row.p('direct', 99):.2f}{note}"]
        cells += [f"{row.overhead(t, 50):.2f} / {row.overhead(t, 99):.2f}" if row.has(t) else "—" for t in proxies]
        print("| " + " | ".join(cells) + " |")
    pairs = [(a, b) for a, b in RATIO_PAIRS if any(row.has(a, b) for row in rows)]
    print("\n| backend | client era | " + " | ".join(f"{a} / {b} (p50 / p99)" for a, b in pairs) + " |")
    print("|---|---|" + "---|" * len(pairs))
    for row in rows:
        cells = [row.backend.label, row.era]
        cells += [
            f"**{_x(row.ratio(a, b, 50))}** / {_x(row.ratio(a, b, 99))}" if row.has(a, b) else "—" for a, b in pairs
        ]
        print("| " + " | ".join(cells) + " |")
    targets = [t for t in ("direct", *order) if any(t in row.targets for row in rows)]
    print("\nThe client's own CPU per call, ms (the SDK client, this process; what a target's bytes cost it):\n")
    print("| backend | client era | " + " | ".join(targets) + " |")
    print("|---|---|" + "---|" * len(targets))
    for row in rows:
        cells = [row.backend.label, row.era] + [f"{row.client_ms(t):.2f}" if row.has(t) else "—" for t in targets]
        print("| " + " | ".join(cells) + " |")
    if any(row.era not in row.backend.eras for row in rows):
        print("\n¹ the backend speaks only the handshake era: direct is measured with a legacy client;")
        print("  the proxies serve the 2026-07-28 client and talk handshake era to the backend.")
    return 0
