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
