"""A LEASH bank: labelled unit vectors of past tasks or steps, searched by inner product in FAISS.

A bank answers "what are the k nearest past tasks (or steps), and did they succeed or fail?".
Vectors are L2-normalised, so inner product is cosine similarity. Each vector has an id (its
position, 0, 1, 2...), a label (`success` / `failure`), a source (`verdict`, `outcome`,
`import`) and a JSON metadata object.

Index. Up to `approximate_after` vectors the index is exact (`IndexIDMap2(IndexFlatIP)`); once the
bank grows past it, an HNSW graph (`IndexHNSWFlat`, M=32, efSearch 32, inner product) replaces it,
built from the stored vectors, and its recall@10 against exact search is measured on a sample and
kept in `stats()`. By default the switch comes when an exact lookup would cost more than about
0.7 ms on one core (`EXACT_SCAN_FLOATS`: ~4k vectors of 1024 dims); measured on 2 cores, HNSW
then answers in under 1 ms at p99 with recall@10 >= 0.98 up to 100k vectors (docs/BENCHMARKS.md).
The raw vectors are always kept (in the index's own flat storage in memory, in `vectors-N.npy` on
disk), so the index can be rebuilt either way.

Threads. Every method is thread-safe (one lock). The `a*` methods run in a worker thread via
`anyio.to_thread.run_sync`, so the event loop never waits on FAISS or disk. The HNSW graph is
built outside the lock, so lookups carry on against the exact index meanwhile. Searches pin OpenMP
to one thread for the duration of the call and restore the previous count afterwards: OpenMP's
thread count belongs to the calling thread, so this leaves adds and rebuilds (which use every
core) and the rest of the process alone.

Files (directory per bank): `bank.json`, the manifest (kind, encoder, count, generation, and the
name, size and sha256 of every data file); segments of rows, each a `vectors-G.npy` and a
`meta-G.jsonl` (one `{"id", "label", "source", "metadata"}` per line) written by save number G;
and, for an HNSW bank, `index-G.faiss`. A save writes only the rows added since the last one, as a
new segment that absorbs the segments before it no longer than itself (a binary counter: O(log n)
segments), and rewrites the HNSW graph only once an eighth of it is new (loading adds the rest).
Every file goes to a temporary file that is fsynced and renamed, and the manifest goes LAST, so a
process killed at any moment leaves the manifest naming a complete earlier generation, which
loads; files of an unfinished save are reported by `stats()` and removed by the next successful
one. A bank that does not load is an error naming the files, never silently replaced; a bank made
by another encoder is `BankMismatch`.

Processes. Several processes (two proxies, a proxy and `bank import`) may share a bank directory.
Its lock file `.lock` is held (`flock`) exclusively while a generation is written and shared while
one is read, so nobody reads files that a save is replacing. `save()` first adopts whatever another
process saved since: that process's rows come first and this one's unsaved rows follow them (so
the ids `add` returned for unsaved rows may shift). `search()` and `add()` pick up a newer generation
before they run — one `stat` of the manifest when nothing changed, then only the new rows are read.
A newer generation that will not load is logged once and left alone: lookups go on with the rows
already loaded, and `save()` refuses to write over it.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import re
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import anyio
import faiss
import numpy as np

from mcp_spec_proxy.fingerprints import write_atomic
from mcp_spec_proxy.leash.encoders import EncoderInfo, LeashError, normalise_rows

logger = logging.getLogger(__name__)

Label = Literal["success", "failure"]
Kind = Literal["task", "step"]
Source = Literal["verdict", "outcome", "import"]
LABELS: tuple[Label, ...] = ("success", "failure")
SOURCES: tuple[Source, ...] = ("verdict", "outcome", "import")

FORMAT = "mcp-spec-proxy-leash-bank"
VERSION = 1
MANIFEST = "bank.json"
NO_EVIDENCE = 0.5
"""`failure_score` when there is nothing to weigh (empty bank, or no neighbour with a positive
similarity): neither side. Callers that need a minimum of evidence look at the neighbours too."""
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
_DATA_FILE = re.compile(r"^\.?(vectors|meta|index)-(\d{6,})\.(npy|jsonl|faiss)(\..*)?$")


class BankError(LeashError):
    """A bank cannot be loaded or saved; the message names the files and what to do."""


class BankMismatch(BankError):
    """The bank on disk was made by another encoder (or is of another kind) than the one configured."""


@dataclass(frozen=True)
class Neighbour:
    """One stored vector near a query: `score` is the inner product (cosine similarity, in [-1, 1])."""

    id: int
    score: float
    label: Label
    source: Source
    metadata: dict[str, Any]


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


class _HashingWriter:
    """A write-only file wrapper that counts and hashes what goes through it."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self._handle.write(view)
        self.size += view.nbytes
        return view.nbytes


