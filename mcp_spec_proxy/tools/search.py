"""Tool search: rank the catalog's callable tools for a request in plain words.

Under `catalog: {mode: search}` a client does not read every tool; it asks `search_tools`
(`fronts/catalog_search.py`) and reads the few that fit. `ToolIndex` ranks them three ways:

* `words` — BM25F over each tool's words (`toolwords`): its name (split at `_`, `-`, `.` and
  camelCase) and title, description, server, and its arguments' names and descriptions (at half
  weight), each field normalised by its own length; plurals and `-ing` folded, common English
  words dropped; a request's words bring their synonyms from a small table of API verbs and
  nouns, and a tool whose effect is not the one the request's verb asks for (read, write) is
  nudged down;
* `encoder` — cosine similarity under one of LEASH's encoders: where `leash.encoder: embedding`
  is configured, that very embedding endpoint; else, where the `embeddings` extra is installed, a
  small model in process (all-MiniLM-L6-v2, `leash/local_model.py`); else `hashing` (nothing to
  install or serve: it hashes the same words and their bigrams). A model reads the tool's text in
  plain words;
* `hybrid` — both, fused (`Fusion`): the words' scores over their best, plus the cosine at `FUSION`'s
  weight.

`auto` (the default) is `hybrid` under an embedding encoder and `words` under hashing: on
`bench/retrieval.py` hashed words alone, and fused with BM25, ranked the right tool lower than
BM25 alone (docs/BENCHMARKS.md), so the hashing encoder is there to choose, not the default.

What it promises: a held tool (its definition changed since first seen, or it appeared after its
server's first listing) is never a hit, so search never offers a tool the operator has not
accepted. Words and vectors are computed once per tool definition (public name and fingerprint)
and kept while that definition is in the catalog; each field is cut first (`NAME_CHARS`,
`DESCRIPTION_CHARS`, `ARGUMENTS_INDEXED`), so what a tool costs the index is bounded whatever its
backend lists. A backend cannot steer the hits: look-alike tools of several servers (the same
name, or the same description: `lookalikes`) are one hit, the tool of the server the user trusts
most (`lookalikes.preference`), the others in `also`; equal scores are ordered by that trust too,
never by server name; and one server fills at most `share(limit)` of the hits while other servers'
tools match at all, so a backend that stuffs its descriptions with a task's words cannot take
every hit. An encoder that fails (an embedding endpoint
that is down) is logged once and retried after `ENCODER_RETRY_S`; meanwhile the words alone rank.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Literal

import anyio
import numpy as np

from mcp_spec_proxy.calls.access import VIEW, shown, viewing
from mcp_spec_proxy.leash.encoders import Encoder, LeashError
from mcp_spec_proxy.tools import lookalikes
from mcp_spec_proxy.tools.catalog import CatalogTool, is_held
from mcp_spec_proxy.tools.words import OFF_CUE, Bm25F, cue, expand, words

logger = logging.getLogger(__name__)

Rank = Literal["auto", "hybrid", "words", "encoder"]

SEARCH_HASH_DIM = 4096
"""The hashing encoder's dimension for tool search (LEASH's banks keep their own `leash.dim`)."""
DESCRIPTION_CHARS = 1500
"""Characters of a description (a tool's, an argument's) that are indexed; the rest is noise."""
NAME_CHARS = 200
"""Characters of a name (a tool's, its title, an argument's) that are indexed: real ones are far
shorter, and a crafted one of a megabyte would otherwise be indexed word by word."""
ARGUMENTS_INDEXED = 30
"""Arguments of a tool that are indexed, in the order its schema lists them."""
RRF_K = 60
"""Reciprocal rank fusion's constant: a hit's fused score is the sum of 1 / (RRF_K + its rank)."""
FUSE_DEPTH = 100
"""Hits each ranker contributes to the fusion."""
EMBED_BUDGET_S = 1.0
"""Seconds one search spends embedding tools that have no vector yet (at least one batch of
`EMBED_BATCH`). Until every tool has one, the words alone rank: the first searches over a large
catalog answer at once instead of waiting for a small model on a CPU (about a minute per 5,000 tools)."""
EMBED_BATCH = 32
"""Tools embedded per encoder call (about 0.6 s for a small model on a loaded 2-core CPU)."""
ENCODER_RETRY_S = 60.0
"""After an encoder fails, the words alone rank for this long before the encoder is tried again."""


@dataclass(frozen=True)
class _Document:
    fields: dict[str, tuple[str, ...]]  # what BM25F sees (`toolwords.FIELD_WEIGHTS`)
    text: str  # what an embedding model sees: the tool in plain words
    keys: tuple[lookalikes.Key, ...] = ()  # what makes another server's tool its look-alike (`lookalikes.keys`)

    @property
    def terms(self) -> tuple[str, ...]:  # what the hashing encoder sees
        return tuple(term for terms in self.fields.values() for term in terms)


def document(tool: CatalogTool) -> _Document:
    """What is indexed of one tool: its name's words, title, description, server, arguments."""
    definition = tool.definition
    name = _terms(tool.original[:NAME_CHARS])
    heading = (definition.title or "")[:NAME_CHARS]
    description = (definition.description or "")[:DESCRIPTION_CHARS]
    arguments = _argument_lines(tool.input_schema)
    fields = {
        "name": (*name, *words(heading)),
        "description": tuple(words(description)),
        "server": tuple(words(tool.server)),
        "arguments": tuple(w for line in arguments for w in words(line)),
    }
    title = f" ({heading})" if heading else ""
    text = f"{' '.join(name)}{title}, on {tool.server}: {description}"
    if arguments:
        text += " Arguments: " + "; ".join(arguments)
    return _Document(fields, text, lookalikes.keys(tool))


