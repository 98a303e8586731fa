"""Tool search with a small embedding model in process (the `embeddings` extra), and without it.

Without the extra, search mode ranks by words exactly as before (the module is hidden here, so this
runs whatever is installed). With it, all-MiniLM-L6-v2 runs in onnxruntime (`leash/onnx_model.py`; the
test extra installs it), and a request with no word of the tool's own finds it; those tests are
skipped where the extra is absent."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import mcp_types as types
import numpy as np
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.catalog_search import search_encoder
from mcp_spec_proxy.leash import local_model
from mcp_spec_proxy.leash.encoders import EncoderInfo, HashingEncoder, StepView
from mcp_spec_proxy.proxy import Proxy
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from mcp_spec_proxy.tools.search import EMBED_BATCH, ToolIndex
from tests.harness import proxied, text_of, toy

pytestmark = pytest.mark.anyio

BILLING = {
    "create_refund": "Create a new refund in the billing system.",
    "create_payment": "Record a payment against an invoice.",
    "get_invoice": "Get one invoice from the billing system by its id.",
    "create_coupon": "Add a coupon to the billing system with the given fields.",
    "delete_subscription": "Delete a subscription from the billing system permanently.",
}
CHAT = {
    "create_reaction": "Create a new reaction in the team chat.",
    "create_message": "Post a message to a channel in the team chat.",
    "update_user_status": "Modify a user status in the team chat.",
    "archive_channel": "Archive a channel in the team chat so it is hidden but kept.",
}
FILES = {
    "read_file": "Read the complete contents of a file as text.",
    "move_file": "Move or rename files and directories.",
    "list_directory": "Get a detailed listing of all files and directories in a specified path.",
}


def catalog() -> Catalog:
    servers = {"billing": BILLING, "chat": CHAT, "fs": FILES}
    cfg = ProxyConfig.model_validate({"servers": {name: {"command": "x"} for name in servers}})
    built = Catalog(cfg, FingerprintStore(None))
    for server, tools in servers.items():
        schema = {"type": "object", "properties": {"id": {"type": "string"}}}
        built.set_tools(server, [types.Tool(name=n, description=d, input_schema=schema) for n, d in tools.items()])
    return built


def proxy_with(rank: str) -> Proxy:
    """What `search_encoder` reads of a proxy: no LEASH, and the catalog's `rank`."""
    return cast(Proxy, SimpleNamespace(leash=None, config=SimpleNamespace(catalog=SimpleNamespace(rank=rank))))


async def names(index: ToolIndex, query: str) -> list[str]:
    return [hit.tool.name for hit in await index.search(query, 5)]


QUERIES = ["give my money back", "thumbs up on Dana's message", "rename the report", "show the invoice"]


async def test_without_the_extra_search_ranks_by_words_alone_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, local_model.WEIGHTS, None)  # the weights are not installed
    assert not local_model.installed() and local_model.local_encoder() is None
    encoder = search_encoder(proxy_with("auto"))
    assert isinstance(encoder, HashingEncoder)  # `rank: auto` under hashing is words alone
    tools = catalog()
    served, words = ToolIndex(tools.tools, encoder, "auto"), ToolIndex(tools.tools, None, "words")
    for query in QUERIES:
        assert await names(served, query) == await names(words, query)


def test_with_the_extra_search_takes_the_local_model_unless_told_words(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_model, "installed", lambda: True)  # nothing is loaded until a text is encoded
    chosen = search_encoder(proxy_with("auto"))
    assert isinstance(chosen, local_model.LocalEmbeddingEncoder)
    assert chosen.info.name == "embedding" and chosen.info.dim == local_model.DIM  # so `auto` is hybrid
    assert isinstance(search_encoder(proxy_with("words")), HashingEncoder)  # `rank: words` loads no model


needs_model = pytest.mark.skipif(not local_model.installed(), reason="the embeddings extra is not installed")


@pytest.fixture(scope="module")
def encoder() -> local_model.LocalEmbeddingEncoder:
    return local_model.LocalEmbeddingEncoder()