def _write_file_atomic(path: Path, fill: Callable[[_HashingWriter], None]) -> dict[str, Any]:
    """`write_atomic` for binary content streamed by `fill`: temp file, fsync, rename. Name, size, sha256."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            writer = _HashingWriter(handle)
            fill(writer)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"name": path.name, "bytes": writer.size, "sha256": writer.sha256.hexdigest()}


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _locked(directory: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold the bank directory's lock file: exclusive to write a generation, shared to read one.

    `flock` belongs to the open file, so two `Bank` objects of one process exclude each other as
    two processes do. Take it before the bank's thread lock, never while holding that.
    """
    path = directory / ".lock"
    handle: IO[str] | None = None
    try:
        handle = path.open("a")
    except OSError:
        if not shared:
            raise
        with contextlib.suppress(OSError):
            handle = path.open("r")
    if handle is None:
        # A bank on a read-only disk that nobody made a lock file for: nobody can write it either.
        yield
        return
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


Signature = tuple[int, int, int]


def _signature(path: str | Path) -> Signature | None:
    """What changes whenever a manifest is replaced (it is renamed into place: a new inode)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _new_flat(dim: int) -> Any:
    return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))


def _new_hnsw(dim: int, ef_search: int) -> Any:
    inner = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
    inner.hnsw.efConstruction = EF_CONSTRUCTION
    inner.hnsw.efSearch = ef_search
    return faiss.IndexIDMap2(inner)


def _storage(index: Any, dim: int) -> np.ndarray:
    """A view (no copy) of the vectors inside `index`, row i = id i. Valid until the index changes."""
    inner: Any = faiss.downcast_index(index.index)
    flat: Any = faiss.downcast_index(inner.storage) if isinstance(inner, faiss.IndexHNSW) else inner
    count = int(flat.ntotal)
    if count == 0:
        return np.zeros((0, dim), dtype=np.float32)
    view: np.ndarray = faiss.rev_swig_ptr(flat.get_xb(), count * dim)
    return view.reshape(count, dim)


def _add_chunked(index: Any, vectors: np.ndarray, first_id: int) -> None:
    for start in range(0, vectors.shape[0], _ADD_CHUNK):
        chunk = np.ascontiguousarray(vectors[start : start + _ADD_CHUNK], dtype=np.float32)
        index.add_with_ids(chunk, np.arange(first_id + start, first_id + start + chunk.shape[0], dtype=np.int64))


@dataclass(frozen=True)
class _Recall:
    value: float  # mean recall@k
    sample: int  # queries
    count: int  # vectors in the bank when measured

    def as_json(self) -> dict[str, Any]:
        return {"recall_at_10": round(self.value, 4), "recall_sample": self.sample, "recall_measured_at": self.count}


def _recall(approximate: Any, vectors: np.ndarray, sample: int, k: int) -> _Recall | None:
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
    return _Recall(hits / (len(picks) * k), len(picks), count)


class Bank:
    """Labelled unit vectors of one kind (`task` or `step`) from one encoder; see the module docstring.

    Make one with `Bank.open(directory, ...)` (on disk) or `Bank.in_memory(...)` (the twin for tests:
    the same bank, `save()` does nothing).
    """

    def __init__(
        self,
        directory: Path | None,
        *,
        kind: Kind,
        encoder: EncoderInfo,
        approximate_after: int | None,
        ef_search: int,
        created: str | None = None,
    ) -> None:
        if kind not in ("task", "step"):
            raise ValueError(f"bank kind must be 'task' or 'step', got {kind!r}")
        if (approximate_after is not None and approximate_after < 0) or ef_search < 1:
            raise ValueError("approximate_after must be >= 0 (or None: automatic) and ef_search >= 1")
        self.directory = directory
        self.kind: Kind = kind
        self._approximate_after = approximate_after
        self._encoder = encoder
        self._ef_search = ef_search
        self._created = created or _now()
        self._lock = threading.Lock()
        self._index: Any = _new_flat(encoder.dim) if encoder.dim else None
        self._approximate = False
        self._building = False  # an HNSW graph is being built, outside the lock
        self._labels = array("b")  # index into LABELS
        self._sources = array("b")  # index into SOURCES
        self._metadata: list[dict[str, Any] | None] = []
        self._recall: _Recall | None = None
        self._generation = 0
        self._dirty = True
        self._abandoned: list[str] = []
        self._segments: list[dict[str, Any]] = []  # committed: {"start", "end", "vectors": file, "meta": file}
        self._index_file: dict[str, Any] | None = None  # committed HNSW graph: file and the "count" it holds
        self._signature: Signature | None = None  # of the manifest this bank last read or wrote
        # Checked before every lookup: kept as a string, a stat of it costs about a microsecond.
        self._manifest = None if directory is None else str(directory / MANIFEST)
        self._bad_signature: Signature | None = None  # of a newer manifest that would not load (logged)

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
        """Load the bank in `directory`, or create it (manifest written at once) if there is none.

        Raises `BankMismatch` if it was made by another encoder or is of another kind, and
        `BankError` if it cannot be read. Loading verifies every file's size and sha256, and
        builds the HNSW graph if the bank is past `approximate_after` without one (seconds to
        minutes for a large bank: call it from a worker thread, or use `aopen`).
        """
        directory = Path(directory).expanduser()
        manifest_path = directory / MANIFEST
        try:
            present = manifest_path.exists()
        except OSError as exc:
            raise BankError(f"cannot look for a LEASH bank in {directory}: {exc}") from None
        if present:
            try:
                with _locked(directory, shared=True):
                    return cls._load(directory, kind, encoder, approximate_after, ef_search)
            except OSError as exc:
                raise BankError(f"cannot lock LEASH bank directory {directory}: {exc.strerror or exc}") from None
        bank = cls(directory, kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BankError(f"cannot create LEASH bank directory {directory}: {exc.strerror or exc}") from None
        bank.save()
        return bank

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
            cls.open,
            directory,
            kind=kind,
            encoder=encoder,
            approximate_after=approximate_after,
            ef_search=ef_search,
        )
        return await anyio.to_thread.run_sync(opener)

    @classmethod
    def in_memory(
        cls, *, kind: Kind, encoder: EncoderInfo, approximate_after: int | None = None, ef_search: int = EF_SEARCH
    ) -> Bank:
        """A bank that lives in memory only (tests, one-off runs); `save()` is a no-op."""
        return cls(None, kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search)

    @classmethod
    def _load(
        cls, directory: Path, kind: Kind, encoder: EncoderInfo, approximate_after: int | None, ef_search: int
    ) -> Bank:
        """The bank in `directory` as its manifest says; the caller holds the directory's lock."""
        manifest = _Manifest.read(directory, kind, encoder)
        manifest.verify(manifest.entries())
        count, segments, index_file, dim = manifest.count, manifest.segments, manifest.index_file, manifest.encoder.dim
        bank = cls(
            directory,
            kind=kind,
            encoder=manifest.encoder,
            approximate_after=approximate_after,
            ef_search=ef_search,
            created=manifest.created,
        )
        bank._generation = manifest.generation
        bank._segments = segments
        bank._index_file = index_file
        bank._signature = manifest.signature
        try:
            for segment in segments:
                bank._extend_meta(_read_meta(directory / segment["meta"]["name"], segment["start"], segment["end"]))
            want_hnsw = count > bank.approximate_after
            if want_hnsw and index_file is not None and manifest.index_info.get("type") == "hnsw":
                bank._index = bank._read_hnsw(directory / index_file["name"], index_file["count"], dim)
                bank._approximate = True
                info = manifest.index_info
                if "recall_at_10" in info:
                    recall = info["recall_at_10"], info["recall_sample"], info["recall_measured_at"]
                    bank._recall = _Recall(float(recall[0]), int(recall[1]), int(recall[2]))
                # The graph is saved only now and then; the vectors added since join it here.
                bank._add_rows(directory, index_file["count"])
            else:
                if dim:
                    bank._index = _new_flat(dim)
                bank._add_rows(directory, 0)
            bank._dirty = False
            if want_hnsw and not bank._approximate:
                bank._go_approximate(private=True)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError) as exc:
            raise manifest.broken(str(exc) or repr(exc)) from None
        bank._abandoned = bank._stray_files()
        later = [name for name in bank._abandoned if _generation_of(name) > manifest.generation]
        if later:
            logger.warning(
                "LEASH %s bank in %s: an unfinished save of generation %d left %s; loaded generation %d",
                kind,
                directory,
                manifest.generation + 1,
                ", ".join(later),
                manifest.generation,
            )
        return bank

    def _extend_meta(self, rows: list[tuple[int, int, dict[str, Any] | None]]) -> None:
        for label, source, metadata in rows:
            self._labels.append(label)
            self._sources.append(source)
            self._metadata.append(metadata)

    def _add_rows(self, directory: Path, first: int) -> None:
        """Add the stored vectors from id `first` on to the index, segment by segment."""
        for start, vectors in _read_rows(directory, self._segments, first, self._encoder.dim):
            _add_chunked(self._index, vectors, start)
            del vectors

    # -- other processes -----------------------------------------------------------------------

    def refresh(self) -> bool:
        """Pick up the rows another process saved since this bank last read or wrote; True if any came.

        One `stat` when nothing changed. With rows added here and not saved yet it waits: `save()`
        merges. A newer generation that will not load is logged once and ignored (see the module
        docstring). `search()` and `add()` call this themselves.
        """
        directory = self.directory
        if directory is None or self._manifest is None:
            return False
        signature = _signature(self._manifest)
        if signature is None or signature in (self._signature, self._bad_signature):
            return False
        try:
            with _locked(directory, shared=True), self._lock:
                if self._pending():
                    return False
                before = len(self._labels)
                self._catch_up()
                return len(self._labels) > before
        except (BankError, OSError) as exc:
            self._bad_signature = signature
            logger.warning(
                "LEASH %s bank in %s: a generation saved by another process was not picked up (%s);"
                " lookups go on with the %d vectors loaded",
                self.kind,
                directory,
                exc,
                len(self._labels),
            )
            return False

    def _pending(self) -> bool:
        """Rows added here that no generation on disk holds yet."""
        return len(self._labels) > (self._segments[-1]["end"] if self._segments else 0)

    def _catch_up(self) -> None:
        """Adopt the generation on disk if another process saved one. Holds both locks.

        Only the new rows are read when this bank's rows are a prefix of the disk's (the bank was
        not replaced) and none is unsaved here; otherwise the bank is loaded afresh and the unsaved
        rows are added after the disk's.
        """
        directory = self.directory
        assert directory is not None
        if not (directory / MANIFEST).exists():
            if self._generation:
                raise BankError(
                    f"LEASH {self.kind} bank manifest {directory / MANIFEST} disappeared after this bank was"
                    " loaded; not writing a new bank over the rest of its files — move the directory aside"
                    " and restart"
                )
            return
        manifest = _Manifest.read(directory, self.kind, self._encoder)
        if manifest.generation == self._generation and manifest.created == self._created:
            self._signature = manifest.signature
            return
        saved = self._segments[-1]["end"] if self._segments else 0
        if self._pending() or manifest.created != self._created or manifest.count < saved:
            self._reload()
            return
        # Rows 0..saved are the same on disk (every save adopts the one before it): read the rest.
        new = [segment for segment in manifest.segments if segment["end"] > saved]
        manifest.verify([entry for segment in new for entry in (segment["vectors"], segment["meta"])])
        try:
            meta = [
                row
                for segment in new
                for row in _read_meta(directory / segment["meta"]["name"], segment["start"], segment["end"], saved)
            ]
            rows = _read_rows(directory, manifest.segments, saved, manifest.encoder.dim)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise manifest.broken(str(exc) or repr(exc)) from None
        if self._index is None and manifest.encoder.dim:
            self._encoder = manifest.encoder
            self._index = _new_flat(manifest.encoder.dim)
        for start, vectors in rows:
            _add_chunked(self._index, vectors, start)
        self._extend_meta(meta)
        self._generation = manifest.generation
        self._segments = manifest.segments
        self._index_file = manifest.index_file if self._approximate else None
        self._signature = manifest.signature
        logger.debug("LEASH %s bank: picked up %d rows of generation %d", self.kind, len(meta), self._generation)

    def _reload(self) -> None:
        """Become the bank on disk, with this bank's unsaved rows added after its rows.

        Rows this bank saved before are not carried over: if they are not on disk, the bank was
        moved aside and started anew on purpose.
        """
        assert self.directory is not None
        saved = self._segments[-1]["end"] if self._segments else 0
        count = len(self._labels)
        unsaved = _storage(self._index, self._encoder.dim)[saved:count].copy() if count > saved else None
        fresh = Bank._load(self.directory, self.kind, self._encoder, self._approximate_after, self._ef_search)
        if unsaved is not None:
            if fresh._index is None:
                fresh._encoder = self._encoder
                fresh._index = _new_flat(self._encoder.dim)
            _add_chunked(fresh._index, unsaved, len(fresh._labels))
            fresh._labels.extend(self._labels[saved:])
            fresh._sources.extend(self._sources[saved:])
            fresh._metadata.extend(self._metadata[saved:])
            fresh._dirty = True
        moved = (
            "_encoder _created _index _approximate _labels _sources _metadata _recall _generation _dirty"
            " _abandoned _segments _index_file _signature"
        )
        for name in moved.split():
            setattr(self, name, getattr(fresh, name))
        logger.debug(
            "LEASH %s bank in %s: reloaded generation %d saved by another process (%d rows, %d of them unsaved here)",
            self.kind,
            self.directory,
            self._generation,
            len(self._labels),
            count - saved,
        )

    def _read_hnsw(self, path: Path, count: int, dim: int) -> Any:
        index = faiss.read_index(str(path))
        inner = faiss.downcast_index(index.index) if hasattr(index, "index") else None
        if not isinstance(inner, faiss.IndexHNSW) or index.ntotal != count or index.d != dim:
            raise ValueError(f"{path.name} is not an HNSW index of {count} vectors of {dim} dims")
        inner.hnsw.efSearch = self._ef_search
        return index

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

    def failure_score(self, vector: np.ndarray | Sequence[float], k: int = 10) -> tuple[float, list[Neighbour]]:
        """Similarity-weighted share of failures among the k nearest, and those neighbours.

        Each neighbour weighs max(score, 0): dissimilar vectors carry no evidence. With nothing to
        weigh (empty bank, or no positive similarity) the score is `NO_EVIDENCE` (0.5) — check
        the neighbours before acting on it.
        """
        neighbours = self.search(vector, k)
        weights = [max(n.score, 0.0) for n in neighbours]
        total = sum(weights)
        if total <= 0:
            return NO_EVIDENCE, neighbours
        failed = sum(w for w, n in zip(weights, neighbours, strict=True) if n.label == "failure")
        return failed / total, neighbours

    def measure_recall(self, sample: int = RECALL_SAMPLE, k: int = RECALL_K) -> float | None:
        """Recall@k of the current index against exact search (1.0 when exact; None when too small).

        Holds the lock for `sample` exact queries over the whole bank (seconds at a million vectors);
        the result (for k=10) replaces the one in `stats()`, measured when the graph was built.
        """
        with self._lock:
            if not self._approximate:
                return 1.0 if self._labels else None
            measured = _recall(self._index, _storage(self._index, self._encoder.dim), sample, k)
            if measured is not None and k == RECALL_K:
                self._recall = measured
            return None if measured is None else measured.value

    def stats(self) -> dict[str, Any]:
        with self._lock:
            by_source = {source: self._sources.count(code) for code, source in enumerate(SOURCES)}
            failures = self._labels.count(1)
            stats: dict[str, Any] = {
                "kind": self.kind,
                "directory": None if self.directory is None else str(self.directory),
                "encoder": self._encoder.as_json(),
                "count": len(self._labels),
                "successes": len(self._labels) - failures,
                "failures": failures,
                "by_source": by_source,
                "index": "hnsw" if self._approximate else "flat",
                "approximate_after": self.approximate_after if self._encoder.dim else None,
                "generation": self._generation,
                "unsaved": self._dirty,
            }
            if self._approximate:
                stats["hnsw"] = {"m": HNSW_M, "ef_construction": EF_CONSTRUCTION, "ef_search": self._ef_search}
                stats |= {"recall_at_10": None} if self._recall is None else self._recall.as_json()
            if self._abandoned:
                stats["abandoned_files"] = list(self._abandoned)
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
        return Neighbour(id, score, LABELS[self._labels[id]], SOURCES[self._sources[id]], dict(metadata or {}))

    # -- writing -------------------------------------------------------------------------------

    def add(
        self,
        vectors: np.ndarray | Sequence[Sequence[float]],
        labels: Label | Sequence[Label],
        *,
        source: str,
        metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[int]:
        """Store `vectors` (one row each, normalised here) with their labels; their new ids.

        `labels` and `metadata` are one per row, or one for all. `source` is one of `SOURCES`.
        Metadata must be JSON (it is stored as its JSON round trip). Memory only until `save()`.
        The call that takes the bank past `approximate_after` also builds the HNSW graph (seconds to
        minutes); other threads' lookups and adds go on meanwhile.
        """
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix[None, :]
        if matrix.ndim != 2:
            raise ValueError(f"add takes an (n, dim) array, got shape {matrix.shape}")
        count = matrix.shape[0]
        if count == 0:
            return []
        if self._encoder.dim and matrix.shape[1] != self._encoder.dim:
            raise ValueError(f"vectors have {matrix.shape[1]} dims, this bank holds {self._encoder.dim}")
        if matrix.shape[1] == 0 or not np.isfinite(matrix).all():
            raise ValueError("vectors must be finite and non-empty")
        label_list = [labels] * count if isinstance(labels, str) else list(labels)
        if len(label_list) != count or any(label not in LABELS for label in label_list):
            raise ValueError(f"labels must be {count} of {LABELS}, got {labels!r}")
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        if metadata is None or isinstance(metadata, Mapping):
            metadata_list: list[Mapping[str, Any] | None] = [metadata] * count
        else:
            metadata_list = list(metadata)
        if len(metadata_list) != count:
            raise ValueError(f"metadata must be one mapping per vector ({count}), got {len(metadata_list)}")
        try:
            stored = [json.loads(json.dumps(dict(m), ensure_ascii=False)) if m else None for m in metadata_list]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"metadata must be JSON-serialisable: {exc}") from None
        normalised = normalise_rows(matrix)
        self.refresh()

        with self._lock:
            if self._index is None:
                self._encoder = EncoderInfo(self._encoder.name, self._encoder.model, matrix.shape[1])
                self._index = _new_flat(self._encoder.dim)
            first = len(self._labels)
            _add_chunked(self._index, normalised, first)
            self._labels.extend(LABELS.index(label) for label in label_list)
            self._sources.extend([SOURCES.index(source)] * count)
            self._metadata.extend(stored)
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
            vectors = _storage(self._index, dim)[:built]
            if not private:
                vectors = vectors.copy()
        hnsw = _new_hnsw(dim, self._ef_search)
        _add_chunked(hnsw, vectors, 0)
        recall = _recall(hnsw, vectors, RECALL_SAMPLE, RECALL_K)
        del vectors
        with self._lock:
            if self._index is not source:
                # Another process's generation replaced the index meanwhile (`_reload`); the next add decides again.
                return
            if len(self._labels) > built:
                _add_chunked(hnsw, _storage(self._index, dim)[built:], built)
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
    ) -> list[int]:
        """`add` in a worker thread."""
        return await anyio.to_thread.run_sync(
            functools.partial(self.add, vectors, labels, source=source, metadata=metadata)
        )

    async def asearch(self, vector: np.ndarray | Sequence[float], k: int = 10) -> list[Neighbour]:
        """`search` in a worker thread."""
        return await anyio.to_thread.run_sync(self.search, vector, k)

    async def afailure_score(self, vector: np.ndarray | Sequence[float], k: int = 10) -> tuple[float, list[Neighbour]]:
        """`failure_score` in a worker thread."""
        return await anyio.to_thread.run_sync(self.failure_score, vector, k)

    async def asave(self) -> None:
        """`save` in a worker thread."""
        await anyio.to_thread.run_sync(self.save)

    # -- persistence ---------------------------------------------------------------------------

    def save(self) -> None:
        """Write a new generation crash-safely (see the module docstring); nothing to do if unchanged.

        A generation another process saved meanwhile is adopted first (its rows, then this one's).
        Raises `BankError` if the disk refuses or that generation will not load; on any failure the
        generation on disk stays and loads.
        """
        directory = self.directory
        if directory is None or not self._dirty:
            return
        try:
            with _locked(directory), self._lock:
                if not self._dirty:
                    return
                self._catch_up()
                self._write_generation(directory, self._generation + 1)
                self._dirty = False
                self._abandoned = []
                # Still under the lock: nobody else's save is half-written, so what is not ours is stray.
                with contextlib.suppress(OSError):
                    for name in self._stray_files():
                        (directory / name).unlink(missing_ok=True)
        except OSError as exc:
            raise BankError(
                f"cannot save LEASH {self.kind} bank in {directory}: {exc.strerror or exc};"
                f" generation {self._generation} is still the one on disk"
            ) from None

    def _write_generation(self, directory: Path, generation: int) -> None:
        count = len(self._labels)
        segments = list(self._segments)
        saved = segments[-1]["end"] if segments else 0
        if count > saved:
            # The rows added since the last save go into one new segment file. Binary-counter merging:
            # a new segment at least as long as the one before it absorbs it, so n rows lie in
            # O(log n) segments and each row is rewritten O(log n) times, not at every save.
            start = saved
            while segments and count - start >= segments[-1]["end"] - segments[-1]["start"]:
                start = segments.pop()["start"]
            rows = _storage(self._index, self._encoder.dim)[start:count]
            vectors = _write_file_atomic(
                directory / f"vectors-{generation:06d}.npy",
                lambda out: np.lib.format.write_array(out, rows, allow_pickle=False),
            )
            meta = _write_file_atomic(
                directory / f"meta-{generation:06d}.jsonl", lambda out: self._write_meta(out, start, count)
            )
            segments.append({"start": start, "end": count, "vectors": vectors, "meta": meta})
        index_file = None
        index_info: dict[str, Any] = {"type": "flat"}
        if self._approximate:
            index_file = self._index_file
            # The graph is rewritten whole, so only when an eighth or more of it is new; loading adds the rest.
            if index_file is None or (count - index_file["count"]) * 8 >= index_file["count"]:
                blob = faiss.serialize_index(self._index)
                index_file = _write_file_atomic(
                    directory / f"index-{generation:06d}.faiss", lambda out: _put(out, blob)
                )
                index_file["count"] = count
            index_info = {"type": "hnsw", "m": HNSW_M, "ef_construction": EF_CONSTRUCTION, "ef_search": self._ef_search}
            if self._recall is not None:
                index_info |= self._recall.as_json()
        # The data files' names must be durable before a manifest can point at them.
        _fsync_dir(directory)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "kind": self.kind,
            "encoder": self._encoder.as_json(),
            "generation": generation,
            "count": count,
            "created": self._created,
            "saved": _now(),
            "index": index_info,
            "files": {"segments": segments, **({"index": index_file} if index_file else {})},
        }
        write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        _fsync_dir(directory)
        self._generation = generation
        self._segments = segments
        self._index_file = index_file
        self._signature = _signature(directory / MANIFEST)

    def _write_meta(self, out: _HashingWriter, start: int, end: int) -> None:
        lines: list[str] = []
        for position in range(start, end):
            record = {
                "id": position,
                "label": LABELS[self._labels[position]],
                "source": SOURCES[self._sources[position]],
                "metadata": self._metadata[position] or {},
            }
            lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            if len(lines) >= 4096:
                out.write("".join(lines).encode())
                lines.clear()
        out.write("".join(lines).encode())

    def _stray_files(self) -> list[str]:
        """Data and temporary files in the directory that the committed manifest does not name."""
        if self.directory is None:
            return []
        keep = {entry["name"] for segment in self._segments for entry in (segment["vectors"], segment["meta"])}
        if self._index_file is not None:
            keep.add(self._index_file["name"])
        try:
            names = sorted(entry.name for entry in os.scandir(self.directory) if entry.is_file())
        except OSError:
            return []
        temporary = f".{MANIFEST}."
        return [name for name in names if (_DATA_FILE.match(name) or name.startswith(temporary)) and name not in keep]

    def __repr__(self) -> str:
        index = "hnsw" if self._approximate else "flat"
        return f"Bank({self.kind}, {self._encoder.describe()}, {len(self._labels)} vectors, {index}, {self.directory})"


