"""`bench.retrieval --onnx DIR`: a sentence model exported to ONNX, wrapped as a search encoder
(`bench/onnx_encoder.py`), here on the lookup-table graph `tests/test_onnx_model.py` describes."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the embeddings extra is not installed")
pytest.importorskip("onnxruntime", reason="the embeddings extra is not installed")

from bench.onnx_encoder import OnnxDirEncoder, onnx_dir
from tests.test_onnx_model import LOOKUP, VOCAB, lookup_row, tiny_tokenizer


def model_dir(tmp_path: Path) -> Path:
    shutil.copyfile(LOOKUP, tmp_path / "model.onnx")
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer())
    return tmp_path


def test_the_folder_s_model_embeds_texts_as_unit_rows_and_an_empty_text_as_zero(tmp_path: Path) -> None:
    encoder = OnnxDirEncoder(onnx_dir(str(model_dir(tmp_path))), max_tokens=16)
    vectors = anyio.run(encoder.encode_texts, ["the   file", " "])
    mean = np.mean([lookup_row(VOCAB.index(t)) for t in ("[CLS]", "the", "file", "[SEP]")], axis=0)
    assert np.allclose(vectors[0], mean / np.linalg.norm(mean))  # whitespace runs collapsed, as the extra does
    assert not vectors[1].any()
    assert encoder.info.dim == 4


def test_a_folder_without_the_model_or_its_tokenizer_is_one_line_naming_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text(tiny_tokenizer())
    with pytest.raises(SystemExit, match=r"^--onnx .*: no model\.onnx there — export the model into that folder"):
        onnx_dir(str(tmp_path))


def unit(tokens: list[str]) -> np.ndarray:
    mean = np.mean([lookup_row(VOCAB.index(t)) for t in tokens], axis=0)
    vector: np.ndarray = mean / np.linalg.norm(mean)
    return vector


def test_cls_pooling_takes_the_first_token_s_state_where_mean_pooling_averages_them(tmp_path: Path) -> None:
    folder = onnx_dir(str(model_dir(tmp_path)))
    cls = anyio.run(OnnxDirEncoder(folder, max_tokens=16, pooling="cls").encode_texts, ["the file", "rename"])
    mean = anyio.run(OnnxDirEncoder(folder, max_tokens=16).encode_texts, ["the file"])
    assert np.allclose(cls, unit(["[CLS]"]))  # the lookup graph's first row is [CLS]'s, whatever follows
    assert np.allclose(mean[0], unit(["[CLS]", "the", "file", "[SEP]"]))


def test_requests_take_the_query_prefix_and_every_other_text_the_text_prefix(tmp_path: Path) -> None:
    encoder = OnnxDirEncoder(
        onnx_dir(str(model_dir(tmp_path))), max_tokens=16, query_prefix="cafe ", text_prefix="the ", queries=["file"]
    )
    vectors = anyio.run(encoder.encode_texts, ["file", "rename", "  "])
    assert np.allclose(vectors[0], unit(["[CLS]", "cafe", "file", "[SEP]"]))
    assert np.allclose(vectors[1], unit(["[CLS]", "the", "rename", "[SEP]"]))
    assert not vectors[2].any()  # an empty text stays empty, prefix or not


def test_a_pooling_the_runtime_does_not_know_is_refused_by_name(tmp_path: Path) -> None:
    encoder = OnnxDirEncoder(onnx_dir(str(model_dir(tmp_path))), pooling="max")
    with pytest.raises(ValueError, match=r"^pooling 'max' is not one of mean, cls$"):
        anyio.run(encoder.encode_texts, ["file"])
