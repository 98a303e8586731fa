"""Small helpers every benchmark script shares: percentiles and the machine line they print."""

from __future__ import annotations

import os
import platform
import statistics
from pathlib import Path


def percentile(samples: list[float], q: int) -> float:
    """The q-th percentile (inclusive method); the median for 50; the sample itself for one sample."""
    if q == 50:
        return statistics.median(samples)
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


def machine_line() -> str:
    """CPU model, core count, Python and kernel: what a figure was measured on."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, nproc {os.cpu_count()}, Python {platform.python_version()} ({platform.system()} {platform.release()})"
    )
