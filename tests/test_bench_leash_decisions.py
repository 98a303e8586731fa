"""`bench.leash_decisions` with an embedding encoder: the runtime's own `EmbeddingEncoder` behind a
memo that sends each distinct text once (trials repeat most steps), so the figures are the runtime's
vectors at a fraction of the endpoint's time. The scripted model server's `/v1/embeddings` stands in
for the local model."""

from __future__ import annotations

import anyio
import numpy as np
import pytest

from bench.leash_decisions import OnceEach, arguments, measure
from mcp_spec_proxy.leash.encoders import EmbeddingEncoder, StepView, step_text
from mcp_spec_proxy.testing import Scripted, ScriptedModelServer

pytestmark = pytest.mark.anyio

WAIT_S = 120  # one trial drafts 74 tasks in-process; a loaded 2-core machine takes a while


async def test_the_memo_sends_each_text_once_and_gives_the_runtime_encoders_vectors() -> None:
    steps = [
        StepView("orders__get", {"order_id": 17}),
        StepView("orders__cancel", {}),
        StepView("orders__get", {"order_id": 17}),
    ]
    with anyio.fail_after(20):
        async with ScriptedModelServer(Scripted([]), embedding_dim=32) as server:
            once = OnceEach(server.base_url, "scripted-embedder")
            first = await once.encode_steps(steps)
            again = await once.encode_steps(list(reversed(steps)))
            tasks = await once.encode_texts(["cancel   order 17", "cancel order 17"])
            sent = [text for request in server.embedding_requests for text in request.input]  # the memo's only
            plain = EmbeddingEncoder(server.base_url, "scripted-embedder")
            expected_steps = await plain.encode_steps(steps)
            expected_tasks = await plain.encode_texts(["cancel order 17"])
            await once.aclose()
            await plain.aclose()
    assert sorted(sent) == sorted([step_text(steps[0]), step_text(steps[1]), "cancel order 17"])
    assert np.allclose(first, expected_steps) and np.allclose(again, expected_steps[::-1])
    assert np.allclose(tasks, np.vstack([expected_tasks, expected_tasks]))
    assert once.cost()["texts"] == 3


async def test_the_benchmark_under_embeddings_banks_and_scores_through_the_endpoint() -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), embedding_dim=64) as server:
            args = arguments(["--trials", "1", "--encoder", "embedding", "--embedding-url", server.base_url])
            result = await measure(args)
            sent = [text for request in server.embedding_requests for text in request.input]
    assert result["encoder"] == {"name": "embedding", "model": "smollm2-135m", "dim": 64}
    texts = [text for text in sent if text != "dimension probe"]
    assert len(texts) == len(set(texts)) == result["embedded"]["texts"]  # no text embedded twice
    assert not any("observation" in text for text in texts)  # steps are scored as drafted
    steps, failures, unscored = result["counts"]["steps"]
    assert result["bank_steps"] > 0 and steps > failures > 0 and unscored < steps
