"""A bank kept in a directory: loading it, picking up other processes' saves, saving it.

`PersistentBank` is the `Bank` (`bank.py`: rows, search, add, the HNSW switch) of `Bank.open`; its
files are `storage.py`'s (format, crash-safe generations, the lock). It promises:

- `open` loads what the manifest names, verified, or creates the bank with its manifest at once; a
  bank that does not load is a `BankError` naming its files, never replaced.
- `search()` and `add()` pick up a generation another process saved since (`refresh`): one `stat`
  of the manifest when nothing changed, then only the new rows are read. A newer generation that
  will not load is logged once and left alone: lookups go on with the rows already loaded, and
  `save()` refuses to write over it.
- `save()` first adopts whatever another process saved since: that process's rows come first and
  this one's unsaved rows follow them (so the ids `add` returned for unsaved rows may shift).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from mcp_spec_proxy.leash.bank import (
    EF_CONSTRUCTION,
    EF_SEARCH,
    HNSW_M,
    Bank,
    Recall,
    add_chunked,
    new_flat,
    stored_vectors,
)
from mcp_spec_proxy.leash.encoders import EncoderInfo
from mcp_spec_proxy.leash.storage import BankError, BankFiles, Kind, Manifest, MetaRow

logger = logging.getLogger(__name__)


class PersistentBank(Bank):
    """A `Bank` whose rows live in `directory` too; make one with `Bank.open`."""

    def __init__(
        self,
        directory: Path,
        *,
        kind: Kind,
        encoder: EncoderInfo,
        approximate_after: int | None,
        ef_search: int,
        created: str | None = None,
    ) -> None:
        super().__init__(kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search)
        self.directory = directory
        self._files = BankFiles(directory, kind, created)

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        kind: Kind,
        encoder: EncoderInfo,
        approximate_after: int | None = None,
        ef_search: int = EF_SEARCH,
    ) -> PersistentBank:
        """Load the bank in `directory`, or create it (manifest written at once) if there is none.

        Raises `BankMismatch` if it was made by another encoder or is of another kind, and
        `BankError` if it cannot be read. Loading verifies every file's size and sha256, and
        builds the HNSW graph if the bank is past `approximate_after` without one (seconds to
        minutes for a large bank: call it from a worker thread, or use `aopen`).
        """
        directory = Path(directory).expanduser()
        bank = cls(directory, kind=kind, encoder=encoder, approximate_after=approximate_after, ef_search=ef_search)
        if bank._files.exists():
            try:
                with bank._files.lock(shared=True):
                    return cls._load(directory, kind, encoder, approximate_after, ef_search)
            except OSError as exc:
                raise BankError(f"cannot lock LEASH bank directory {directory}: {exc.strerror or exc}") from None
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BankError(f"cannot create LEASH bank directory {directory}: {exc.strerror or exc}") from None
        bank.save()
        return bank

    @classmethod
    def _load(
        cls, directory: Path, kind: Kind, encoder: EncoderInfo, approximate_after: int | None, ef_search: int
    ) -> PersistentBank:
        """The bank in `directory` as its manifest says; the caller holds the directory's lock."""
        manifest = Manifest.read(directory, kind, encoder)
        manifest.verify(manifest.entries())
        bank = cls(
            directory,
            kind=kind,
            encoder=manifest.encoder,
            approximate_after=approximate_after,
            ef_search=ef_search,
            created=manifest.created,
        )
        files = bank._files
        files.adopt(manifest)
        try:
            bank._extend_meta(files.read_meta(manifest.segments))
            want_hnsw = manifest.count > bank.approximate_after
            hnsw = files.read_hnsw(manifest, ef_search) if want_hnsw else None
            if hnsw is not None and manifest.index_file is not None:
                bank._index, bank._approximate = hnsw, True
                bank._recall = Recall.from_json(manifest.index_info)
                # The graph is saved only now and then; the vectors added since join it here.
                bank._add_rows(manifest.index_file["count"])
            else:
                if manifest.encoder.dim:
                    bank._index = new_flat(manifest.encoder.dim)
                bank._add_rows(0)
            bank._dirty = False
            if want_hnsw and not bank._approximate:
                bank._go_approximate(private=True)
        except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError) as exc:
            raise manifest.broken(str(exc) or repr(exc)) from None
        files.abandoned = files.stray_files()
        if later := files.unfinished():
            logger.warning(
                "LEASH %s bank in %s: an unfinished save of generation %d left %s; loaded generation %d",
                kind,
                directory,
                manifest.generation + 1,
                ", ".join(later),
                manifest.generation,
            )
        return bank

    def _extend_meta(self, rows: list[MetaRow]) -> None:
        for label, source, metadata, _ in rows:
            self._labels.append(label)
            self._sources.append(source)
            self._metadata.append(metadata)
        self._keep_provenance([row[3] for row in rows])

    def _add_rows(self, first: int) -> None:
        """Add the stored vectors from id `first` on to the index, segment by segment."""
        for start, vectors in self._files.read_rows(self._files.segments, first, self._encoder.dim):
            add_chunked(self._index, vectors, start)
            del vectors

    # -- other processes -----------------------------------------------------------------------

    def refresh(self) -> bool:
        """Pick up the rows another process saved since this bank last read or wrote; True if any came.

        One `stat` when nothing changed. With rows added here and not saved yet it waits: `save()`
        merges. A newer generation that will not load is logged once and ignored (see the module
        docstring). `search()` and `add()` call this themselves.
        """
        files = self._files
        signature = files.changed()
        if signature is None:
            return False
        try:
            with files.lock(shared=True), self._lock:
                if self._pending():
                    return False
                before = len(self._labels)
                self._catch_up()
                return len(self._labels) > before
        except (BankError, OSError) as exc:
            self._files.bad_signature = signature
            logger.warning(
                "LEASH %s bank in %s: a generation saved by another process was not picked up (%s);"
                " lookups go on with the %d vectors loaded",
                self.kind,
                self.directory,
                exc,
                len(self._labels),
            )
            return False

    def _pending(self) -> bool:
        """Rows added here that no generation on disk holds yet."""
        return len(self._labels) > self._files.saved

    def _catch_up(self) -> None:
        """Adopt the generation on disk if another process saved one. Holds both locks.

        Only the new rows are read when this bank's rows are a prefix of the disk's (the bank was
        not replaced) and none is unsaved here; otherwise the bank is loaded afresh and the unsaved
        rows are added after the disk's.
        """
        files = self._files
        manifest = files.newer(self._encoder)
        if manifest is None:
            return
        saved = files.saved
        if self._pending() or manifest.created != files.created or manifest.count < saved:
            self._reload()
            return
        # Rows 0..saved are the same on disk (every save adopts the one before it): read the rest.
        meta, rows = files.read_since(manifest, saved)
        if self._index is None and manifest.encoder.dim:
            self._encoder = manifest.encoder
            self._index = new_flat(manifest.encoder.dim)
        for start, vectors in rows:
            add_chunked(self._index, vectors, start)
        self._extend_meta(meta)
        files.adopt(manifest, keep_index=self._approximate)
        logger.debug("LEASH %s bank: picked up %d rows of generation %d", self.kind, len(meta), files.generation)

    def _reload(self) -> None:
        """Become the bank on disk, with this bank's unsaved rows added after its rows.

        Rows this bank saved before are not carried over: if they are not on disk, the bank was
        moved aside and started anew on purpose.
        """
        saved = self._files.saved
        count = len(self._labels)
        unsaved = stored_vectors(self._index, self._encoder.dim)[saved:count].copy() if count > saved else None
        fresh = PersistentBank._load(
            self._files.directory, self.kind, self._encoder, self._approximate_after, self._ef_search
        )
        if unsaved is not None:
            if fresh._index is None:
                fresh._encoder = self._encoder
                fresh._index = new_flat(self._encoder.dim)
            add_chunked(fresh._index, unsaved, len(fresh._labels))
            fresh._labels.extend(self._labels[saved:])
            fresh._sources.extend(self._sources[saved:])
            fresh._metadata.extend(self._metadata[saved:])
            fresh._keep_provenance(self._provenance[saved:])
            fresh._dirty = True
        fresh._files.bad_signature = self._files.bad_signature
        for name in [
            "_encoder",
            "_index",
            "_approximate",
            "_labels",
            "_sources",
            "_metadata",
            "_provenance",
            "_by_session",
            "_recall",
            "_dirty",
            "_files",
        ]:
            setattr(self, name, getattr(fresh, name))
        logger.debug(
            "LEASH %s bank in %s: reloaded generation %d saved by another process (%d rows, %d of them unsaved here)",
            self.kind,
            self.directory,
            fresh._files.generation,
            len(self._labels),
            count - saved,
        )

    def save(self) -> None:
        """Write a new generation crash-safely (see `storage.py`); nothing to do if unchanged.

        A generation another process saved meanwhile is adopted first (its rows, then this one's).
        Raises `BankError` if the disk refuses or that generation will not load; on any failure the
        generation on disk stays and loads.
        """
        if not self._dirty:
            return
        try:
            with self._files.lock(), self._lock:
                if not self._dirty:
                    return
                self._catch_up()
                files = self._files  # `_catch_up` may have replaced it
                dim = self._encoder.dim
                index_info: dict[str, Any] = {"type": "flat"}
                if self._approximate:
                    index_info = {
                        "type": "hnsw",
                        "m": HNSW_M,
                        "ef_construction": EF_CONSTRUCTION,
                        "ef_search": self._ef_search,
                    }
                    index_info |= self._recall.as_json() if self._recall is not None else {}
                files.write(
                    encoder=self._encoder,
                    vectors=np.zeros((0, 0)) if self._index is None else stored_vectors(self._index, dim),
                    labels=self._labels,
                    sources=self._sources,
                    metadata=self._metadata,
                    provenance=self._provenance,
                    index=self._index if self._approximate else None,
                    index_info=index_info,
                )
                self._dirty = False
                files.remove_strays()
        except OSError as exc:
            raise BankError(
                f"cannot save LEASH {self.kind} bank in {self.directory}: {exc.strerror or exc};"
                f" generation {self._files.generation} is still the one on disk"
            ) from None

    def _disk_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"generation": self._files.generation}
        if self._files.abandoned:
            stats["abandoned_files"] = list(self._files.abandoned)
        return stats
