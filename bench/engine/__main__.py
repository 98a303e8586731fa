"""`python -m bench.engine`: the command (its help is the package's docstring)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

import bench.engine
from bench.cost_model import load
from bench.engine.report import report
from bench.engine.runs import run_all


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.engine",
        description=bench.engine.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--cost-model", type=Path, default=None, help="TOML or JSON cost model (default: shipped)")
    parser.add_argument("--draft-steps", type=int, default=8, help="K, steps the weak model drafts per segment")
    parser.add_argument("--seed", type=int, default=0, help="seed of the strong model's reasoning lengths")
    args = parser.parse_args()
    model = load(args.cost_model)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as name:
        runs, notes = anyio.run(run_all, args, model, Path(name))
    return report(runs, notes, model, args, time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main())
