"""Crash-safe writes of a bank's data files: a temporary file, fsynced, then renamed into place.

What `storage.py` writes every segment and index with: the name, size and sha256 of a file come
from the bytes as they were written (the manifest records them, and loading checks them).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


class HashingWriter:
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


def write_file_atomic(path: Path, fill: Callable[[HashingWriter], object]) -> dict[str, Any]:
    """`write_atomic` for binary content streamed by `fill`: temp file, fsync, rename. Name, size, sha256."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            writer = HashingWriter(handle)
            fill(writer)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"name": path.name, "bytes": writer.size, "sha256": writer.sha256.hexdigest()}


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["HashingWriter", "fsync_dir", "write_file_atomic"]
