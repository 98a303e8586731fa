"""The CEL libraries on PyPI side by side: import, compile and evaluate times, and what each does
with the inputs an agent can write (NaN, huge numbers, non-ASCII text) and with broken rules.

    python -m bench.cel_libraries [--rounds 7] [--n 500]

Runs whichever of `common-expression-language` (module `cel`), `cel-expr-python`
(`cel_expr_python`) and `cel-python` (`celpy`) the running Python can import — install all three
in one scratch environment beside the proxy to compare them (only `cel-expr-python` is a
dependency of the proxy). Timings are interleaved in rotating blocks, median per operation over
the rounds, and the ratio is to the fastest library in the same run. Where the proxy itself imports
(its own environment), it also times `Rules.decide` for one call under CONFIG.md's five example
rules, the cost a call pays at the gate.
"""

from __future__ import annotations

import argparse
import importlib
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RULE = (
    'tool == "fs__write_file" && args.path.startsWith("/srv/notes/")'
    ' || server == "bank" && args.amount > 100 || "admins" in principal.groups'
)


def variables(args: dict[str, Any]) -> dict[str, Any]:
    principal = {"sub": "", "client_id": "", "scopes": [], "groups": []}
    call = {"tool": "bank__pay", "server": "bank", "session": "s1"}
    return {**call, "args": args, "annotations": {}, "principal": principal}


@dataclass
class Library:
    package: str
    module: str
    compile: Callable[[str], Any]
    evaluate: Callable[[Any, dict[str, Any]], Any]  # True/False, or raises, or returns an error value as text


def libraries() -> list[Library]:
    found: list[Library] = []
    try:
        cel: Any = importlib.import_module("cel")
        found.append(Library("common-expression-language", "cel", cel.compile, lambda p, v: p.execute(v)))
    except ImportError:
        pass
    try:
        ccel: Any = importlib.import_module("cel_expr_python.cel")
        t = ccel.Type
        declared = {"tool": t.STRING, "server": t.STRING, "session": t.STRING}
        declared |= {name: t.Map(t.STRING, t.DYN) for name in ("args", "annotations", "principal")}
        env = ccel.NewEnv(variables=declared)

        def evaluate(program: Any, data: dict[str, Any]) -> Any:
            value = program.eval(data=data)
            return f"error value: {value.value()}" if value.type() == t.ERROR else value.value()

        found.append(Library("cel-expr-python", "cel_expr_python.cel", env.compile, evaluate))
    except ImportError:
        pass
    try:
        celpy: Any = importlib.import_module("celpy")
        environment = celpy.Environment()
        found.append(
            Library(
                "cel-python",
                "celpy",
                lambda text: environment.program(environment.compile(text)),
                lambda p, v: bool(p.evaluate(celpy.json_to_cel(v))),
            )
        )
    except ImportError:
        pass
    return found


def import_ms(module: str) -> float:
    """A fresh interpreter's import of `module`, median of 3."""
    code = f"import time; t = time.perf_counter(); import {module}; print((time.perf_counter() - t) * 1000)"
    runs = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)]
    runs += [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)]
    runs += [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)]
    return statistics.median(runs)


def timings(found: list[Library], rounds: int, n: int) -> dict[str, tuple[float, float]]:
    """Median µs per compile and per evaluation of RULE, in rotating blocks."""
    compiles: dict[str, list[float]] = {lib.package: [] for lib in found}
    evals: dict[str, list[float]] = {lib.package: [] for lib in found}
    data = variables({"amount": 250, "to": "acct-1"})
    for round_ in range(rounds):
        for lib in found[round_ % len(found) :] + found[: round_ % len(found)]:
            started = time.perf_counter()
            for _ in range(n):
                program = lib.compile(RULE)
            compiles[lib.package].append((time.perf_counter() - started) / n * 1e6)
            assert lib.evaluate(program, data) is True
            started = time.perf_counter()
            for _ in range(n):
                lib.evaluate(program, data)
            evals[lib.package].append((time.perf_counter() - started) / n * 1e6)
    return {p: (statistics.median(compiles[p]), statistics.median(evals[p])) for p in compiles}


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("NaN > 100", "args.amount > 100", {"amount": math.nan}),
    ("inf > 100", "args.amount > 100", {"amount": math.inf}),
    ("2**63 > 100", "args.amount > 100", {"amount": 2**63}),
    ("2**70 > 100", "args.amount > 100", {"amount": 2**70}),
    ("-2**63-1 > 100", "args.amount > 100", {"amount": -(2**63) - 1}),
    ("2**62 * 2 (overflow)", "args.amount * 2 > 1", {"amount": 2**62}),
    ('size("üé€") == 3', "size(args.path) == 3", {"path": "üé€"}),
    ("non-ASCII startsWith", 'args.path.startsWith("/srv/notes/")', {"path": "/srv/notes/ünï €.md"}),
    ("lone surrogate", 'args.path.startsWith("/srv")', {"path": "/srv/\ud800"}),
    ("10 MB string", 'args.path.startsWith("/srv")', {"path": "/srv" + "a" * 10_000_000}),
    ("missing key", "args.nope == 1", {}),
    ('"1000" > 100', "args.amount > 100", {"amount": "1000"}),
    ("true > 100", "args.amount > 100", {"amount": True}),
    ("1 / 0", "1 / (args.amount - args.amount) == 1", {"amount": 1}),
]
BROKEN = [("syntax", 'tool == "x" &&'), ("type", "tool > 3"), ("unknown variable", "nosuch == 1")]


