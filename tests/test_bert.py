"""The numpy BERT behind the `embeddings` extra (`leash/bert.py`) and how it loads the model's tokenizer.

These run without the extra, on a tiny random model and vocabulary written here in the formats the real
model ships in; `tests/test_search_embeddings.py` runs the real all-MiniLM-L6-v2 where its weights are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from mcp_spec_proxy.leash.bert import Bert, load_tokenizer, read_safetensors

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "cafe", "rename", "the", "file", ",", "!", "日"]
HIDDEN, HEADS, LAYERS, INNER = 8, 2, 2, 16


def write_safetensors(path: Path, tensors: dict[str, np.ndarray[Any, Any]]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    body, offset = b"", 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array, dtype=np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        body, offset = body + raw, offset + len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + body)


def tiny_model(folder: Path, *, max_tokens: int = 16, act: str = "gelu") -> Path:
    rng = np.random.default_rng(7)
    tensors: dict[str, np.ndarray[Any, Any]] = {
        "embeddings.word_embeddings.weight": rng.normal(size=(len(VOCAB), HIDDEN)),
        "embeddings.position_embeddings.weight": rng.normal(size=(32, HIDDEN)),
        "embeddings.token_type_embeddings.weight": rng.normal(size=(2, HIDDEN)),
        "embeddings.LayerNorm.weight": np.ones(HIDDEN),
        "embeddings.LayerNorm.bias": np.zeros(HIDDEN),
    }
    shapes = {
        "attention.self.query": (HIDDEN, HIDDEN),
        "attention.self.key": (HIDDEN, HIDDEN),
        "attention.self.value": (HIDDEN, HIDDEN),
        "attention.output.dense": (HIDDEN, HIDDEN),
        "intermediate.dense": (INNER, HIDDEN),
        "output.dense": (HIDDEN, INNER),
    }
    for i in range(LAYERS):
        for name, shape in shapes.items():
            tensors[f"encoder.layer.{i}.{name}.weight"] = rng.normal(size=shape) / np.sqrt(shape[1])
            tensors[f"encoder.layer.{i}.{name}.bias"] = rng.normal(size=shape[0]) * 0.1
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            tensors[f"encoder.layer.{i}.{norm}.weight"] = np.ones(HIDDEN)
            tensors[f"encoder.layer.{i}.{norm}.bias"] = np.zeros(HIDDEN)
    write_safetensors(folder / "model.safetensors", tensors)
    config = {
        "hidden_act": act,
        "num_attention_heads": HEADS,
        "num_hidden_layers": LAYERS,
        "max_position_embeddings": 32,
        "layer_norm_eps": 1e-12,
    }
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_tokens}))
    (folder / "tokenizer.json").write_text(tiny_tokenizer())
    return folder


def tiny_tokenizer() -> str:
    """A `tokenizer.json` as all-MiniLM-L6-v2's is saved: uncased BERT WordPiece, truncation and padding at 128."""
    vocab = {token: i for i, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.enable_truncation(max_length=128)
    tokenizer.enable_padding(length=128, pad_id=vocab["[PAD]"], pad_token="[PAD]")
    return tokenizer.to_str()


def test_safetensors_read_back_as_written(tmp_path: Path) -> None:
    written = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1.5], dtype=np.float32)}
    write_safetensors(tmp_path / "t.safetensors", written)
    read = read_safetensors(tmp_path / "t.safetensors")
    assert set(read) == {"a", "b"}
    assert all(np.array_equal(read[name], array) for name, array in written.items())


def test_the_tokenizer_cuts_at_the_model_length_and_leaves_padding_to_the_batch(tmp_path: Path) -> None:
    tiny_model(tmp_path)
    tokenizer = load_tokenizer(tmp_path / "tokenizer.json", 16)
    ids = tokenizer.encode("Unaffable, CAFÉ!\x00 rename\tthe  file zzz 日").ids
    assert [VOCAB[i] for i in ids] == [  # the file's own padding to 128 is not applied
        "[CLS]",
        *("un", "##aff", "##able", ","),  # lower case, split at punctuation, longest pieces first
        *("cafe", "!"),  # accents stripped, a control character dropped
        *("rename", "the", "file", "[UNK]", "日", "[SEP]"),  # a word with no pieces is unknown
    ]
    cut = load_tokenizer(tmp_path / "tokenizer.json", 5).encode("the file the file the file").ids
    assert [VOCAB[i] for i in cut] == ["[CLS]", "the", "file", "the", "[SEP]"]


def test_a_file_that_is_no_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}))
    with pytest.raises(ValueError, match=r"tokenizer\.json: not a tokenizer this package reads"):
        load_tokenizer(tmp_path / "tokenizer.json", 16)


def test_a_model_shorter_than_the_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="more ids than the model has positions for"):
        Bert.load(tiny_model(tmp_path, max_tokens=64))


def test_a_text_embeds_the_same_alone_and_beside_a_longer_one(tmp_path: Path) -> None:
    model = Bert.load(tiny_model(tmp_path))
    short, long = "rename the file", "unaffable cafe, rename the file! the file"
    alone = model.encode([short])
    together = model.encode([long, short], batch=2)  # one batch: the short one padded to the long one
    assert alone.shape == (1, HIDDEN) and np.isfinite(alone).all()
    assert np.allclose(together[1], alone[0], atol=1e-5)  # padding takes no attention and no share of the mean
    assert not np.allclose(together[0], alone[0], atol=1e-3)  # the rows stay in the order given


def test_a_model_with_another_activation_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exact GELU"):
        Bert.load(tiny_model(tmp_path, act="relu"))
