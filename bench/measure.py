"""Small helpers every benchmark script shares: percentiles and the machine line they print."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


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


@contextmanager
def local_model() -> Iterator[str]:
    """The local model (`scripts/local_model.py`, SmolLM2-135M on llama.cpp) for as long as the
    block runs: its base URL, once its /health answers (up to 2 minutes)."""
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve().parent.parent / "scripts" / "local_model.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        if not url.startswith("http://"):  # it exited first: xllamacpp or the weights are missing
            raise SystemExit(
                f"the local model did not start (exit status {server.wait(timeout=10)}):"
                " run scripts/local-model.sh --install-only"
            )
        for _ in range(240):
            try:
                if httpx.get(url.removesuffix("/v1") + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
