"""A sentence encoder run by onnxruntime: a BERT exported to ONNX, its tokenizer, mean (or first-token) pooling.

`OnnxSentenceModel.load(model, tokenizer, max_tokens)` opens an ONNX export of a sentence-transformers
encoder (inputs `input_ids`, `attention_mask` and, for a BERT, `token_type_ids`; output the last hidden state) and the
model's own `tokenizer.json` (run by the `tokenizers` package); `encode(texts)` pools each text's hidden
states over its attention mask, as `SentenceTransformer.encode` does (`pooling="cls"`: the first token's state,
as the models trained that way — bge — are pooled). Texts are batched by length so a
short request does not pay for a long description's padding.

An ONNX file is a graph of the runtime's own operators and their weights: loading one runs no code
of its author's. onnxruntime runs it on one CPU thread (the proxy's event loop keeps the other cores).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from tokenizers import Tokenizer

Array = np.ndarray[Any, np.dtype[np.float32]]

INPUTS = ("input_ids", "attention_mask")
SEGMENTS = "token_type_ids"
"""A BERT's third input (all zeros: one segment); an MPNet has none."""
POOLINGS = ("mean", "cls")
"""How a text's token states become one vector: their mean over the mask, or the first (`[CLS]`) token's."""


def load_tokenizer(text: str, max_tokens: int) -> Tokenizer:
    """A `tokenizer.json`'s tokenizer, cut at `max_tokens` ids, `[CLS]` and `[SEP]` included.

    The file's own truncation and padding (128, fixed, for all-MiniLM-L6-v2) are the export's, not the
    model's: sentence-transformers cuts at `max_seq_length` (256 there) and pads each batch to its longest
    text, as here."""
    try:
        tokenizer = Tokenizer.from_str(text)
    except Exception as exc:  # the Rust side raises a bare Exception for any text it cannot read
        raise ValueError(f"not a tokenizer.json the tokenizers package reads ({exc})") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


class OnnxSentenceModel:
    """A loaded model; `encode` may run on several threads at once (onnxruntime's `run` is thread-safe)."""

    def __init__(self, session: onnxruntime.InferenceSession, tokenizer: Tokenizer, pooling: str = "mean") -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        names = {node.name for node in session.get_inputs()}
        if not set(INPUTS) <= names or not names <= {*INPUTS, SEGMENTS}:
            raise ValueError(f"the model takes {sorted(names)}, not {list(INPUTS)} (and {SEGMENTS})")
        shape = session.get_outputs()[0].shape
        if len(shape) != 3 or not isinstance(shape[2], int):
            raise ValueError(f"the model's output is shaped {shape}, not (batch, tokens, dims)")
        self.session = session
        self.tokenizer = tokenizer
        self.dim = int(shape[2])
        self.segments = SEGMENTS in names
        self.pooling = pooling

    @classmethod
    def load(cls, model: Path, tokenizer: str, max_tokens: int, pooling: str = "mean") -> OnnxSentenceModel:
        """The ONNX file `model` and the `tokenizer.json` text `tokenizer`, on one CPU thread."""
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        try:
            session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types, all bare Exceptions
            raise ValueError(f"{model.name}: not an ONNX model onnxruntime runs ({exc})") from None
        return cls(session, load_tokenizer(tokenizer, max_tokens), pooling)

    def encode(self, texts: Sequence[str], batch: int = 32) -> Array:
        """Pooled embeddings of `texts` (not normalised), one row each, in their order."""
        ids = [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts))]
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths share a batch
        for first in range(0, len(order), batch):
            chosen = order[first : first + batch]
            out[chosen] = self._forward([ids[i] for i in chosen])
        return out

    def _forward(self, rows: list[list[int]]) -> Array:
        length = max(len(r) for r in rows)
        ids = np.zeros((len(rows), length), dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.segments:
            feeds[SEGMENTS] = np.zeros_like(ids)
        hidden = np.asarray(self.session.run(None, feeds)[0], dtype=np.float32)
        if self.pooling == "cls":
            first: Array = hidden[:, 0].copy()
            return first
        weights = mask.astype(np.float32)[..., None]  # padding takes no share of the mean
        pooled: Array = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1.0)
        return pooled
