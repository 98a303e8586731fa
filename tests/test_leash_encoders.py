"""LEASH encoders: hashing (offline default), embeddings over real HTTP, hidden states from drafting calls."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

import anyio
import httpx
import numpy as np
import openai
import pytest

from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.leash.encoders import (
    OBSERVATION_CHARS,
    THREAD_THRESHOLD_CHARS,
    EmbeddingEncoder,
    Encoder,
    EncoderError,
    EncoderInfo,
    HashingEncoder,
    HiddenStateEncoder,
    StepView,
    step_text,
    task_text,
)
from mcp_spec_proxy.testing import Reply, Scripted, ScriptedModelServer, embed_text

pytestmark = pytest.mark.anyio

WAIT_S = 10
MODEL = "scripted-embedder"


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


# -- canonical texts ---------------------------------------------------------------------------


def test_step_text_sorts_arguments_and_cuts_long_observations() -> None:
    view = StepView("fs__read", {"path": "/a", "encoding": "utf-8", "limit": 3}, "x" * 5000)
    text = step_text(view)
    lines = text.splitlines()
    assert lines[:4] == ["tool: fs__read", "encoding = utf-8", "limit = 3", "path = /a"]
    assert lines[4].startswith("observation: ")
    assert len(lines[4]) < len("observation: ") + OBSERVATION_CHARS + 40
    assert step_text(StepView("t", {"b": 1, "a": 2})) == step_text(StepView("t", {"a": 2, "b": 1}))


def test_task_text_collapses_whitespace() -> None:
    assert task_text("  book a\n\tflight  to Paris ") == "book a flight to Paris"


# -- hashing -----------------------------------------------------------------------------------


async def test_hashing_rows_are_unit_float32_and_empty_text_is_zero() -> None:
    encoder = HashingEncoder(dim=256)
    vectors = await encoder.encode_texts(["refund order 17", "", "   "])
    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 256)
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0, abs=1e-5)
    assert not vectors[1].any() and not vectors[2].any()
    assert (await encoder.encode_steps([])).shape == (0, 256)
    assert encoder.info == EncoderInfo("hashing", "blake2b-v1-seed0", 256)


async def test_hashing_is_deterministic_and_seeded() -> None:
    step = StepView("git__log", {"max_count": 5, "repo": "/srv/app"}, "commit abc fix the build")
    a = await HashingEncoder(dim=512).encode_steps([step])
    b = await HashingEncoder(dim=512).encode_steps([step])
    c = await HashingEncoder(dim=512, seed=7).encode_steps([step])
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    assert HashingEncoder(seed=7).info.model != HashingEncoder().info.model


def test_hashing_gives_the_same_vector_in_another_process() -> None:
    code = (
        "import asyncio, json, sys\n"
        "from mcp_spec_proxy.leash.encoders import HashingEncoder, StepView\n"
        "v = asyncio.run(HashingEncoder(dim=64).encode_steps([StepView('t', {'k': 'v'}, 'some words here')]))\n"
        "print(json.dumps(v[0].tolist()))\n"
    )
    # A different PYTHONHASHSEED would change anything built on Python's salted hash().
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    here = HashingEncoder(dim=64).encode_steps_sync([StepView("t", {"k": "v"}, "some words here")])[0]
    assert np.array_equal(np.array(json.loads(result.stdout), dtype=np.float32), here)


async def test_a_step_differing_in_one_argument_value_is_closer_than_one_with_another_tool() -> None:
    encoder = HashingEncoder()
    base = StepView("fs__write_file", {"path": "/srv/app/config.yaml", "content": "debug: true"}, "ok")
    other_value = StepView("fs__write_file", {"path": "/srv/app/settings.yaml", "content": "debug: true"}, "ok")
    other_tool = StepView("fs__delete_file", {"path": "/srv/app/config.yaml", "content": "debug: true"}, "ok")
    unrelated = StepView("time__now", {"timezone": "UTC"}, "12:00")
    v = await encoder.encode_steps([base, other_value, other_tool, unrelated])
    assert cosine(v[0], v[0]) == pytest.approx(1.0, abs=1e-5)
    assert cosine(v[0], v[1]) > cosine(v[0], v[2]) > cosine(v[0], v[3])
    assert cosine(v[0], v[1]) > 0.8


async def test_hashing_texts_sharing_words_are_closer() -> None:
    v = await HashingEncoder().encode_texts(
        ["cancel my pending order and refund it", "please cancel the pending order", "what is the weather in Oslo"]
    )
    assert cosine(v[0], v[1]) > cosine(v[0], v[2]) + 0.2


async def test_hashing_big_batches_give_the_same_vectors_off_the_loop() -> None:
    encoder = HashingEncoder(dim=128)
    steps = [StepView("search", {"q": f"query {i}"}, "result " * 400) for i in range(20)]
    assert sum(len(s.observation or "") for s in steps) > THREAD_THRESHOLD_CHARS
    assert np.array_equal(await encoder.encode_steps(steps), encoder.encode_steps_sync(steps))


async def test_every_encoder_satisfies_the_protocol() -> None:
    encoders: list[Encoder] = [HashingEncoder(), EmbeddingEncoder("http://127.0.0.1:9/v1", MODEL, dim=8)]
    encoders.append(HiddenStateEncoder("weak", 16))
    assert [e.info.name for e in encoders] == ["hashing", "embedding", "hidden"]


# -- embeddings over real HTTP -----------------------------------------------------------------


async def test_embedding_encoder_learns_the_dimension_and_matches_the_server() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), embedding_dim=48) as server:
            encoder = EmbeddingEncoder(server.base_url, MODEL, max_retries=0)
            assert encoder.info.dim == 0
            tasks = await encoder.encode_texts(["refund  order 17", ""])
            step = StepView("orders__get", {"id": 17}, "status: pending")
            steps = await encoder.encode_steps([step])
            await encoder.aclose()
    assert encoder.info == EncoderInfo("embedding", MODEL, 48)
    assert tasks.shape == (2, 48) and tasks.dtype == np.float32
    assert np.allclose(tasks[0], embed_text("refund order 17", 48), atol=1e-6)
    assert not tasks[1].any()  # the empty text was not sent
    assert np.allclose(steps[0], embed_text(step_text(step), 48), atol=1e-6)
    sent = [r.input for r in server.embedding_requests]
    assert sent == [["refund order 17"], [step_text(step)]]
    assert all(r.encoding_format == "float" and r.model == MODEL for r in server.embedding_requests)
    assert [r.path for r in server.requests] == ["/v1/embeddings", "/v1/embeddings"]


async def test_embedding_encoder_batches_requests_and_keeps_the_order() -> None:
    texts = [f"text number {i}" for i in range(5)]
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([])) as server:
            encoder = EmbeddingEncoder(server.base_url, MODEL, dim=64, max_retries=0, batch=2)
            vectors = await encoder.encode_texts(texts)
            await encoder.aclose()
    assert [len(r.input) for r in server.embedding_requests] == [2, 2, 1]
    for row, text in zip(vectors, texts, strict=True):
        assert np.allclose(row, embed_text(text, 64), atol=1e-6)


async def test_embedding_encoder_probe_asks_once_for_the_dimension() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), embedding_dim=24) as server:
            encoder = EmbeddingEncoder(server.base_url, MODEL, max_retries=0)
            assert (await encoder.probe()).dim == 24
            assert (await encoder.probe()).dim == 24
            await encoder.aclose()
    assert len(server.embedding_requests) == 1


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (Reply(status=503), "answered HTTP 503"),
        (Reply(status=400, error_body={"error": {"message": "model not loaded", "type": "x"}}), "model not loaded"),
        (Reply(raw_body=json.dumps({"object": "list", "data": [], "model": MODEL})), "0 embeddings for 2 inputs"),
        (
            Reply(raw_body=json.dumps({"data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [1]}]})),
            "not equal-length lists",
        ),
        (
            Reply(raw_body=json.dumps({"data": [{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}]})),
            "bad or repeated index",
        ),
    ],
)
async def test_embedding_encoder_failures_are_encoder_errors(fault: Reply, expected: str) -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), embedding_faults=lambda _: fault) as server:
            url = server.base_url
            encoder = EmbeddingEncoder(url, MODEL, max_retries=0)
            with pytest.raises(EncoderError) as raised:
                await encoder.encode_texts(["one", "two"])
            await encoder.aclose()
    assert isinstance(raised.value, ProxyError)
    assert expected in str(raised.value)
    assert url in str(raised.value)


async def test_embedding_encoder_refuses_vectors_of_another_dimension() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), embedding_dim=32) as server:
            encoder = EmbeddingEncoder(server.base_url, MODEL, dim=16, max_retries=0)
            with pytest.raises(EncoderError, match="answered 32-dim vectors, expected 16"):
                await encoder.encode_texts(["hello"])
            await encoder.aclose()


async def test_embedding_encoder_unreachable_endpoint_is_an_encoder_error() -> None:
    async with ScriptedModelServer(Scripted([])) as server:
        url = server.base_url  # the port is free again once the server has stopped
    encoder = EmbeddingEncoder(url, MODEL, max_retries=0, timeout=5)
    with anyio.fail_after(WAIT_S), pytest.raises(EncoderError, match="cannot be reached"):
        await encoder.encode_texts(["hello"])
    await encoder.aclose()


async def test_scripted_embeddings_endpoint_speaks_base64_and_dimensions() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([])) as server, httpx.AsyncClient(base_url=server.base_url) as http:
            plain = await http.post("/embeddings", json={"model": MODEL, "input": "a b", "dimensions": 8})
            packed = await http.post(
                "/embeddings", json={"model": MODEL, "input": ["a b"], "encoding_format": "base64"}
            )
            empty = await http.post("/embeddings", json={"model": MODEL, "input": ["ok", ""]})
            tokens = await http.post("/embeddings", json={"model": MODEL, "input": [[1, 2, 3]]})
    assert plain.status_code == 200
    body = plain.json()
    assert body["object"] == "list" and body["model"] == MODEL and body["usage"]["prompt_tokens"] == 2
    assert body["data"][0]["embedding"] == pytest.approx(embed_text("a b", 8))
    decoded = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(decoded, embed_text("a b", 64))
    assert empty.status_code == 400 and "empty string" in empty.json()["error"]["message"]
    assert tokens.status_code == 400
    assert len(server.embedding_requests) == 2  # the two refused requests are only in server.requests
    assert len(server.requests) == 4


async def test_scripted_embeddings_with_the_openai_client_default_base64() -> None:
    with anyio.fail_after(WAIT_S):
        async with (
            ScriptedModelServer(Scripted([]), embedding_dim=16) as server,
            openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0) as client,
        ):
            response = await client.embeddings.create(model=MODEL, input=["same words", "same words"])
    first, second = (np.array(item.embedding) for item in response.data)
    assert np.array_equal(first, second)
    assert np.allclose(first, embed_text("same words", 16), atol=1e-6)


# -- hidden states -----------------------------------------------------------------------------


def test_from_hidden_normalises_one_vector() -> None:
    encoder = HiddenStateEncoder("weak", 4)
    vector = encoder.from_hidden([3.0, 0.0, 4.0, 0.0])
    assert vector.dtype == np.float32 and vector.shape == (4,)
    assert np.allclose(vector, [0.6, 0.0, 0.8, 0.0])


@pytest.mark.parametrize(
    "values",
    [
        [[1.0, 1.0, 1.0], [0.0, 2.0, 0.0]],  # one vector per token
        [[[5.0, 5.0, 5.0], [1.0, 0.0, 0.0]], [9.0, 9.0, 1.0], [0.0, 2.0, 0.0]],  # SGLang: prompt block, then tokens
        np.array([[1.0, 1.0, 1.0], [0.0, 2.0, 0.0]]),
    ],
)
def test_from_hidden_takes_the_last_token(values: Any) -> None:
    assert np.allclose(HiddenStateEncoder("weak", 3).from_hidden(values), [0.0, 1.0, 0.0])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0, 2.0], "has 2 dims, expected 3"),
        ([[1.0, 2.0, 3.0], [1.0, 2.0]], "has 2 dims, expected 3"),
        ([], "empty"),
        ([1.0, "x", 2.0], "other than numbers"),
        ([1.0, float("nan"), 2.0], "NaN"),
    ],
)
def test_from_hidden_refuses_wrong_shapes(values: Any, expected: str) -> None:
    with pytest.raises(EncoderError, match=expected):
        HiddenStateEncoder("weak", 3).from_hidden(values)


def test_from_choice_reads_hidden_states_or_explains_how_to_get_them() -> None:
    encoder = HiddenStateEncoder("weak", 2)
    completion = openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "weak",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "hi"},
                    "hidden_states": [[1.0, 0.0], [0.0, 3.0]],
                }
            ],
        }
    )
    assert np.allclose(encoder.from_choice(completion.choices[0]), [0.0, 1.0])
    assert np.allclose(encoder.from_choice({"hidden_states": [2.0, 0.0]}), [1.0, 0.0])
    with pytest.raises(EncoderError, match="return_hidden_states"):
        encoder.from_choice({"message": {}})


async def test_hidden_state_encoder_cannot_encode_on_demand() -> None:
    encoder = HiddenStateEncoder("weak", 8)
    assert encoder.info == EncoderInfo("hidden", "weak", 8)
    with pytest.raises(EncoderError, match="drafting calls"):
        await encoder.encode_texts(["task"])
    with pytest.raises(EncoderError, match="drafting calls"):
        await encoder.encode_steps([StepView("t")])
