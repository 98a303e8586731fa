"""Any sentence-transformers model exported to ONNX, as a search encoder: what `bench.retrieval --onnx DIR` ranks by.

DIR holds `model.onnx` (inputs `input_ids`, `attention_mask` and, for a BERT, `token_type_ids`; output the last
hidden state) and the model's `tokenizer.json`. It is run as the `embeddings` extra runs all-MiniLM-L6-v2
(`leash/onnx_model.py`: onnxruntime on one CPU thread, mean pooling, unit rows), without the extra's pinned file,
so a candidate model is measured on the same footing before anything ships it. Exporting one (all-mpnet-base-v2,
from its safetensors, with torch and transformers in a separate environment) is described in docs/BENCHMARKS.md.

A model trained otherwise is run as it was trained: `pooling="cls"` takes the first token's state (bge), and
`query_prefix` / `text_prefix` go before the requests (the texts in `queries`) and before every other text, the
tools' (e5's `query: ` and `passage: `, bge's retrieval instruction before a query alone). The index asks for a
request's vector and a tool's alike, so the bench names its requests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

import anyio
import numpy as np

from mcp_spec_proxy.leash.encoders import EncoderInfo, StepView, normalise_rows, step_text, task_text
from mcp_spec_proxy.leash.onnx_model import OnnxSentenceModel

MAX_TOKENS = 384
"""Ids per text unless told: all-mpnet-base-v2's `max_seq_length` in sentence-transformers."""


def onnx_dir(text: str) -> Path:
    """`--onnx DIR`, checked: the one line that names what is missing."""
    folder = Path(text).expanduser()
    missing = [name for name in ("model.onnx", "tokenizer.json") if not (folder / name).is_file()]
    if missing:
        raise SystemExit(f"--onnx {text}: no {' or '.join(missing)} there — export the model into that folder first")
    return folder


class OnnxDirEncoder:
    """The model in `folder`, loaded at the first encoding; texts as `task_text`, steps as `step_text`."""

    def __init__(
        self,
        folder: Path,
        *,
        max_tokens: int = MAX_TOKENS,
        batch: int = 32,
        pooling: str = "mean",
        query_prefix: str = "",
        text_prefix: str = "",
        queries: Iterable[str] = (),
    ) -> None:
        self.folder = folder
        self.max_tokens = max_tokens
        self.batch = batch
        self.pooling = pooling
        self.query_prefix = query_prefix
        self.text_prefix = text_prefix
        self.queries = frozenset(queries)
        self._model: OnnxSentenceModel | None = None
        self._loading = threading.Lock()

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("embedding", self.folder.name, self._loaded().dim)

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        return await anyio.to_thread.run_sync(self.encode_sync, [step_text(s) for s in steps])

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        return await anyio.to_thread.run_sync(self.encode_sync, [self._prefixed(t) for t in texts])

    def _prefixed(self, text: str) -> str:
        plain = task_text(text)
        if not plain:
            return plain  # an empty text stays empty: a zero vector, prefix or not
        return (self.query_prefix if text in self.queries else self.text_prefix) + plain

    def encode_sync(self, texts: Sequence[str]) -> np.ndarray:
        model = self._loaded()
        out = np.zeros((len(texts), model.dim), dtype=np.float32)
        wanted = [i for i, text in enumerate(texts) if text.strip()]
        if wanted:
            out[wanted] = model.encode([texts[i] for i in wanted], batch=self.batch)
        return normalise_rows(out)

    def _loaded(self) -> OnnxSentenceModel:
        with self._loading:
            if self._model is None:
                tokenizer = (self.folder / "tokenizer.json").read_text()
                model = self.folder / "model.onnx"
                self._model = OnnxSentenceModel.load(model, tokenizer, self.max_tokens, self.pooling)
            return self._model
