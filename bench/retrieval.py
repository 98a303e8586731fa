"""Tool search at catalog scale: retrieval quality and the bytes a client reads, side by side.

    .venv/bin/python -m bench.retrieval [--sizes 1000,5000] [--dump] [--split dev|test|all]
        [--requests FILE ...] [--minilm | --onnx DIR | --embedding-url URL --embedding-model NAME]
        [--pooling mean|cls] [--query-prefix TEXT] [--text-prefix TEXT]
        [--fusions rrf:1,sum:2]

The catalog is the real servers the tests use — their tools/list as dumped into
`bench/retrieval_servers.json` (`--dump` re-dumps it from `.backends/`) — padded to each size with
**synthetic tools** that simulate the many SaaS/API backends a team connects, their words overlapping
the real tools' on purpose (files, folders, commits, branches, tables, queries, time zones, notes,
contacts), so they are distractors, not noise: `bench/retrieval_catalog.py` builds it.

`bench/retrieval_paraphrases.json` is held out: requests in an agent's words, measured once a ranking is
final and never tuned on. `bench/retrieval_requests.json` holds plain-language requests written for this
benchmark, each with the real tool(s) that serve it (a second tool only where two are equally right).
Recall@5: the share of requests whose right tool is among the first five hits. `--requests FILE ...`
measures other request sets of the same shape, each in its own table (a model embeds the catalog once
for all). `--split` keeps part of them: `dev` the requests at 0-based index i with i % 3 != 0 (two in
three: the ones a ranking change may be tuned on, misses and all), `test` those with i % 3 == 0 (held
out: read its figure, not its misses), `all` (the default) every one. Rankers, on one catalog:

    mcpproxy-bm25  the baseline, in the style of mcpproxy-go's `retrieve_tools` (Bleve): BM25
                   over tool name, full name, description and parameter JSON with a standard
                   analyzer (Unicode words — `read_file` stays one token —, lower case, English
                   stop words), the searchable-text field boosted 1.5, plus exact/prefix name boosts
    words          ours: BM25F over split identifiers (name, description, server, arguments at
                   half weight), folded plurals, synonyms of common API verbs and nouns, a
                   read/write cue from the request's verb
    hashing        ours: LEASH's hashing encoder alone, cosine
    hybrid         ours (the default): words and the encoder fused by reciprocal rank
    words-ungrouped  `words` without grouping one tool served by several servers into one hit
    embedding      (with --minilm or --embedding-url) an embedding model alone, and fused with
                   words (hybrid-emb): --minilm runs all-MiniLM-L6-v2 in process
                   (the `embeddings` extra), --onnx DIR another model exported to ONNX (bench/onnx_encoder.py),
                   --embedding-url any OpenAI-compatible /v1/embeddings

Bytes: the full tools/list a client reads in list mode (as the proxy serves it, with `intent`
on writes; with the old, longer `intent`; and the backends' own, without it) against search
mode's tools/list plus one search result (the mean over the requests, limit 5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import numpy as np

from bench.measure import machine_line
from bench.onnx_encoder import MAX_TOKENS, OnnxDirEncoder, onnx_dir
from bench.retrieval_catalog import SERVERS_FILE, dump, padded, real_listings
from mcp_spec_proxy.fronts.catalog_search import CALL_TOOL, results_text, search_tool
from mcp_spec_proxy.leash.encoders import EmbeddingEncoder, Encoder, HashingEncoder, StepView
from mcp_spec_proxy.leash.local_model import INSTALL, local_encoder
from mcp_spec_proxy.leash.onnx_model import POOLINGS
from mcp_spec_proxy.tools.catalog import INTENT_ARGUMENT, CatalogTool
from mcp_spec_proxy.tools.search import FUSION, SEARCH_HASH_DIM, Fusion, Hit, Rank, ToolIndex, top
from mcp_spec_proxy.tools.words import Bm25

HERE = Path(__file__).resolve().parent
REQUESTS_FILE = HERE / "retrieval_requests.json"
K = 5
OLD_INTENT = {
    "type": "string",
    "description": (
        "What the user asked for and why this call serves it, in one or two sentences. "
        "A reviewer reads it before the call is allowed to change anything."
    ),
}

# -- the baseline: BM25 in the style of mcpproxy-go's retrieve_tools ----------------------------

_UNICODE_WORD = re.compile(r"\w+")  # Bleve's unicode tokenizer keeps `_` inside a word
_ENGLISH_STOP = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    }
)


def _standard(text: str) -> list[str]:
    return [w for w in _UNICODE_WORD.findall(text.lower()) if w not in _ENGLISH_STOP]


class McpproxyBm25:
    """mcpproxy-go's query: should-clauses over a Bleve index, each scored by BM25 and summed."""

    def __init__(self, tools: list[CatalogTool]) -> None:
        self.tools = tools
        names = [t.original.lower() for t in tools]
        full = [f"{t.server}:{t.original}".lower() for t in tools]
        params = [json.dumps(t.input_schema) for t in tools]
        searchable = [
            f"{t.original} {t.server}:{t.original} {t.definition.description or ''} {p}"
            for t, p in zip(tools, params, strict=True)
        ]
        everything = [
            f"{n} {f} {t.server} {t.definition.description or ''} {p}"
            for n, f, t, p in zip(names, full, tools, params, strict=True)
        ]
        self._names, self._full = names, full
        self._all = Bm25([_standard(text) for text in everything])
        self._searchable = Bm25([_standard(text) for text in searchable])

    def search(self, query: str, limit: int) -> list[CatalogTool]:
        terms = _standard(query)
        scores = self._all.scores(terms) + 1.5 * self._searchable.scores(terms)
        q = query.lower()
        scores += np.array(
            [
                5.0 * (n == q) + 4.0 * (f == q) + 3.0 * n.startswith(q)
                for n, f in zip(self._names, self._full, strict=True)
            ]
        )
        return [self.tools[i] for i in top(scores, limit)]


