"""LEASH banks in Postgres with pgvector: every replica's labels in one table, found by all.

`PgBank` is a `Bank` (the layers cannot tell): `add` inserts its rows at once (so `save` has
nothing left to do), `search` asks the database. A bank is a row of `banks` (`task` or `step`)
naming its encoder and dimension, fixed by its first vectors; vectors of another encoder or
dimension are refused, as by the files. Lookups use pgvector's HNSW index (m=32,
ef_construction=40, inner product on unit vectors: cosine), one per bank, a partial index over
`vector::vector(dim)` built when the dimension becomes known. Chosen over a FAISS copy kept in
each replica: a label written on one replica is a neighbour on every other at its next lookup,
with no cache to keep in sync, at the latency and recall `bench/store.py` measures
(docs/BENCHMARKS.md).

Each row's provenance (`calls/provenance.py`) is its `provenance` column (schema step 4); a row an
older replica wrote has none and reads as `UNKNOWN`.

The layers call these methods from worker threads (`aadd`, `asearch`), so this module speaks to
the database through one synchronous connection, behind the bank's lock.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from mcp_spec_proxy.leash.bank import Bank, Neighbour
from mcp_spec_proxy.leash.encoders import EncoderInfo, normalise_rows
from mcp_spec_proxy.leash.provenance import Provenance
from mcp_spec_proxy.leash.rows import checked_rows
from mcp_spec_proxy.leash.storage import SOURCES, BankError, BankMismatch, Kind, Label
from mcp_spec_proxy.store.migrations import LOCK_NAMESPACE

_NAME = re.compile(r"^[a-z]+$")
UNMIGRATED = (
    "its tables do not exist yet: run `mcp-spec-proxy store migrate` with this config (its `leash:` section"
    " asks for them; a replica with it also applies them at start)"
)
INDEX_LOCK = 3  # the advisory lock (in the schema's class) under which a bank's index is created
HNSW_M = 16  # pgvector's defaults; it requires ef_construction >= 2 * m
EF_CONSTRUCTION = 64
EF_SEARCH = 40


class PgBank(Bank):
    def __init__(self, dsn: str, *, kind: Kind, encoder: EncoderInfo, ef_search: int = EF_SEARCH) -> None:
        super().__init__(kind=kind, encoder=EncoderInfo(encoder.name, encoder.model, 0), ef_search=ef_search)
        self._dsn = dsn
        self._encoder = encoder
        self._conn_lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._registered = False  # the bank's row (its encoder and dimension) exists in `banks`
        if not _NAME.match(kind):
            raise ValueError(f"bank kind must be a plain word, got {kind!r}")
        self._check_encoder()

    @classmethod
    def opener(cls, dsn: str) -> Any:
        """`Bank.open`'s signature for `Leash.open`: the directory is not used, the database is."""

        def open_bank(directory: Path, *, kind: Kind, encoder: EncoderInfo, **_: Any) -> Bank:
            return cls(dsn, kind=kind, encoder=encoder)

        return open_bank

    # -- the connection ------------------------------------------------------------------------

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            try:
                conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=5)
            except psycopg.Error as exc:
                raise BankError(f"the {self.kind} bank cannot reach Postgres: {_first_line(exc)}") from None
            try:
                register_vector(conn)  # fails while the extension is not created (no migration yet)
            except psycopg.Error:
                conn.close()
                raise BankError(f"the {self.kind} bank in Postgres: {UNMIGRATED}") from None
            try:
                # Once per connection: a lookup is then one round trip (k above it takes its own SET).
                conn.execute(f"SET hnsw.ef_search = {int(self._ef_search)}")
            except psycopg.Error as exc:
                raise BankError(f"the {self.kind} bank cannot reach Postgres: {_first_line(exc)}") from None
            self._conn = conn
        return self._conn

    def _run(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._conn_lock:
            try:
                cursor = self._connection().execute(sql, args)
                return cursor.fetchall() if cursor.description else []
            except psycopg.Error as exc:
                raise BankError(f"the {self.kind} bank failed in Postgres: {_first_line(exc)}") from None

    def close(self) -> None:
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()

    # -- the bank's encoder --------------------------------------------------------------------

    def _check_encoder(self) -> None:
        """Adopt the stored encoder's dimension, or refuse a bank made by another encoder."""
        try:
            found = self._run("SELECT encoder, model, dim FROM banks WHERE name = %s", (self.kind,))
        except BankError as exc:
            if UNMIGRATED in exc.args[0]:
                return  # `check` on a database no replica has started on yet: an empty bank
            raise
        if not found:
            return
        self._registered = True
        name, model, dim = found[0]
        mine = self._encoder
        if (name, model) != (mine.name, mine.model) or (mine.dim and dim != mine.dim):
            stored = EncoderInfo(name, model, dim)
            raise BankMismatch(
                f"the {self.kind} bank in Postgres holds vectors of the {stored.describe()}, not of the"
                f" {mine.describe()}: configure that encoder, or clear the bank (DELETE FROM bank_vectors"
                f" WHERE bank = '{self.kind}'; DELETE FROM banks WHERE name = '{self.kind}')"
            )
        self._encoder = EncoderInfo(name, model, int(dim))

    def _fix_dimension(self, dim: int) -> None:
        """The first vectors fix the bank's encoder and dimension; its HNSW index is built for them."""
        info = self._encoder
        self._run(
            "INSERT INTO banks (name, encoder, model, dim, created) VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (name) DO NOTHING",
            (self.kind, info.name, info.model, dim, time.time()),
        )
        self._encoder = EncoderInfo(info.name, info.model, dim)
        self._check_encoder()
        create = (
            f"CREATE INDEX IF NOT EXISTS bank_vectors_{self.kind}_hnsw ON bank_vectors"
            f" USING hnsw ((vector::vector({int(self._encoder.dim)})) vector_ip_ops)"
            f" WITH (m = {HNSW_M}, ef_construction = {EF_CONSTRUCTION}) WHERE bank = '{self.kind}'"
        )
        # Two replicas creating the same index at once: IF NOT EXISTS does not make the second wait,
        # it fails on the catalog's unique name (and its labels were lost). One at a time, then.
        with self._conn_lock:
            try:
                conn = self._connection()
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_NAMESPACE, INDEX_LOCK))
                    conn.execute(create)
            except psycopg.Error as exc:
                raise BankError(f"the {self.kind} bank failed in Postgres: {_first_line(exc)}") from None

    # -- reading -------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return int(self._run("SELECT count(*) FROM bank_vectors WHERE bank = %s", (self.kind,))[0][0])

    def __len__(self) -> int:
        return self.count

    @property
    def approximate(self) -> bool:
        return True

    def search(self, vector: np.ndarray | Sequence[float], k: int = 10) -> list[Neighbour]:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if not self._encoder.dim:
            self._check_encoder()
            if not self._encoder.dim:
                return []  # no vector yet: nothing near anything
        query = self._query(vector)[0]
        dim = int(self._encoder.dim)
        with self._conn_lock:
            try:
                conn = self._connection()
                sql = (
                    f"SELECT id, label, source, metadata, provenance, (vector::vector({dim})) <#> %s AS distance"
                    f" FROM bank_vectors WHERE bank = %s ORDER BY (vector::vector({dim})) <#> %s LIMIT %s"
                )
                if k <= self._ef_search:
                    rows = conn.execute(sql, (query, self.kind, query, k)).fetchall()
                else:
                    with conn.transaction():
                        conn.execute(f"SET LOCAL hnsw.ef_search = {int(k)}")
                        rows = conn.execute(sql, (query, self.kind, query, k)).fetchall()
            except psycopg.Error as exc:
                raise BankError(f"the {self.kind} bank failed in Postgres: {_first_line(exc)}") from None
        # `<#>` is the negative inner product.
        return [
            Neighbour(int(i), -float(d), label, source, dict(meta or {}), Provenance.from_json(provenance))
            for i, label, source, meta, provenance, d in rows
        ]

    def labels_since(self, session: str, since: float) -> int:
        found = self._run(
            "SELECT count(*) FROM bank_vectors WHERE bank = %s AND provenance->>'session' = %s AND ts >= %s",
            (self.kind, session, since),
        )
        return int(found[0][0])

    def stats(self) -> dict[str, Any]:
        """What the bank holds; with the database unreachable or not migrated, that problem instead."""
        try:
            counts = dict(
                self._run("SELECT label, count(*) FROM bank_vectors WHERE bank = %s GROUP BY label", (self.kind,))
            )
            sources = dict(
                self._run("SELECT source, count(*) FROM bank_vectors WHERE bank = %s GROUP BY source", (self.kind,))
            )
            reporters = dict(
                self._run(
                    "SELECT coalesce(provenance->>'reporter', 'unknown'), count(*) FROM bank_vectors"
                    " WHERE bank = %s GROUP BY 1",
                    (self.kind,),
                )
            )
        except BankError as exc:
            return {"kind": self.kind, "store": "postgres", "encoder": self._encoder.as_json(), "error": str(exc)}
        return {
            "kind": self.kind,
            "directory": None,
            "store": "postgres",
            "encoder": self._encoder.as_json(),
            "count": sum(counts.values()),
            "successes": counts.get("success", 0),
            "failures": counts.get("failure", 0),
            "by_source": {source: sources.get(source, 0) for source in SOURCES},
            "by_reporter": reporters,
            "index": "pgvector-hnsw",
            "hnsw": {"m": HNSW_M, "ef_construction": EF_CONSTRUCTION, "ef_search": self._ef_search},
            "unsaved": False,
        }

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
        if not self._encoder.dim:
            self._check_encoder()
        checked = checked_rows(
            vectors, labels, source=source, metadata=metadata, dim=self._encoder.dim, provenance=provenance
        )
        if checked is None:
            return []
        matrix, label_list = checked.matrix, checked.labels
        dim = matrix.shape[1]
        texts = [json.dumps(m, ensure_ascii=False) if m else None for m in checked.metadata]
        if not self._registered:
            self._fix_dimension(dim)
        normalised = normalise_rows(matrix)
        now = time.time()
        rows = [
            (self.kind, self.kind, self._encoder.name, label, source, text, json.dumps(origin.as_json()), vector, now)
            for label, text, origin, vector in zip(label_list, texts, checked.provenance, normalised, strict=True)
        ]
        with self._conn_lock:
            try:
                conn = self._connection()
                with conn.transaction(), conn.cursor() as cursor:
                    cursor.executemany(
                        "INSERT INTO bank_vectors"
                        " (bank, kind, encoder, label, source, metadata, provenance, vector, ts)"
                        " VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s, %s) RETURNING id",
                        rows,
                        returning=True,
                    )
                    ids: list[int] = []
                    while True:
                        row = cursor.fetchone()
                        if row is not None:
                            ids.append(int(row[0]))
                        if not cursor.nextset():
                            break
            except psycopg.Error as exc:
                raise BankError(f"the {self.kind} bank failed in Postgres: {_first_line(exc)}") from None
        return ids

    def save(self) -> None:
        return None  # every row was committed by `add`

    def refresh(self) -> bool:
        return False  # every lookup reads the table itself

    def __repr__(self) -> str:
        return f"PgBank({self.kind}, {self._encoder.describe()})"


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, psycopg.errors.UndefinedTable):
        return UNMIGRATED
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
