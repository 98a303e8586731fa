"""bench.verdicts against the scripted model server: a review whose model never answers is counted as an
unreadable verdict with no answer, and the reviews after it still run (as the proxy fails closed and goes on)."""

from __future__ import annotations

import os

import anyio
import pytest

from bench import verdicts
from bench.tau2_retail import data_dir
from bench.tau2_retail.db import DataNotFound
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer
from tests.harness import segment_length, verdict


@pytest.mark.anyio
async def test_a_review_that_times_out_counts_as_unreadable_and_the_next_reviews_run() -> None:
    try:
        data_dir(os.environ)
    except DataNotFound as exc:
        pytest.skip(str(exc))
    released = anyio.Event()
    asked: list[int] = []

    async def respond(request: ChatRequest) -> Reply:
        asked.append(len(asked))
        if len(asked) == 2:  # the second review's model hangs, as a loaded server past the timeout
            await released.wait()
        return Reply(content=verdict(segment_length(request), "fine"))

    async with ScriptedModelServer(Respond(respond)) as server:
        try:
            with anyio.fail_after(120):
                seen = await verdicts.measure(server.base_url, reviews=3, max_tokens=256, model_timeout_s=5)
        finally:
            released.set()

    assert [s.outcome for s in seen] == ["first answer", "unreadable", "first answer"]
    assert [bool(s.failure) for s in seen] == [False, True, False] and not seen[1].accepted
    assert "timed out" in seen[1].failure.lower(), seen[1].failure
    assert "| 3 | 2/3 | 0/3 | 1/3 (1 no answer) | 2/3 |" in verdicts.table(seen)