def _terms(identifier: str) -> list[str]:
    return words(identifier, keep_stop=True)


def _argument_lines(schema: Any) -> list[str]:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return []
    lines = []
    for key, spec in islice(properties.items(), ARGUMENTS_INDEXED):
        about = spec.get("description") if isinstance(spec, dict) else None
        about = about if isinstance(about, str) else ""
        label = str(key)[:NAME_CHARS]
        lines.append(f"{label}: {about[:200]}" if about else label)
    return lines


def top(scores: np.ndarray, limit: int) -> list[int]:
    """Indices of the `limit` best positive scores, best first (ties by position: stable)."""
    if limit <= 0 or not len(scores):
        return []
    order = np.argsort(-scores, kind="stable")[:limit]
    return [int(i) for i in order if scores[i] > 0]


def fuse(
    rankings: Sequence[Sequence[int]], size: int, k: int = RRF_K, weights: Sequence[float] | None = None
) -> np.ndarray:
    """Reciprocal rank fusion of best-first index lists into one score per document (each list's
    share times its `weights` entry, 1 each without)."""
    fused = np.zeros(size, dtype=np.float64)
    for position, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[position]
        for rank, index in enumerate(ranking, 1):
            fused[index] += weight / (k + rank)
    return fused


@dataclass(frozen=True)
class Fusion:
    """How `hybrid` fuses the words' scores with the encoder's cosines, the words at weight 1.

    `rrf`: reciprocal rank fusion of the two rankings, the encoder's at `semantic`; `sum`: the words'
    scores over the best of them, plus `semantic` times the cosine (negative cosines count 0)."""

    how: Literal["rrf", "sum"] = "rrf"
    semantic: float = 1.0

    def scores(self, lexical: np.ndarray, semantic: np.ndarray, depth: int) -> np.ndarray:
        if self.how == "rrf":
            return fuse([top(lexical, depth), top(semantic, depth)], len(lexical), weights=(1.0, self.semantic))
        peak = float(lexical.max())
        fused: np.ndarray = (lexical / peak if peak > 0 else lexical) + self.semantic * np.clip(semantic, 0.0, None)
        return fused


FUSION = Fusion("sum", 3.0)
"""`hybrid`'s fusion: on the bench's development requests (docs/BENCHMARKS.md, a small embedding model
in process) the weighted sum at 3 found the most at 1,000 tools and all but the most at 5,000; reciprocal
rank fusion found less than the words alone at both."""


@dataclass(frozen=True)
class Hit:
    tool: CatalogTool
    also: tuple[CatalogTool, ...] = ()  # its look-alikes on other servers, most trusted first


