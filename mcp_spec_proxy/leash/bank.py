"""A LEASH bank: labelled unit vectors of past tasks or steps, searched by inner product in FAISS.

A bank answers "what are the k nearest past tasks (or steps), and did they succeed or fail?" (how
the neighbours become a decision is `layers.py`'s business). Vectors are L2-normalised, so inner
product is cosine similarity. Each vector has an id (its position, 0, 1, 2...), a label (`success` /
`failure`), a source (`verdict`, `outcome`, `import`), a JSON metadata object and a provenance (`calls/provenance.py`:
who labelled it, in which session, when), which `review: leash` reads before it trusts a label.

Index. Up to `approximate_after` vectors the index is exact (`IndexIDMap2(IndexFlatIP)`); once the
bank grows past it, an HNSW graph (`IndexHNSWFlat`, M=32, efSearch 32, inner product) replaces it,
built from the stored vectors, and its recall@10 against exact search is measured on a sample and
kept in `stats()`. By default the switch comes when an exact lookup would cost more than about
0.7 ms on one core (`EXACT_SCAN_FLOATS`: ~4k vectors of 1024 dims); measured on 2 cores, HNSW
then answers in under 1 ms at p99 with recall@10 >= 0.98 up to 100k vectors (docs/BENCHMARKS.md).
The raw vectors are always kept (in the index's own flat storage in memory, in segment files on
disk), so the index can be rebuilt either way.

Threads. Every method is thread-safe (one lock). The `a*` methods run in a worker thread via
`anyio.to_thread.run_sync`, so the event loop never waits on FAISS or disk. The HNSW graph is
built outside the lock, so lookups carry on against the exact index meanwhile. Searches pin OpenMP
to one thread for the duration of the call and restore the previous count afterwards: OpenMP's
thread count belongs to the calling thread, so this leaves adds and rebuilds (which use every
core) and the rest of the process alone.

Files and processes. `storage.py` owns the directory: its format, crash-safe generations and the
cross-process lock. Several processes may share a bank. `save()` first adopts whatever another
process saved since: that process's rows come first and this one's unsaved rows follow them (so the
ids `add` returned for unsaved rows may shift). `search()` and `add()` pick up a newer generation
before they run — one `stat` of the manifest when nothing changed, then only the new rows are read.
A newer generation that will not load is logged once and left alone: lookups go on with the rows
already loaded, and `save()` refuses to write over it.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import sys
import threading
import time
from array import array
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import faiss
import numpy as np

from mcp_spec_proxy.leash.encoders import EncoderInfo, normalise_rows
from mcp_spec_proxy.leash.provenance import UNKNOWN, Provenance
from mcp_spec_proxy.leash.rows import checked_rows
from mcp_spec_proxy.leash.storage import (
    KINDS,
    LABELS,
    MANIFEST,
    SOURCES,
    BankError,
    BankMismatch,
    Kind,
    Label,
    Source,
)

logger = logging.getLogger(__name__)

EXACT_SCAN_FLOATS = 1 << 22
"""With `approximate_after=None` (the default) a bank goes approximate once an exact lookup would
read more floats than this (16 MiB): 4096 vectors of 1024 dims, 1638 of 2560. One core scans that
in about 0.7 ms (docs/BENCHMARKS.md: 1.7 ms for 10k x 1024), the most an exact lookup may cost."""
HNSW_M = 32
EF_CONSTRUCTION = 40
EF_SEARCH = 32
RECALL_K = 10
RECALL_SAMPLE = 200
_ADD_CHUNK = 65_536


@dataclass(frozen=True)
class Neighbour:
    """One stored vector near a query: `score` is the inner product (cosine similarity, in [-1, 1])."""

    id: int
    score: float
    label: Label
    source: Source
    metadata: dict[str, Any]
    provenance: Provenance = UNKNOWN


@contextmanager
def _one_omp_thread() -> Iterator[None]:
    previous = faiss.omp_get_max_threads()
    if previous == 1:
        yield
        return
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


def new_flat(dim: int) -> Any:
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def _new_hnsw(dim: int, ef_search: int) -> Any:
    inner = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    inner.hnsw.efConstruction = EF_CONSTRUCTION
    inner.hnsw.efSearch = ef_search
    return faiss.IndexIDMap2(inner)


def stored_vectors(index: Any, dim: int) -> np.ndarray:
    """A view (no copy) of the vectors inside `index`, row i = id i. Valid until the index changes."""
    inner: Any = faiss.downcast_index(index.index)
    flat: Any = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSW) else inner
    count = int(flat.ntotal)
    if count == 0:
        return np.zeros((0, dim), dtype=np.float32)
    view: np.ndarray = faiss.rev_swig_ptr(flat.get_xb(), count * dim)
    return view.reshape(count, dim)


def add_chunked(index: Any, vectors: np.ndarray, first_id: int) -> None:
    for start in range(0, vectors.shape[0], _ADD_CHUNK):
        chunk = np.ascontiguousarray(vectors[start : start + _ADD_CHUNK], dtype=np.float32)
        index.add_with_ids(chunk, np.arange(first_id + start, first_id + start + chunk.shape[0], dtype=np.int64))


@dataclass(frozen=True)
class Recall:
    value: float  # mean recall@k
    sample: int  # queries
    count: int  # vectors in the bank when measured

    def as_json(self) -> dict[str, Any]:
        return {"recall_at_10": round(self.value, 4), "recall_sample": self.sample, "recall_measured_at": self.count}

    @classmethod
    def from_json(cls, info: Mapping[str, Any]) -> Recall | None:
        if "recall_at_10" not in info:
            return None
        return cls(float(info["recall_at_10"]), int(info["recall_sample"]), int(info["recall_measured_at"]))


def _recall(approximate: Any, vectors: np.ndarray, sample: int, k: int) -> Recall | None:
    """Mean recall@k of `approximate` against exact search over `vectors`, each query a stored vector
    whose own id is left out of both answers (it would be a free hit)."""
    count = vectors.shape[0]
    if count <= k + 1:
        return None
    picks = np.sort(np.random.default_rng(0).choice(count, size=min(sample, count), replace=False))
    queries = np.ascontiguousarray(vectors[picks])
    _, exact = faiss.knn(queries, vectors, k + 1, metric=faiss.METRIC_INNER_PRODUCT)
    _, found = approximate.search(queries, k + 1)
    hits = 0
    for own, truth, got in zip(picks.tolist(), exact.tolist(), found.tolist(), strict=True):
        truth_set = set([i for i in truth if i != own][:k])
        hits += len(truth_set & set([i for i in got if i != own][:k]))
    return Recall(hits / (len(picks) * k), len(picks), count)


class Bank:
    """Labelled unit vectors of one kind (`task` or `step`) from one encoder; see the module docstring.

    Make one with `Bank.open(directory, ...)` (on disk: a `PersistentBank`, `persistent.py`) or
    `Bank.in_memory(...)` (the twin for tests: the same bank, `refresh()` and `save()` do nothing).
    """

    def __init__(
        self, *, kind: Kind, encoder: EncoderInfo, approximate_after: int | None = None, ef_search: int = EF_SEARCH
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"bank kind must be one of {', '.join(KINDS)}, got {kind!r}")
        if (approximate_after is not None and approximate_after < 0) or ef_search < 1:
            raise ValueError("approximate_after must be >= 0 (or None: automatic) and ef_search >= 1")
        self.directory: Path | None = None
        self.kind: Kind = kind
        self._approximate_after = approximate_after
        self._encoder = encoder
        self._ef_search = ef_search
        self._lock = threading.Lock()
        self._index: Any = new_flat(encoder.dim) if encoder.dim else None
        self._approximate = False
        self._building = False  # an HNSW graph is being built, outside the lock
        self._labels = array("b")  # index into LABELS
        self._sources = array("b")  # index into SOURCES
        self._metadata: list[dict[str, Any] | None] = []
        self._provenance: list[Provenance] = []
        # When each session's labels were stored, oldest first: the per-session rate limit reads it.
        self._by_session: dict[str, list[float]] = {}
        self._recall: Recall | None = None
        self._dirty = True

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        kind: Kind,
        encoder: EncoderInfo,
        approximate_after: int | None = None,
        ef_search: int = EF_SEARCH,
    ) -> Bank:
        """Load the bank in `directory`, or create it there: see `PersistentBank.open`."""
        # Imported here: `persistent.py` subclasses `Bank`, so it imports this module first.
        from mcp_spec_proxy.leash.persistent import PersistentBank

        return PersistentBank.open(
            directory, kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search
        )

    @classmethod
    async def aopen(
        cls,
        directory: Path,
        *,
        kind: Kind,
        encoder: EncoderInfo,
        approximate_after: int | None = None,
        ef_search: int = EF_SEARCH,
    ) -> Bank:
        """`open` in a worker thread."""
        opener = functools.partial(
            cls.open, directory, kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search
        )
        return await anyio.to_thread.run_sync(opener)

    @classmethod
    def in_memory(
        cls, *, kind: Kind, encoder: EncoderInfo, approximate_after: int | None = None, ef_search: int = EF_SEARCH
    ) -> Bank:
        """A bank that lives in memory only (tests, one-off runs); `save()` is a no-op."""
        return cls(kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search)

    def refresh(self) -> bool:
        """Pick up rows another process saved; True if any came. In memory: nobody else saves."""
        return False

    def save(self) -> None:
        """Write the unsaved rows to disk. In memory: nothing to do."""

    def _disk_stats(self) -> dict[str, Any]:
        """What `stats()` says about the files: the generation on disk and leftovers of crashed saves."""
        return {"generation": 0}

    # -- reading -------------------------------------------------------------------------------

    @property
    def encoder(self) -> EncoderInfo:
        """Who made the vectors; `dim` is 0 only while an empty bank waits for its first vectors."""
        return self._encoder

    @property
    def count(self) -> int:
        return len(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    @property
    def approximate_after(self) -> int:
        """The size past which the index is HNSW; automatic (None) means `EXACT_SCAN_FLOATS // dim`."""
        if self._approximate_after is not None:
            return self._approximate_after
        return EXACT_SCAN_FLOATS // self._encoder.dim if self._encoder.dim else sys.maxsize

    @property
    def approximate(self) -> bool:
        return self._approximate

    @property
    def ef_search(self) -> int:
        return self._ef_search

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"ef_search must be at least 1, got {value}")
        with self._lock:
            self._ef_search = value
            if self._approximate:
                inner: Any = faiss.downcast_index(self._index.index)
                inner.hnsw.efSearch = value

    def search(self, vector: np.ndarray | Sequence[float], k: int = 10) -> list[Neighbour]:
        """The up-to-k stored vectors nearest `vector` (normalised here), most similar first."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.refresh()
        query = self._query(vector)
        with self._lock:
            if self._index is None or not self._labels:
                return []
            with _one_omp_thread():
                scores, ids = self._index.search(query, min(k, len(self._labels)))
            found = zip(scores[0].tolist(), ids[0].tolist(), strict=True)
            return [self._neighbour(i, score) for score, i in found if i >= 0]

    def stats(self) -> dict[str, Any]:
        with self._lock:
            by_source = {source: self._sources.count(code) for code, source in enumerate(SOURCES)}
            by_reporter: dict[str, int] = {}
            for row in self._provenance:
                by_reporter[row.reporter] = by_reporter.get(row.reporter, 0) + 1
            failures = self._labels.count(1)
            stats: dict[str, Any] = {
                "kind": self.kind,
                "directory": None if self.directory is None else str(self.directory),
                "encoder": self._encoder.as_json(),
                "count": len(self._labels),
                "successes": len(self._labels) - failures,
                "failures": failures,
                "by_source": by_source,
                "by_reporter": by_reporter,
                "index": "hnsw" if self._approximate else "flat",
                "approximate_after": self.approximate_after if self._encoder.dim else None,
                "unsaved": self._dirty,
            }
            if self._approximate:
                stats["hnsw"] = {"m": HNSW_M, "ef_construction": EF_CONSTRUCTION, "ef_search": self._ef_search}
                stats |= {"recall_at_10": None} if self._recall is None else self._recall.as_json()
            stats |= self._disk_stats()
            return stats

    def _query(self, vector: np.ndarray | Sequence[float]) -> np.ndarray:
        query = np.asarray(vector, dtype=np.float32)
        if query.ndim == 2 and query.shape[0] == 1:
            query = query[0]
        if query.ndim != 1:
            raise ValueError(f"search takes one vector, got shape {query.shape}")
        if self._encoder.dim and query.shape[0] != self._encoder.dim:
            raise ValueError(f"query has {query.shape[0]} dims, this bank holds {self._encoder.dim}")
        # Lean on purpose: this runs on every lookup, whose budget is a fraction of a millisecond.
        norm = math.sqrt(float(np.dot(query, query)))
        if not math.isfinite(norm):
            raise ValueError("query contains NaN or infinity")
        return (query / norm if norm > 0 else query.copy()).reshape(1, -1)

    def _neighbour(self, id: int, score: float) -> Neighbour:
        metadata = self._metadata[id]
        label, source = LABELS[self._labels[id]], SOURCES[self._sources[id]]
        return Neighbour(id, score, label, source, dict(metadata or {}), self._provenance[id])

    def labels_since(self, session: str, since: float) -> int:
        """How many labels of `session` were stored at or after `since` (unix seconds)."""
        self.refresh()
        with self._lock:
            times = self._by_session.get(session, [])
            return len(times) - bisect.bisect_left(times, since)

    async def alabels_since(self, session: str, since: float) -> int:
        """`labels_since` in a worker thread."""
        return await anyio.to_thread.run_sync(self.labels_since, session, since)

    def _keep_provenance(self, provenance: Sequence[Provenance]) -> None:
        """Append the provenance of new rows (they follow every row already held). Hold the lock."""
        self._provenance.extend(provenance)
        for row in provenance:
            if row.session is not None:
                bisect.insort(self._by_session.setdefault(row.session, []), row.at or 0.0)

    # -- writing -------------------------------------------------------------------------------

    def add(
        self,
        vectors: np.ndarray | Sequence[Sequence[float]],
        labels: Label | Sequence[Label],
        *,
        source: str,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        provenance: Provenance | Sequence[Provenance] | None = None,
    ) -> list[int]:
        """Store `vectors` (one row each, normalised here) with their labels; their new ids.

        `labels`, `metadata` and `provenance` are one per row, or one for all (no provenance:
        `Provenance.of(source)`). `source` is one of `SOURCES`.
        Metadata must be JSON (it is stored as its JSON round trip). Memory only until `save()`.
        The call that takes the bank past `approximate_after` also builds the HNSW graph (seconds to
        minutes); other threads' lookups and adds go on meanwhile.
        """
        rows = checked_rows(
            vectors, labels, source=source, metadata=metadata, dim=self._encoder.dim, provenance=provenance
        )
        if rows is None:
            return []
        matrix, label_list, stored = rows.matrix, rows.labels, rows.metadata
        count = len(label_list)
        normalised = normalise_rows(matrix)
        self.refresh()

        with self._lock:
            if self._index is None:
                self._encoder = EncoderInfo(self._encoder.name, self._encoder.model, matrix.shape[1])
                self._index = new_flat(self._encoder.dim)
            first = len(self._labels)
            add_chunked(self._index, normalised, first)
            self._labels.extend(LABELS.index(label) for label in label_list)
            self._sources.extend([SOURCES.index(source)] * count)
            self._metadata.extend(stored)
            self._keep_provenance(rows.provenance)
            self._dirty = True
            switch = not self._approximate and not self._building and len(self._labels) > self.approximate_after
            self._building |= switch
        if switch:
            try:
                self._go_approximate()
            finally:
                self._building = False
        return list(range(first, first + count))

    def _go_approximate(self, *, private: bool = False) -> None:
        """Replace the exact index with HNSW built from the stored vectors; measure its recall.

        The graph is built outside the lock from a copy of the vectors, so lookups go on meanwhile
        against the exact index; vectors added during the build join the graph at the swap.
        `private`: nobody else holds this bank yet (loading), so no copy is needed.
        """
        dim = self._encoder.dim
        started = time.perf_counter()
        with self._lock:
            source = self._index
            built = len(self._labels)
            vectors = stored_vectors(self._index, dim)[:built]
            if not private:
                vectors = vectors.copy()
        hnsw = _new_hnsw(dim, self._ef_search)
        add_chunked(hnsw, vectors, 0)
        recall = _recall(hnsw, vectors, RECALL_SAMPLE, RECALL_K)
        del vectors
        with self._lock:
            if self._index is not source:
                # Another process's generation replaced the index meanwhile (`_reload`); the next add decides again.
                return
            if len(self._labels) > built:
                add_chunked(hnsw, stored_vectors(self._index, dim)[built:], built)
            self._index = hnsw
            self._approximate = True
            self._recall = recall
            self._dirty = True
        logger.info(
            "LEASH %s bank: switched to HNSW at %d vectors in %.1fs, recall@%d %s",
            self.kind,
            built,
            time.perf_counter() - started,
            RECALL_K,
            "n/a" if recall is None else f"{recall.value:.3f}",
        )

    async def aadd(
        self,
        vectors: np.ndarray | Sequence[Sequence[float]],
        labels: Label | Sequence[Label],
        *,
        source: str,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
        provenance: Provenance | Sequence[Provenance] | None = None,
    ) -> list[int]:
        """`add` in a worker thread."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.add, vectors, labels, source=source, metadata=metadata, provenance=provenance)
        )

    async def asearch(self, vector: np.ndarray | Sequence[float], k: int = 10) -> list[Neighbour]:
        """`search` in a worker thread."""
        return await anyio.to_thread.run_sync(self.search, vector, k)

    async def asave(self) -> None:
        """`save` in a worker thread."""
        await anyio.to_thread.run_sync(self.save)

    def __repr__(self) -> str:
        index = "hnsw" if self._approximate else "flat"
        return f"Bank({self.kind}, {self._encoder.describe()}, {len(self._labels)} vectors, {index}, {self.directory})"


__all__ = [
    "EF_CONSTRUCTION",
    "EF_SEARCH",
    "EXACT_SCAN_FLOATS",
    "HNSW_M",
    "LABELS",
    "MANIFEST",
    "SOURCES",
    "Bank",
    "BankError",
    "BankMismatch",
    "Kind",
    "Label",
    "Neighbour",
    "Source",
]
