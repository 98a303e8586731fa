"""A LEASH bank's files: the on-disk format, its generations, crash-safe writes, the cross-process lock.

The only code that reads or writes a bank directory (`persistent.py` calls it; each file is
written crash-safely by `atomic.py`). It promises:

Format (directory per bank). `bank.json`, the manifest (kind, encoder, count, generation, and the
name, size and sha256 of every data file); segments of rows, each a `vectors-G.npy` (float32, one
unit vector a row) and a `meta-G.jsonl` (one `{"id", "label", "source", "metadata", "provenance"}`
per line: `calls/provenance.py`) written by save number G; and, for an HNSW bank, `index-G.faiss`. A
save writes only the rows added since the last one, as a new segment that absorbs the segments
before it no longer than itself (a binary counter: O(log n) segments, each row rewritten O(log n)
times), and rewrites the HNSW graph only once an eighth of it is new (loading adds the rest).

Provenance came with the format unchanged in version: a meta line without `provenance` (a bank
saved before it, or a segment an older proxy rewrote) loads as `UNKNOWN`, and an older proxy
reads these files and ignores the field.

Crash safety. Every file goes to a temporary file that is fsynced and renamed, and the manifest
goes LAST, so a process killed at any moment leaves the manifest naming a complete earlier
generation, which loads. Files of an unfinished save are reported (`abandoned`) and removed by the
next successful one. Loading verifies every named file's size and sha256. A bank that does not
load is a `BankError` naming the files, never silently replaced; a bank made by another encoder,
or of the other kind, is `BankMismatch`.

Processes. Several processes may share a directory. Its lock file `.lock` is held (`flock`)
exclusively while a generation is written and shared while one is read, so nobody reads files
that a save is replacing. `changed()` (one `stat`), `newer()` and `read_since()` hand a bank the
rows another process saved since, which it merges (`persistent.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import faiss
import numpy as np

from mcp_spec_proxy.leash.atomic import HashingWriter, fsync_dir, write_file_atomic
from mcp_spec_proxy.leash.encoders import EncoderInfo, LeashError
from mcp_spec_proxy.leash.provenance import Provenance
from mcp_spec_proxy.tools.fingerprints import write_atomic

# The row vocabulary is the file format's: `bank.py` re-exports it.
Label = Literal["success", "failure"]
Kind = Literal["task", "step", "observed"]  # observed: steps no weak call drafted, under `hidden` (layers.py)
KINDS: tuple[Kind, ...] = ("task", "step", "observed")
Source = Literal["verdict", "outcome", "import"]
LABELS: tuple[Label, ...] = ("success", "failure")
SOURCES: tuple[Source, ...] = ("verdict", "outcome", "import")

FORMAT = "mcp-spec-proxy-leash-bank"
VERSION = 1
MANIFEST = "bank.json"
_DATA_FILE = re.compile(r"^\.?(vectors|meta|index)-(\d{6,})\.(npy|jsonl|faiss)(\..*)?$")

Signature = tuple[int, int, int]
MetaRow = tuple[int, int, dict[str, Any] | None, Provenance]
"""A row as the bank keeps it: LABELS and SOURCES codes, metadata, who labelled it."""


class BankError(LeashError):
    """A bank cannot be loaded or saved; the message names the files and what to do."""


class BankMismatch(BankError):
    """The bank on disk was made by another encoder (or is of another kind) than the one configured."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def signature(path: str | Path) -> Signature | None:
    """What changes whenever a manifest is replaced (it is renamed into place: a new inode)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


@dataclass(frozen=True)
class Manifest:
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
    def read(cls, directory: Path, kind: Kind, encoder: EncoderInfo) -> Manifest:
        """Parse and check the manifest; `BankError` if it will not do, `BankMismatch` if another encoder made it."""
        manifest_path = directory / MANIFEST
        names = [MANIFEST]

        def broken(problem: str) -> BankError:
            return _broken(directory, kind, names, problem)

        found = signature(manifest_path)
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
            created = str(manifest.get("created") or now())
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
            directory, kind, generation, count, segments, index_file, index_info, created, info, tuple(names), found
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


class BankFiles:
    """One bank directory and the generation of it that this process last read or wrote.

    Not thread-safe by itself: the bank calls it under its own lock, after taking `lock()`.
    """

    def __init__(self, directory: Path, kind: Kind, created: str | None = None) -> None:
        self.directory = directory
        self.kind: Kind = kind
        self.created = created or now()
        self.generation = 0
        self.segments: list[dict[str, Any]] = []  # committed: {"start", "end", "vectors": file, "meta": file}
        self.index_file: dict[str, Any] | None = None  # committed HNSW graph: file and the "count" it holds
        self.signature: Signature | None = None  # of the manifest last read or written here
        self.abandoned: list[str] = []  # files of an unfinished save, found at load
        self.bad_signature: Signature | None = None  # of a newer manifest that would not load (logged)
        # Checked before every lookup: kept as a string, a stat of it costs about a microsecond.
        self._manifest = str(directory / MANIFEST)

    @property
    def saved(self) -> int:
        """Rows held by the committed generation."""
        return self.segments[-1]["end"] if self.segments else 0

    def exists(self) -> bool:
        try:
            return (self.directory / MANIFEST).exists()
        except OSError as exc:
            raise BankError(f"cannot look for a LEASH bank in {self.directory}: {exc}") from None

    @contextmanager
    def lock(self, *, shared: bool = False) -> Iterator[None]:
        """Hold the directory's lock file: exclusive to write a generation, shared to read one.

        `flock` belongs to the open file, so two banks of one process exclude each other as two
        processes do. Take it before the bank's thread lock, never while holding that.
        """
        path = self.directory / ".lock"
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

    # -- reading -------------------------------------------------------------------------------

    def changed(self) -> Signature | None:
        """The manifest's signature if another process replaced it since (and it is not known bad)."""
        found = signature(self._manifest)
        if found is None or found in (self.signature, self.bad_signature):
            return None
        return found

    def adopt(self, manifest: Manifest, *, keep_index: bool = True) -> None:
        """Make `manifest` the committed generation (its rows are now in the bank)."""
        self.generation = manifest.generation
        self.segments = manifest.segments
        self.index_file = manifest.index_file if keep_index else None
        self.signature = manifest.signature
        self.created = manifest.created

    def newer(self, encoder: EncoderInfo) -> Manifest | None:
        """The manifest on disk if it is another generation than the committed one. Hold `lock()`."""
        if not (self.directory / MANIFEST).exists():
            if self.generation:
                raise BankError(
                    f"LEASH {self.kind} bank manifest {self.directory / MANIFEST} disappeared after this bank"
                    " was loaded; not writing a new bank over the rest of its files — move the directory aside"
                    " and restart"
                )
            return None
        manifest = Manifest.read(self.directory, self.kind, encoder)
        if manifest.generation == self.generation and manifest.created == self.created:
            self.signature = manifest.signature
            return None
        return manifest

    def read_meta(self, segments: Sequence[dict[str, Any]], first: int = 0) -> list[MetaRow]:
        """The metadata rows from id `first` on, read from the meta files of `segments`."""
        return [
            row
            for segment in segments
            if segment["end"] > first
            for row in _read_meta(self.directory / segment["meta"]["name"], segment["start"], segment["end"], first)
        ]

    def read_rows(self, segments: Sequence[dict[str, Any]], first: int, dim: int) -> list[tuple[int, np.ndarray]]:
        """(first id, vectors) of the stored rows from id `first` on, mapped from their segment files."""
        found: list[tuple[int, np.ndarray]] = []
        for segment in segments:
            start, end = segment["start"], segment["end"]
            if end <= first:
                continue
            path = self.directory / segment["vectors"]["name"]
            # Mapped, not read: the index copies it in chunks, so a big bank is never in memory twice.
            vectors = np.load(path, mmap_mode="r", allow_pickle=False)
            if vectors.dtype != np.float32 or vectors.shape != (end - start, dim):
                raise ValueError(
                    f"{path.name} holds {vectors.dtype} {vectors.shape}, expected float32 ({end - start}, {dim})"
                )
            skip = max(0, first - start)
            found.append((start + skip, vectors[skip:]))
        return found

    def read_since(self, manifest: Manifest, first: int) -> tuple[list[MetaRow], list[tuple[int, np.ndarray]]]:
        """Metadata and vectors of the rows of `manifest` from id `first` on, their files verified."""
        new = [segment for segment in manifest.segments if segment["end"] > first]
        manifest.verify([entry for segment in new for entry in (segment["vectors"], segment["meta"])])
        try:
            return self.read_meta(new, first), self.read_rows(manifest.segments, first, manifest.encoder.dim)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise manifest.broken(str(exc) or repr(exc)) from None

    def read_hnsw(self, manifest: Manifest, ef_search: int) -> Any | None:
        """The saved HNSW graph of `manifest` (efSearch set), or None if it has none."""
        entry = manifest.index_file
        if entry is None or manifest.index_info.get("type") != "hnsw":
            return None
        path, count, dim = self.directory / entry["name"], entry["count"], manifest.encoder.dim
        index = faiss.read_index(str(path))
        inner = faiss.downcast_index(index.index) if hasattr(index, "index") else None
        if not isinstance(inner, faiss.IndexHNSW) or index.ntotal != count or index.d != dim:
            raise ValueError(f"{path.name} is not an HNSW index of {count} vectors of {dim} dims")
        inner.hnsw.efSearch = ef_search
        return index

    # -- writing -------------------------------------------------------------------------------

    def write(
        self,
        *,
        encoder: EncoderInfo,
        vectors: np.ndarray,
        labels: array[int],
        sources: array[int],
        metadata: Sequence[dict[str, Any] | None],
        provenance: Sequence[Provenance],
        index: Any | None,
        index_info: dict[str, Any],
    ) -> None:
        """Commit the next generation: the rows past `saved` (of `vectors`, one per label), the HNSW
        graph `index` when it is due, then the manifest. Hold `lock()`; `OSError` if the disk refuses."""
        directory, generation, count = self.directory, self.generation + 1, len(labels)
        segments = list(self.segments)
        if count > self.saved:
            # Binary-counter merging: a new segment at least as long as the one before it absorbs it.
            start = self.saved
            while segments and count - start >= segments[-1]["end"] - segments[-1]["start"]:
                start = segments.pop()["start"]
            rows = vectors[start:count]
            vectors_file = write_file_atomic(
                directory / f"vectors-{generation:06d}.npy",
                lambda out: np.lib.format.write_array(out, rows, allow_pickle=False),
            )
            meta_file = write_file_atomic(
                directory / f"meta-{generation:06d}.jsonl",
                lambda out: _write_meta(out, labels, sources, metadata, provenance, start, count),
            )
            segments.append({"start": start, "end": count, "vectors": vectors_file, "meta": meta_file})
        index_file = None
        if index is not None:
            index_file = self.index_file
            # The graph is rewritten whole, so only when an eighth or more of it is new; loading adds the rest.
            if index_file is None or (count - index_file["count"]) * 8 >= index_file["count"]:
                blob = faiss.serialize_index(index)
                index_file = write_file_atomic(directory / f"index-{generation:06d}.faiss", lambda out: out.write(blob))
                index_file["count"] = count
        # The data files' names must be durable before a manifest can point at them.
        fsync_dir(directory)
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "kind": self.kind,
            "encoder": encoder.as_json(),
            "generation": generation,
            "count": count,
            "created": self.created,
            "saved": now(),
            "index": index_info,
            "files": {"segments": segments, **({"index": index_file} if index_file else {})},
        }
        write_atomic(directory / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        fsync_dir(directory)
        self.generation = generation
        self.segments = segments
        self.index_file = index_file
        self.signature = signature(directory / MANIFEST)
        self.abandoned = []

    def stray_files(self) -> list[str]:
        """Data and temporary files in the directory that the committed manifest does not name."""
        keep = {entry["name"] for segment in self.segments for entry in (segment["vectors"], segment["meta"])}
        if self.index_file is not None:
            keep.add(self.index_file["name"])
        try:
            names = sorted(entry.name for entry in os.scandir(self.directory) if entry.is_file())
        except OSError:
            return []
        temporary = f".{MANIFEST}."
        return [name for name in names if (_DATA_FILE.match(name) or name.startswith(temporary)) and name not in keep]

    def remove_strays(self) -> None:
        """Remove the leftovers of unfinished saves. Only under the exclusive lock: then nobody
        else's save is half-written, so what the manifest does not name is stray."""
        with contextlib.suppress(OSError):
            for name in self.stray_files():
                (self.directory / name).unlink(missing_ok=True)

    def unfinished(self) -> list[str]:
        """Stray files that a save of a later generation than the committed one left."""
        matches = [(name, _DATA_FILE.match(name)) for name in self.abandoned]
        return [name for name, match in matches if match and int(match.group(2)) > self.generation]


def _write_meta(
    out: HashingWriter,
    labels: array[int],
    sources: array[int],
    metadata: Sequence[dict[str, Any] | None],
    provenance: Sequence[Provenance],
    start: int,
    end: int,
) -> None:
    lines: list[str] = []
    for position in range(start, end):
        record = {
            "id": position,
            "label": LABELS[labels[position]],
            "source": SOURCES[sources[position]],
            "metadata": metadata[position] or {},
            "provenance": provenance[position].as_json(),
        }
        lines.append(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
        if len(lines) >= 4096:
            out.write("".join(lines).encode())
            lines.clear()
    out.write("".join(lines).encode())


def _read_meta(path: Path, start: int, end: int, first: int = 0) -> list[MetaRow]:
    """The rows `max(first, start)`..`end` of a meta file holding `start`..`end`."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) != end - start:
        raise ValueError(f"{path.name} has {len(lines)} entries, the manifest says {end - start}")
    rows: list[MetaRow] = []
    for position, line in enumerate(lines, start):
        if position < first:
            continue
        record = json.loads(line)
        if record.get("id") != position:
            raise ValueError(f"{path.name}: id {record.get('id')!r} where {position} belongs")
        metadata = record.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ValueError(f"{path.name}: metadata of id {position} is not an object")
        provenance = Provenance.from_json(record.get("provenance"))
        rows.append((LABELS.index(record["label"]), SOURCES.index(record["source"]), metadata or None, provenance))
    return rows


def _broken(directory: Path, kind: Kind, names: Sequence[str], problem: str) -> BankError:
    return BankError(
        f"LEASH {kind} bank in {directory} cannot be loaded: {problem}. Files: {', '.join(names)}."
        f" Move them aside (e.g. `mv {directory} {directory}.broken`) to start a new bank;"
        " it is never replaced automatically"
    )
