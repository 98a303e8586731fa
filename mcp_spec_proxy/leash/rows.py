"""The rows a bank is given to store, checked once for every bank (FAISS files or pgvector)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcp_spec_proxy.leash.provenance import Provenance
from mcp_spec_proxy.leash.storage import LABELS, SOURCES, Label


@dataclass(frozen=True)
class Rows:
    """Rows for a bank, checked: an (n, dim) finite matrix, one label, one metadata (as its JSON
    round trip) and one provenance per row."""

    matrix: np.ndarray
    labels: list[Label]
    metadata: list[dict[str, Any] | None]
    provenance: list[Provenance]


def checked_rows(
    vectors: np.ndarray | Sequence[Sequence[float]],
    labels: Label | Sequence[Label],
    *,
    source: str,
    metadata: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
    dim: int,
    provenance: Provenance | Sequence[Provenance] | None = None,
) -> Rows | None:
    """What `add` was given, checked the same way by every bank (FAISS or pgvector); None for no
    rows. `dim` 0 takes any width; no `provenance` is `Provenance.of(source)`. A `ValueError`
    names what is wrong."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim == 1:
        matrix = matrix[None, :]
    if matrix.ndim != 2:
        raise ValueError(f"add takes an (n, dim) array, got shape {matrix.shape}")
    count = matrix.shape[0]
    if count == 0:
        return None
    if dim and matrix.shape[1] != dim:
        raise ValueError(f"vectors have {matrix.shape[1]} dims, this bank holds {dim}")
    if matrix.shape[1] == 0 or not np.isfinite(matrix).all():
        raise ValueError("vectors must be finite and non-empty")
    label_list: list[Label] = [labels] * count if isinstance(labels, str) else list(labels)
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
    if provenance is None or isinstance(provenance, Provenance):
        provenance_list = [provenance or Provenance.of(source)] * count
    else:
        provenance_list = list(provenance)
    if len(provenance_list) != count or not all(isinstance(p, Provenance) for p in provenance_list):
        raise ValueError(f"provenance must be one Provenance per vector ({count})")
    return Rows(matrix, label_list, stored, provenance_list)