def outcome(lib: Library, expression: str, args: dict[str, Any]) -> str:
    try:
        value = lib.evaluate(lib.compile(expression), variables(args))
    except Exception as exc:  # what each library raises is what this table shows
        return f"raises {type(exc).__name__}"
    return "error value" if isinstance(value, str) and value.startswith("error value") else repr(value)


def compiled(lib: Library, expression: str) -> str:
    try:
        lib.compile(expression)
    except Exception as exc:  # what each library raises is what this table shows
        return f"refused ({type(exc).__name__})"
    return "accepted"


def decide_us(rounds: int, n: int) -> tuple[float, float] | None:
    """Median µs of `Rules.decide` for a call no rule matches (all five tried) and one the first decides."""
    try:
        import mcp_types as types

        from mcp_spec_proxy.calls.rules import Rules
        from mcp_spec_proxy.config.schema import ProxyConfig
        from mcp_spec_proxy.tools.catalog import CatalogTool
    except ImportError:
        return None
    rules = [
        {"when": 'tool == "fs__write_file" && args.path.startsWith("/srv/notes/")', "review": "allow"},
        {"when": 'server == "bank" && args.amount > 100', "review": "human"},
        {"when": '"admins" in principal.groups', "review": "strong"},
        {"when": 'tool == "git__git_push"', "deny": "pushes go through CI"},
        {"when": 'tool == "db__query" && !args.sql.startsWith("SELECT")', "effect": "write"},
    ]
    config = ProxyConfig.model_validate({"rules": rules})
    compiled = Rules(config.rules, "human")
    hints = types.ToolAnnotations(read_only_hint=False)
    definition = types.Tool(name="write_file", input_schema={"type": "object"}, annotations=hints)
    tool = CatalogTool("fs__write_file", "fs", "write_file", definition, "write", "default", "", None, None, "", False)
    cases = ({"path": "/srv/other/a.md", "content": "x" * 200}, {"path": "/srv/notes/a.md", "content": "x" * 200})
    medians: list[float] = []
    for args in cases:
        runs: list[float] = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(n):
                compiled.decide(tool, args, None, "s1")
            runs.append((time.perf_counter() - started) / n * 1e6)
        medians.append(statistics.median(runs))
    return medians[0], medians[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=500)
    options = parser.parse_args()
    found = libraries()
    if not found:
        sys.exit("no CEL library importable: pip install cel-expr-python common-expression-language cel-python")
    print(f"python {sys.version.split()[0]}; rule: {RULE}")
    times = timings(found, options.rounds, options.n)
    fastest = min(e for _, e in times.values())
    print("| library | import ms | compile µs | evaluate µs | evaluate ratio |")
    print("|---|---|---|---|---|")
    for lib in found:
        c, e = times[lib.package]
        print(f"| {lib.package} | {import_ms(lib.module):.1f} | {c:.1f} | {e:.1f} | {e / fastest:.1f}x |")
    print()
    print("| input | " + " | ".join(lib.package for lib in found) + " |")
    print("|---" * (len(found) + 1) + "|")
    for label, expression, args in CASES:
        print(f"| {label} | " + " | ".join(outcome(lib, expression, args) for lib in found) + " |")
    for label, expression in BROKEN:
        print(f"| compile: {label} | " + " | ".join(compiled(lib, expression) for lib in found) + " |")
    decided = decide_us(options.rounds, options.n)
    if decided is not None:
        none, first = decided
        print(f"\nRules.decide, 5 rules: {none:.1f} µs when none matches, {first:.1f} µs when the first does")


if __name__ == "__main__":
    main()