@needs_model
async def test_the_model_gives_unit_vectors_and_a_zero_vector_for_an_empty_text(
    encoder: local_model.LocalEmbeddingEncoder,
) -> None:
    vectors: np.ndarray[Any, Any] = await encoder.encode_texts(["refund an order", "", "money back"])
    assert vectors.shape == (3, local_model.DIM) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors[[0, 2]], axis=1), 1.0, atol=1e-5)
    assert not vectors[1].any()
    # A paraphrase sits nearer its tool than an unrelated request does.
    tool, unrelated = await encoder.encode_texts(["create refund: Create a new refund.", "list the folders"])
    assert float(vectors[2] @ tool) > float(unrelated @ tool)


@needs_model
@pytest.mark.parametrize(
    ("query", "wanted", "within"),
    [
        ("I want my money back for order 1234", "billing__create_refund", 1),
        # "post" is nearer a message than "thumbs up" is to a reaction: among the first three of twelve.
        ("thumbs up on Dana's post", "chat__create_reaction", 3),
    ],
)
async def test_a_paraphrase_with_no_word_of_the_tool_finds_it(
    encoder: local_model.LocalEmbeddingEncoder, query: str, wanted: str, within: int
) -> None:
    tools = catalog()
    assert wanted not in await names(ToolIndex(tools.tools, None, "words"), query)  # no word of the tool's own
    assert wanted in (await names(ToolIndex(tools.tools, encoder, "auto"), query))[:within]


class Counting:
    """The hashing encoder under an embedding's name (so `auto` fuses), counting the texts of each call."""

    def __init__(self) -> None:
        self.inner = HashingEncoder(dim=256)
        self.calls: list[int] = []

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("embedding", "counting", 256)

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray[Any, Any]:
        return await self.inner.encode_steps(steps)

    async def encode_texts(self, texts: list[str]) -> np.ndarray[Any, Any]:
        self.calls.append(len(texts))
        return await self.inner.encode_texts(texts)


async def test_a_large_catalog_is_embedded_a_batch_per_search_and_words_rank_until_it_is_done() -> None:
    cfg = ProxyConfig.model_validate({"servers": {"s": {"command": "x"}}})
    tools = Catalog(cfg, FingerprintStore(None))
    count = 2 * EMBED_BATCH + 20
    many = [types.Tool(name=f"tool_{i}", description=f"Does thing number {i}.", input_schema={}) for i in range(count)]
    tools.set_tools("s", many)
    encoder = Counting()
    index = ToolIndex(tools.tools, encoder, "encoder", embed_budget=0)  # one batch per search
    words = ToolIndex(tools.tools, None, "words")
    assert await names(index, "thing number 7") == await names(words, "thing number 7")
    assert encoder.calls == [EMBED_BATCH]  # no vector for the request: the words ranked
    await index.search("thing number 7", 5)
    assert encoder.calls == [EMBED_BATCH] * 2
    await index.search("thing number 7", 5)
    assert encoder.calls == [EMBED_BATCH, EMBED_BATCH, 20, 1]  # all in: the request is embedded
    await index.search("thing number 8", 5)
    assert encoder.calls[4:] == [1]  # each tool once, each request once


@needs_model
async def test_the_proxy_s_search_mode_finds_a_tool_by_meaning_with_the_extra(tmp_path: Path) -> None:
    query = "how far along is the job"  # toy's `progress`: "Report progress."
    answers = {}
    for rank in ("words", "auto"):
        cfg = {
            "servers": {"toy": toy(tmp_path / "rec")},
            "review": {"default": "human"},
            "catalog": {"mode": "search", "rank": rank},
        }
        async with proxied(cfg, tmp_path / rank, twins=True) as p:
            result = await p.client.call_tool("search_tools", {"query": query})
            answers[rank] = [hit["name"] for hit in json.loads(text_of(result))["tools"]]
    assert "toy__progress" not in answers["words"]
    assert answers["auto"][0] == "toy__progress"