def share(limit: int) -> int:
    """The most of `limit` hits one server fills while other servers' tools match: half, rounded up."""
    return max(1, -(-limit // 2))


def bounded(hits: Sequence[Hit], limit: int) -> list[Hit]:
    """The first `limit` hits, a server's past `share(limit)` only after every other server's."""
    most = share(limit)
    counts: Counter[str] = Counter()
    chosen: list[Hit] = []
    spilled: list[Hit] = []
    for hit in hits:
        if len(chosen) == limit:
            break
        server = hit.tool.server
        (chosen if counts[server] < most else spilled).append(hit)
        counts[server] += 1
    return chosen + spilled[: limit - len(chosen)]


def _only(scores: np.ndarray, seen_by: list[bool] | None) -> np.ndarray:
    """`scores` with those of tools the client does not see (`seen_by`, None: it sees all) at 0: no hit."""
    if seen_by is None:
        return scores
    return np.where(np.fromiter(seen_by, bool, len(seen_by)), scores, 0.0)


class ToolIndex:
    """Ranks the callable tools of a tool list (the live catalog) for a request in words.

    `tools` is read at every search, so the index follows backends that come and go and
    definitions that are accepted; only what changed is encoded again. `trust` ranks servers, 0
    for the most trusted (`lookalikes.preference`); a server it does not name comes after those
    it does.
    """

    def __init__(
        self,
        tools: Callable[[], list[CatalogTool]],
        encoder: Encoder | None,
        rank: Rank = "auto",
        trust: Mapping[str, int] | None = None,
        fusion: Fusion = FUSION,
        embed_budget: float | None = EMBED_BUDGET_S,
    ) -> None:
        self._tools = tools
        self._fusion = fusion
        self._embed_budget = embed_budget  # None: embed every tool before the first answer
        self._trust = dict(trust or {})
        self._hashing = encoder is not None and encoder.info.name == "hashing"
        if rank == "auto":
            rank = "words" if encoder is None or self._hashing else "hybrid"
        self._encoder = encoder if rank != "words" else None
        self._rank: Rank = rank
        self._documents: dict[tuple[str, str], _Document] = {}
        self._vectors: dict[tuple[str, str], np.ndarray] = {}
        self._keys: tuple[tuple[str, str], ...] = ()
        self._listed: list[CatalogTool] = []  # most trusted server first, so equal scores rank by trust
        self._group: list[int] = []  # per listed tool: the first (most trusted) of its look-alikes
        self._members: dict[int, list[int]] = {}  # that first tool: its look-alikes, itself first
        self._bm25 = Bm25F([])
        self._matrix: np.ndarray | None = None
        self._lock = anyio.Lock()
        self._encoder_failed_at: float | None = None

    async def search(self, query: str, limit: int, *, group: bool = True) -> list[Hit]:
        """The best `limit` callable tools for `query`, best first; none when nothing matches.

        Look-alike tools of several servers (one server connected for two accounts, or a copy
        listed by another backend) are one hit: the most trusted server's tool, the others in
        `also`, so copies neither crowd other tools out of the few hits a client reads nor take
        a trusted tool's place (`group=False`: each its own hit). One server fills at most
        `share(limit)` hits while other servers' tools match (`bounded`)."""
        async with self._lock:
            # The index holds every tool, whoever asks; a search ranks only those its client sees
            # (`calls/access.py`), so clients who see different tools do not rebuild it for each other.
            with viewing(None):
                await self._refresh()
            listed, bm25, matrix = self._listed, self._bm25, self._matrix
            group_of, members = self._group, self._members
        seen_by = None if VIEW.get() is None else [shown(tool.server, tool.name) for tool in listed]
        if not listed or (seen_by is not None and not any(seen_by)):
            return []
        depth = max(limit, FUSE_DEPTH)
        cosines: np.ndarray | None = None
        if matrix is not None:
            vector = await self._encode_query(query)
            if vector is not None:
                cosines = _only(matrix @ vector, seen_by)
        semantic = top(cosines, depth) if cosines is not None else []
        if semantic and self._rank == "encoder":
            ranking = semantic
        else:  # words, hybrid, or an encoder that cannot answer now: the words rank
            scores = _only(self._words(query, listed, bm25), seen_by)
            lexical = top(scores, depth)
            if cosines is not None and semantic and lexical and self._rank == "hybrid":
                ranking = top(self._fusion.scores(scores, cosines, depth), depth)
            else:
                ranking = lexical or semantic
        if not group:
            return bounded([Hit(listed[i]) for i in ranking], limit)
        hits, seen = [], set()
        for index in ranking:
            first = group_of[index]
            if first not in seen:  # the set ranks where its best-scoring member does
                seen.add(first)
                own, *others = [i for i in members[first] if seen_by is None or seen_by[i]]
                hits.append(Hit(listed[own], tuple(listed[i] for i in others)))
        return bounded(hits, limit)

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _words(query: str, listed: Sequence[CatalogTool], bm25: Bm25F) -> np.ndarray:
        scores = bm25.scores(expand(words(query)))
        effect = cue(query)
        if effect is not None:
            scores *= np.fromiter((1.0 if t.effect == effect else OFF_CUE for t in listed), np.float64, len(listed))
        return scores

    def _encoder_usable(self) -> bool:
        if self._encoder is None:
            return False
        failed = self._encoder_failed_at
        return failed is None or time.monotonic() - failed >= ENCODER_RETRY_S

    def _encoder_failed(self, exc: Exception) -> None:
        if self._encoder_failed_at is None:
            logger.warning("tool search ranks by words alone for now: the encoder failed (%s)", exc)
        self._encoder_failed_at = time.monotonic()

    def _encoder_back(self) -> None:
        if self._encoder_failed_at is not None:
            logger.warning("tool search uses its encoder again")
        self._encoder_failed_at = None

    async def _refresh(self) -> None:
        unheld = [tool for tool in self._tools() if not is_held(tool)]
        last = len(self._trust)
        listed = sorted(unheld, key=lambda tool: self._trust.get(tool.server, last))  # stable: catalog order
        keys = tuple((tool.name, tool.fingerprint) for tool in listed)
        missing_vectors = self._encoder_usable() and any(key not in self._vectors for key in keys)
        if keys == self._keys and not missing_vectors:
            return
        for tool, key in zip(listed, keys, strict=True):
            if key not in self._documents:
                self._documents[key] = document(tool)
        live = set(keys)
        self._documents = {key: doc for key, doc in self._documents.items() if key in live}
        self._vectors = {key: vector for key, vector in self._vectors.items() if key in live}
        docs = [self._documents[key] for key in keys]
        if keys != self._keys:
            self._bm25 = await anyio.to_thread.run_sync(Bm25F, [doc.fields for doc in docs])
        if self._encoder_usable():
            await self._encode_documents(keys, docs)
        self._matrix = np.stack([self._vectors[key] for key in keys]) if self._vectors_complete(keys) else None
        if keys == self._keys:  # only vectors were added (a catalog embedded a batch per search)
            return
        self._keys, self._listed = keys, listed
        self._group = lookalikes.groups(listed, [doc.keys for doc in docs])
        self._members = {}
        for index, first in enumerate(self._group):
            self._members.setdefault(first, []).append(index)

    def _vectors_complete(self, keys: Sequence[tuple[str, str]]) -> bool:
        return bool(keys) and all(key in self._vectors for key in keys)

    async def _encode_documents(self, keys: Sequence[tuple[str, str]], docs: Sequence[_Document]) -> None:
        assert self._encoder is not None
        wanted = [(key, doc) for key, doc in zip(keys, docs, strict=True) if key not in self._vectors]
        if not wanted:
            return
        started = time.monotonic()
        for first in range(0, len(wanted), EMBED_BATCH):
            batch = wanted[first : first + EMBED_BATCH]
            try:
                vectors = await self._encoder.encode_texts([self._encodable(doc) for _, doc in batch])
            except LeashError as exc:
                self._encoder_failed(exc)
                return
            self._encoder_back()
            for (key, _), vector in zip(batch, vectors, strict=True):
                self._vectors[key] = vector
            if self._embed_budget is not None and time.monotonic() - started >= self._embed_budget:
                return  # the rest at the next searches; the words rank until then

    async def _encode_query(self, query: str) -> np.ndarray | None:
        if self._encoder is None or not self._encoder_usable():
            return None
        text = " ".join(words(query)) if self._hashing else query
        try:
            vectors = await self._encoder.encode_texts([text])
        except LeashError as exc:
            self._encoder_failed(exc)
            return None
        vector: np.ndarray = vectors[0]
        return vector

    def _encodable(self, doc: _Document) -> str:
        # Hashed words need the same folded words the query gets; a model reads plain text.
        return " ".join(doc.terms) if self._hashing else doc.text
