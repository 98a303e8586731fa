"""The read path's overhead, ours against the bare SDK hop, direct and fastmcp: `bench/overhead.py`.

    .venv/bin/python scripts/bench_overhead.py [options of bench.overhead]

The benchmark lives in the `bench` package with the others; this is the name the issue gave it.
"""

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    runpy.run_module("bench.overhead", run_name="__main__", alter_sys=True)