# -- measurement ---------------------------------------------------------------------------------


def split(requests: list[dict[str, Any]], which: str) -> list[dict[str, Any]]:
    """The requests of one split: `dev` (i % 3 != 0), `test` (i % 3 == 0) or `all`."""
    if which == "all":
        return requests
    return [r for i, r in enumerate(requests) if (i % 3 == 0) == (which == "test")]


def recall(found: list[list[str]], requests: list[dict[str, Any]]) -> float:
    """Found: per request, the names its first K hits offer."""
    hits = sum(bool(set(offered) & set(r["tools"])) for offered, r in zip(found, requests, strict=True))
    return hits / len(requests)


async def rank_all(index: ToolIndex, queries: list[str], group: bool) -> tuple[list[list[Hit]], float]:
    started = time.perf_counter()
    found = [await index.search(q, K, group=group) for q in queries]
    return found, (time.perf_counter() - started) * 1000 / len(queries)


def names(hits: list[Hit]) -> list[str]:
    """Every name the hits offer: a hit's own, and the same tool's on other servers."""
    return [name for hit in hits for name in (hit.tool.name, *(other.name for other in hit.also))]


def wire_bytes(tools: list[types.Tool]) -> int:
    result = types.ListToolsResult(tools=tools)
    return len(json.dumps(result.model_dump(mode="json", by_alias=True, exclude_none=True), separators=(",", ":")))


def without_intent(tool: CatalogTool) -> types.Tool:
    schema = dict(tool.input_schema)
    if tool.wants_intent:
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k != INTENT_ARGUMENT}
        schema["required"] = [r for r in schema.get("required", []) if r != INTENT_ARGUMENT]
    return tool.definition.model_copy(update={"input_schema": schema})


def with_old_intent(tool: CatalogTool) -> types.Tool:
    if not tool.wants_intent:
        return tool.definition
    schema = dict(tool.input_schema)
    schema["properties"] = {**schema["properties"], INTENT_ARGUMENT: OLD_INTENT}
    return tool.definition.model_copy(update={"input_schema": schema})