def _put(out: _HashingWriter, blob: Any) -> None:
    out.write(blob)


def _generation_of(name: str) -> int:
    match = _DATA_FILE.match(name)
    return int(match.group(2)) if match else -1


def _read_meta(path: Path, start: int, end: int, first: int = 0) -> list[tuple[int, int, dict[str, Any] | None]]:
    """(label, source, metadata) of rows `max(first, start)`..`end` of a meta file holding `start`..`end`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) != end - start:
        raise ValueError(f"{path.name} has {len(lines)} entries, the manifest says {end - start}")
    rows: list[tuple[int, int, dict[str, Any] | None]] = []
    for position, line in enumerate(lines, start):
        if position < first:
            continue
        record = json.loads(line)
        if record.get("id") != position:
            raise ValueError(f"{path.name}: id {record.get('id')!r} where {position} belongs")
        metadata = record.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"{path.name}: metadata of id {position} is not an object")
        rows.append((LABELS.index(record["label"]), SOURCES.index(record["source"]), metadata or None))
    return rows


def _read_rows(
    directory: Path, segments: Sequence[dict[str, Any]], first: int, dim: int
) -> list[tuple[int, np.ndarray]]:
    """(first id, vectors) of the stored rows from id `first` on, mapped from their segment files."""
    found: list[tuple[int, np.ndarray]] = []
    for segment in segments:
        start, end = segment["start"], segment["end"]
        if end <= first:
            continue
        path = directory / segment["vectors"]["name"]
        # Mapped, not read: the index copies it in chunks, so a big bank is never in memory twice.
        vectors = np.load(path, mmap_mode="r", allow_pickle=False)
        if vectors.dtype != np.float32 or vectors.shape != (end - start, dim):
            raise ValueError(
                f"{path.name} holds {vectors.dtype} {vectors.shape}, expected float32 ({end - start}, {dim})"
            )
        skip = max(0, first - start)
        found.append((start + skip, vectors[skip:]))
    return found


@dataclass(frozen=True)
class _Manifest:
    """A bank's `bank.json`, checked against the kind and encoder asked for."""

    directory: Path
    kind: Kind
    generation: int
    count: int
    segments: list[dict[str, Any]]
    index_file: dict[str, Any] | None
    index_info: dict[str, Any]
    created: str
    encoder: EncoderInfo  # the configured encoder, with the dimension on disk when it knows one
    names: tuple[str, ...]  # every file it names, for error messages
    signature: Signature | None

    @classmethod
    def read(cls, directory: Path, kind: Kind, encoder: EncoderInfo) -> _Manifest:
        """Parse and check the manifest; `BankError` if it will not do, `BankMismatch` if another encoder made it."""
        manifest_path = directory / MANIFEST
        names = [MANIFEST]

        def broken(problem: str) -> BankError:
            return _broken(directory, kind, names, problem)

        signature = _signature(manifest_path)
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise broken(f"{MANIFEST} is unreadable ({exc})") from None
        try:
            if manifest.get("format") != FORMAT:
                raise broken(f"{MANIFEST} is not a LEASH bank manifest")
            if manifest["version"] > VERSION:
                raise broken(f"format version {manifest['version']} is newer than this proxy reads ({VERSION})")
            stored_kind = manifest["kind"]
            stored = EncoderInfo(
                manifest["encoder"]["name"], str(manifest["encoder"]["model"]), int(manifest["encoder"]["dim"])
            )
            generation = int(manifest["generation"])
            count = int(manifest["count"])
            segments: list[dict[str, Any]] = manifest["files"]["segments"]
            index_file: dict[str, Any] | None = manifest["files"].get("index")
            index_info: dict[str, Any] = manifest.get("index") or {"type": "flat"}
            created = str(manifest.get("created") or _now())
            entries = [entry for segment in segments for entry in (segment["vectors"], segment["meta"])]
            entries += [index_file] if index_file else []
            names += [str(entry["name"]) for entry in entries]
            ends = [0] + [int(segment["end"]) for segment in segments]
            if [int(segment["start"]) for segment in segments] != ends[:-1] or ends[-1] != count:
                raise ValueError(f"segments {[(x['start'], x['end']) for x in segments]} do not cover 0..{count}")
            if index_file is not None and not 0 < int(index_file["count"]) <= count:
                raise ValueError(f"the index holds {index_file['count']} vectors of {count}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise broken(f"{MANIFEST} lacks or garbles a field ({exc!r})") from None

        if stored_kind != kind:
            raise BankMismatch(
                f"the bank in {directory} holds {stored_kind}s, not {kind}s — give each kind its own directory"
            )
        same_encoder = stored.name == encoder.name and stored.model == encoder.model
        # A dimension of 0 is "not known yet" on either side (an embedding endpoint not asked yet).
        if not same_encoder or (stored.dim and encoder.dim and stored.dim != encoder.dim):
            raise BankMismatch(
                f"the LEASH {kind} bank in {directory} was made by the {stored.describe()}, but the configured"
                f" encoder is the {encoder.describe()}: vectors of different encoders cannot be compared —"
                f" point leash.bank_dir elsewhere, or move {directory} aside to start a new bank"
            )
        info = EncoderInfo(encoder.name, encoder.model, stored.dim or encoder.dim)
        return cls(
            directory,
            kind,
            generation,
            count,
            segments,
            index_file,
            index_info,
            created,
            info,
            tuple(names),
            signature,
        )

    def broken(self, problem: str) -> BankError:
        return _broken(self.directory, self.kind, self.names, problem)

    def entries(self) -> list[dict[str, Any]]:
        found = [entry for segment in self.segments for entry in (segment["vectors"], segment["meta"])]
        return found + ([self.index_file] if self.index_file else [])

    def verify(self, entries: Sequence[dict[str, Any]]) -> None:
        """Every named file is a data file of the size and sha256 the manifest says."""
        for entry in entries:
            path = self.directory / str(entry["name"])
            if not _DATA_FILE.match(path.name):
                raise self.broken(f"{MANIFEST} names a file it may not: {path.name!r}")
            try:
                with path.open("rb") as handle:
                    digest = hashlib.file_digest(handle, "sha256").hexdigest()
                size = path.stat().st_size
            except OSError as exc:
                raise self.broken(f"{path.name} is unreadable ({exc.strerror or exc})") from None
            if size != entry.get("bytes") or digest != entry.get("sha256"):
                raise self.broken(f"{path.name} does not match the manifest (size or sha256 differs)")


def _broken(directory: Path, kind: Kind, names: Sequence[str], problem: str) -> BankError:
    return BankError(
        f"LEASH {kind} bank in {directory} cannot be loaded: {problem}. Files: {', '.join(names)}."
        f" Move them aside (e.g. `mv {directory} {directory}.broken`) to start a new bank;"
        " it is never replaced automatically"
    )
