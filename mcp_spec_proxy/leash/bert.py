"""A BERT sentence encoder in numpy: the forward pass of a sentence-transformers model, without torch.

`Bert.load(folder)` reads a sentence-transformers model as it is saved (`config.json`,
`model.safetensors`, `tokenizer.json`, `1_Pooling/config.json`, `sentence_bert_config.json`);
`Bert.encode(texts)` tokenizes with the model's own `tokenizer.json` (run by the `tokenizers` package) and runs the
embeddings, the encoder layers (self-attention, GELU feed-forward, layer norms) and mean pooling in
float32 numpy, as `SentenceTransformer.encode` does with torch. Texts are batched by length so a
short request does not pay for a long description's padding.

Only what all-MiniLM-L6-v2 uses is implemented: absolute positions, the exact GELU, mean pooling
over the attention mask, float32 weights. A model that asks for anything else is refused with a
`ValueError` naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

Array = np.ndarray[Any, np.dtype[np.float32]]

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, np.ndarray[Any, Any]]:
    """The tensors of a `.safetensors` file (an 8-byte header length, a JSON header, the raw data)."""
    data = path.read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    body = memoryview(data)[8 + size :]
    tensors = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(spec["dtype"])
        if dtype is None:
            raise ValueError(f"{path.name}: tensor {name} is {spec['dtype']}, which is not read here")
        start, end = spec["data_offsets"]
        tensors[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(spec["shape"])
    return tensors


def load_tokenizer(path: Path, max_tokens: int) -> Tokenizer:
    """The model's own tokenizer (`tokenizer.json`), cut at `max_tokens` ids, `[CLS]` and `[SEP]` included.

    The file's own truncation and padding (128, fixed) are the export's, not the model's: sentence-transformers
    cuts at `max_seq_length` (256 for all-MiniLM-L6-v2) and pads each batch to its longest text, as here."""
    try:
        tokenizer = Tokenizer.from_str(path.read_text())
    except Exception as exc:  # the Rust side raises a bare Exception for any file it cannot read
        raise ValueError(f"{path.name}: not a tokenizer this package reads ({exc})") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_tokens)
    return tokenizer


def _erf(x: Array) -> Array:
    # Abramowitz and Stegun 7.1.26: absolute error under 1.5e-7, far below float32's noise here.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    result: Array = sign * (1.0 - poly * np.exp(-a * a))
    return result


def _gelu(x: Array) -> Array:
    result: Array = 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
    return result


def _layer_norm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    result: Array = (x - mean) / np.sqrt(var + eps) * weight + bias
    return result


@dataclass(frozen=True)
class _Layer:
    qkv: Array  # (hidden, 3 * hidden): query, key and value at once
    qkv_bias: Array
    out: Array
    out_bias: Array
    norm1: tuple[Array, Array]
    up: Array
    up_bias: Array
    down: Array
    down_bias: Array
    norm2: tuple[Array, Array]


class Bert:
    """A loaded sentence-transformers BERT model; `encode` is pure computation (thread-safe)."""

    def __init__(self, tensors: dict[str, np.ndarray[Any, Any]], config: dict[str, Any], tokenizer: Tokenizer):
        if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only BERT with the exact GELU and absolute positions is run here")
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        cut = tokenizer.truncation
        if cut is None or int(cut["max_length"]) > int(config["max_position_embeddings"]):
            raise ValueError("the tokenizer may give more ids than the model has positions for")
        self.tokenizer = tokenizer

        def get(name: str) -> Array:
            return np.ascontiguousarray(tensors[name], dtype=np.float32)

        self.words = get("embeddings.word_embeddings.weight")
        self.positions = get("embeddings.position_embeddings.weight")
        self.types = get("embeddings.token_type_embeddings.weight")
        self.norm = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            q, k, v = (get(f"{p}attention.self.{n}.weight").T for n in ("query", "key", "value"))
            self.layers.append(
                _Layer(
                    qkv=np.ascontiguousarray(np.concatenate([q, k, v], axis=1)),
                    qkv_bias=np.concatenate([get(f"{p}attention.self.{n}.bias") for n in ("query", "key", "value")]),
                    out=np.ascontiguousarray(get(f"{p}attention.output.dense.weight").T),
                    out_bias=get(f"{p}attention.output.dense.bias"),
                    norm1=(get(f"{p}attention.output.LayerNorm.weight"), get(f"{p}attention.output.LayerNorm.bias")),
                    up=np.ascontiguousarray(get(f"{p}intermediate.dense.weight").T),
                    up_bias=get(f"{p}intermediate.dense.bias"),
                    down=np.ascontiguousarray(get(f"{p}output.dense.weight").T),
                    down_bias=get(f"{p}output.dense.bias"),
                    norm2=(get(f"{p}output.LayerNorm.weight"), get(f"{p}output.LayerNorm.bias")),
                )
            )
        self.dim = self.words.shape[1]

    @classmethod
    def load(cls, folder: Path) -> Bert:
        """The model saved in `folder` by sentence-transformers (mean pooling only)."""
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens") or any(
            pooling.get(mode) for mode in ("pooling_mode_cls_token", "pooling_mode_max_tokens")
        ):
            raise ValueError("only mean pooling is run here")
        settings = folder / "sentence_bert_config.json"
        max_tokens = int(json.loads(settings.read_text()).get("max_seq_length", 512)) if settings.exists() else 512
        config = json.loads((folder / "config.json").read_text())
        tokenizer = load_tokenizer(folder / "tokenizer.json", max_tokens)
        return cls(read_safetensors(folder / "model.safetensors"), config, tokenizer)

    def encode(self, texts: Sequence[str], batch: int = 32) -> Array:
        """Mean-pooled embeddings of `texts` (not normalised), one row each, in their order."""
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
        mask = np.zeros((len(rows), length), dtype=np.float32)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1.0
        x = self.words[ids] + self.positions[:length][None] + self.types[0]
        x = _layer_norm(x, *self.norm, self.eps)
        blocked = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)  # padding takes no attention
        size = self.dim // self.heads
        scale = np.float32(1.0 / math.sqrt(size))
        batch = len(rows)
        for layer in self.layers:
            qkv = x @ layer.qkv + layer.qkv_bias
            heads = qkv.reshape(batch, length, 3, self.heads, size).transpose(2, 0, 3, 1, 4)
            q, k, v = heads[0], heads[1], heads[2]
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + blocked
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            attended = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.dim)
            x = _layer_norm(x + attended @ layer.out + layer.out_bias, *layer.norm1, self.eps)
            hidden = _gelu(x @ layer.up + layer.up_bias)
            x = _layer_norm(x + hidden @ layer.down + layer.down_bias, *layer.norm2, self.eps)
        pooled: Array = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1.0)
        return pooled