class Remembered:
    """An encoder whose vectors are kept by text, so two rankers over one model embed each text once;
    `timings` holds (texts, seconds) of every call that reached the model."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.info = encoder.info
        self._seen: dict[str, np.ndarray] = {}
        self.timings: list[tuple[int, float]] = []

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        return await self.encoder.encode_steps(steps)

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        new = list(dict.fromkeys(t for t in texts if t not in self._seen))
        if new:
            started = time.perf_counter()
            vectors = await self.encoder.encode_texts(new)
            self.timings.append((len(new), time.perf_counter() - started))
            for text, vector in zip(new, vectors, strict=True):
                self._seen[text] = vector
        return np.stack([self._seen[t] for t in texts])


def fusion_label(fusion: Fusion) -> str:
    return f"hybrid-emb {fusion.how} {fusion.semantic:g}"


def parse_fusions(text: str) -> list[Fusion]:
    """`rrf:1,sum:0.5`: the fusions `--fusions` measures beside the default."""
    fusions = []
    for item in filter(None, text.split(",")):
        how, _, weight = item.partition(":")
        if how not in ("rrf", "sum"):
            raise SystemExit(f"--fusions: {item!r} is not rrf:WEIGHT or sum:WEIGHT")
        fusions.append(Fusion("rrf" if how == "rrf" else "sum", float(weight or 1)))
    return fusions


async def measure(
    size: int, requests: list[dict[str, Any]], embedding: Encoder | None, fusions: Sequence[Fusion] = ()
) -> dict[str, Any]:
    catalog = padded(size)
    tools = catalog.tools()
    queries = [r["request"] for r in requests]
    row: dict[str, Any] = {"size": len(tools), "writes": sum(t.effect == "write" for t in tools)}
    baseline = McpproxyBm25(tools)
    started = time.perf_counter()
    found = [[t.name for t in baseline.search(q, K)] for q in queries]
    row["mcpproxy-bm25"] = (recall(found, requests), (time.perf_counter() - started) * 1000 / len(queries))
    hashing = HashingEncoder(dim=SEARCH_HASH_DIM)
    rankers: list[tuple[str, Encoder | None, Rank, bool, Fusion]] = [
        ("words-ungrouped", None, "words", False, FUSION),
        ("words", None, "words", True, FUSION),
        ("hashing", hashing, "encoder", True, FUSION),
        ("hybrid", hashing, "hybrid", True, FUSION),
    ]
    if embedding is not None:
        rankers += [("embedding", embedding, "encoder", True, FUSION)]
        rankers += [("hybrid-emb", embedding, "hybrid", True, FUSION)]
        rankers += [(fusion_label(f), embedding, "hybrid", True, f) for f in fusions]
    default: list[list[Hit]] = []
    timed = len(embedding.timings) if isinstance(embedding, Remembered) else 0
    for label, encoder, rank, group, fusion in rankers:
        index = ToolIndex(catalog.tools, encoder, rank, fusion=fusion, embed_budget=None)
        started = time.perf_counter()
        await index.search("warm up: build the index", K)
        row[f"{label}-build-ms"] = (time.perf_counter() - started) * 1000
        hits, per_query = await rank_all(index, queries, group)
        row[label] = (recall([names(h) for h in hits], requests), per_query)
        if label == "words":  # what `rank: auto` does under the default (hashing) encoder
            default = hits
    if isinstance(embedding, Remembered):  # the catalog's tools in batches, then each request alone
        calls = embedding.timings[timed:]
        row["embedded"] = [(n, s) for n, s in calls if n > 1]
        row["request-ms"] = [s * 1000 for n, s in calls if n == 1]
    # Bytes: list mode (ours, old intent, the backends' own) against search mode.
    row["list-bytes"] = wire_bytes([t.definition for t in tools])
    row["list-bytes-old-intent"] = wire_bytes([with_old_intent(t) for t in tools])
    row["list-bytes-backends"] = wire_bytes([without_intent(t) for t in tools])
    row["search-list-bytes"] = wire_bytes([search_tool(K), CALL_TOOL])
    sizes = [len(results_text(hits).encode()) for hits in default]
    row["search-result-bytes"] = sum(sizes) / len(sizes)
    return row


def report(rows: list[dict[str, Any]], labels: list[str]) -> None:
    print("\n## Recall@5 (share of requests whose right tool is in the first 5 hits), ms per query")
    print("| tools | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for row in rows:
        cells = [f"{row[label][0]:.3f} ({row[label][1]:.1f} ms)" for label in labels]
        print(f"| {row['size']} | " + " | ".join(cells) + " |")
    print(
        "\nIndex build (first search) ms: "
        + "; ".join(
            f"{row['size']}: " + ", ".join(f"{label} {row[f'{label}-build-ms']:.0f}" for label in labels[1:])
            for row in rows
        )
    )
    for row in rows:
        if "embedded" in row:
            texts, seconds = sum(n for n, _ in row["embedded"]), sum(s for _, s in row["embedded"])
            each = row["request-ms"]
            requests = (
                f"; a request {np.median(each):.1f} ms median, {max(each):.1f} ms max ({len(each)} requests)"
                if each
                else ""  # the requests were embedded at a smaller size
            )
            print(
                f"Embedding at {row['size']} tools: {texts} new tool texts in {seconds:.1f} s"
                f" ({seconds * 1000 / max(texts, 1):.1f} ms each){requests}"
            )
    print("\n## Bytes a client reads (tokens ≈ bytes / 4)")
    print(
        "| tools | writes | full tools/list | its intent share | old intent | backends' own | search mode:"
        " tools/list + one search | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        full, own, old = row["list-bytes"], row["list-bytes-backends"], row["list-bytes-old-intent"]
        search = row["search-list-bytes"] + row["search-result-bytes"]
        print(
            f"| {row['size']} | {row['writes']} | {full:,} | +{(full - own) / own:.1%} ({full - own:,} B) |"
            f" +{(old - own) / own:.1%} ({old - own:,} B) | {own:,} | {row['search-list-bytes']:,} +"
            f" {row['search-result-bytes']:,.0f} = {search:,.0f} | {search / full:.4f} |"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,5000", help="catalog sizes (real tools + synthetic padding)")
    parser.add_argument(
        "--dump", action="store_true", help="re-dump the real servers' tools/list from .backends, then stop"
    )
    parser.add_argument("--embedding-url", help="an OpenAI-compatible /v1 base URL serving embeddings")
    parser.add_argument("--embedding-model", default="", help="the embedding model's name")
    parser.add_argument(
        "--minilm", action="store_true", help="embed with all-MiniLM-L6-v2 in process (the embeddings extra)"
    )
    parser.add_argument(
        "--onnx", type=onnx_dir, help="embed with the ONNX sentence model in DIR (model.onnx, tokenizer.json)"
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="with --onnx: ids per text")
    parser.add_argument(
        "--pooling", choices=POOLINGS, default="mean", help="with --onnx: mean, or the first token's state (bge)"
    )
    parser.add_argument("--query-prefix", default="", help="with --onnx: before each request, e.g. 'query: ' (e5)")
    parser.add_argument("--text-prefix", default="", help="with --onnx: before each tool's text, e.g. 'passage: '")
    parser.add_argument(
        "--fusions", default="", help="with an embedding: more fusions to measure, e.g. rrf:0.5,sum:1 (tools/search.py)"
    )
    parser.add_argument(
        "--requests", type=Path, nargs="+", default=[REQUESTS_FILE], help="request sets, as in the default file"
    )
    parser.add_argument(
        "--split", choices=("dev", "test", "all"), default="all", help="dev: i %% 3 != 0; test: i %% 3 == 0"
    )
    args = parser.parse_args()
    if args.dump:
        listings = await dump()
        SERVERS_FILE.write_text(json.dumps(listings, indent=1) + "\n")
        print(f"wrote {SERVERS_FILE.name}: " + ", ".join(f"{name} {len(tools)}" for name, tools in listings.items()))
        return
    fusions = parse_fusions(args.fusions)
    embedding: Encoder | None = None
    if args.minilm:
        local = local_encoder()
        if local is None:
            raise SystemExit(f"--minilm needs the embeddings extra: {INSTALL}")
        embedding = local
    elif args.onnx:
        embedding = OnnxDirEncoder(
            args.onnx,
            max_tokens=args.max_tokens,
            pooling=args.pooling,
            query_prefix=args.query_prefix,
            text_prefix=args.text_prefix,
            queries=[r["request"] for file in args.requests for r in json.loads(file.read_text())],
        )
    elif args.embedding_url:
        embedding = EmbeddingEncoder(args.embedding_url, args.embedding_model)
    real = sum(map(len, real_listings().values()))
    sizes = [real, *(int(s) for s in args.sizes.split(","))]
    print(f"machine: {machine_line()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if embedding is not None:  # load the model (a local one) before anything is timed
        started = time.perf_counter()
        await embedding.encode_texts(["load the model"])
        print(f"embedding model ready in {time.perf_counter() - started:.1f} s; {resident()}")
    remembered = Remembered(embedding) if embedding else None  # the sizes share their real and first synthetic tools
    for file in args.requests:
        requests = split(json.loads(file.read_text()), args.split)
        print(f"\n# {len(requests)} requests ({args.split} of {file.name}) over {real} real tools")
        rows = []
        for size in sizes:
            rows.append(await measure(size, requests, remembered, fusions))
            recalls = ", ".join(f"{k} {v[0]:.3f}" for k, v in rows[-1].items() if isinstance(v, tuple))
            print(f"measured {rows[-1]['size']} tools: recall@5 {recalls}", flush=True)
        labels = ["mcpproxy-bm25", "words-ungrouped", "words", "hashing", "hybrid"]
        labels += ["embedding", "hybrid-emb", *map(fusion_label, fusions)] if embedding else []
        report(rows, labels)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {resident()}")


def resident() -> str:
    """This process's peak resident memory."""
    return f"peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"


if __name__ == "__main__":
    anyio.run(main)
