"""mcp-spec-proxy under cProfile (a CPU-time clock), switched on and off by signal, for bench/front_profile.py.

    python bench/profiled_proxy.py PREFIX --config servers.yaml ...   (then the proxy's own arguments)

SIGUSR1 starts the profiler; SIGUSR2 stops it and saves what it saw to PREFIX.0, PREFIX.1, … in turn,
so start-up and warm-up stay out of the profile. Run as a file, so a checkout named on PYTHONPATH
(the code before) is imported before the installed one.
"""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from types import FrameType


def main() -> None:
    prefix = sys.argv[1]
    sys.argv = ["mcp-spec-proxy", *sys.argv[2:]]
    profiler = cProfile.Profile(time.process_time)
    saved = 0

    def on(signum: int, frame: FrameType | None) -> None:
        profiler.enable()

    def off(signum: int, frame: FrameType | None) -> None:
        nonlocal saved
        profiler.disable()
        profiler.dump_stats(f"{prefix}.{saved}")
        saved += 1
        profiler.clear()

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    from mcp_spec_proxy.launch import main as serve

    serve()


if __name__ == "__main__":
    main()
