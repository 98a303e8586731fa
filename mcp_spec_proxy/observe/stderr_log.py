"""A stdio backend's stderr, kept in `logs/<server>.log` within a size bound.

Used by the backend pool's connections and by `prespawn.py` (which runs before the SDK is imported,
so this module imports nothing of it).

The child writes into a pipe, and a thread of the proxy's copies what arrives to the file, so
neither the event loop nor the backend waits on the disk (a backend's write waits only while
the pipe's buffer is full, which the thread empties as fast as it can write). When a chunk would
take the file past `MAX_BYTES`, the file is rotated first — `<server>.log` becomes
`<server>.log.1` (and so on up to `KEEP`; the oldest is dropped) — and the chunk starts the new
file, after the old file's last line is finished (so no line is cut in two): the newest lines
are always in `<server>.log`, and each of a server's `KEEP + 1` files holds at most `MAX_BYTES`
and the end of one line (at most one 64 KiB chunk more).

The file is opened for each chunk and the size read from it, not remembered: a process spawned at
launch (`prespawn.py`) and the connection that adopts it each hold a `StderrLog` of the same path,
and whichever writes sees the other's rotations.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from pathlib import Path

MAX_BYTES = 5_000_000
"""Size at which `<server>.log` is rotated."""
KEEP = 1
"""Rotated files kept beside it: `<server>.log.1` … `<server>.log.<KEEP>`."""
_CHUNK = 65536
_DRAIN_TIMEOUT_S = 1.0


class StderrLog(io.TextIOWrapper):
    """The write end of a backend's stderr pipe (what `Popen` and the SDK's spawn take as
    `stderr`), named for the log file it ends in (`name`: what `prespawn.SpawnKey` compares)."""

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, keep: int = KEEP) -> None:
        read_fd, write_fd = os.pipe()
        super().__init__(io.FileIO(write_fd, "w"), encoding="utf-8", line_buffering=True)
        self._path = path
        self._pump = threading.Thread(
            target=_pump, args=(read_fd, path, max_bytes, keep), name=f"stderr of {path.stem}", daemon=True
        )
        self._pump.start()

    @property
    def name(self) -> str:  # the log file's path, not the pipe's descriptor
        return str(self._path)

    def close(self) -> None:
        """Close the proxy's end of the pipe: once every child holding it has exited too, the
        thread writes what is left and ends (`drain` waits for that)."""
        with contextlib.suppress(OSError):
            super().close()

    def drain(self, timeout: float = _DRAIN_TIMEOUT_S) -> None:
        """Wait, a bounded while, for the thread to have written everything: a grandchild that
        keeps the pipe open must not hold up the proxy. Blocking: call it off the event loop."""
        if self._pump is not threading.current_thread():
            self._pump.join(timeout)


def _pump(read_fd: int, path: Path, max_bytes: int, keep: int) -> None:
    with open(read_fd, "rb", buffering=0, closefd=True) as pipe:
        while chunk := pipe.read(_CHUNK):
            # A full or vanished disk: the backend keeps running, its stderr unkept.
            with contextlib.suppress(OSError):
                _append(path, chunk, max_bytes, keep)


def _append(path: Path, chunk: bytes, max_bytes: int, keep: int) -> None:
    with path.open("ab") as log:
        size = log.tell()
        if size == 0 or size + len(chunk) <= max_bytes:
            log.write(chunk)
            return
        # The old file's last line is finished there, so no line is cut across two files.
        cut = chunk.find(b"\n") + 1
        log.write(chunk[:cut])
        chunk = chunk[cut:]
    _rotate(path, keep)
    if not chunk:
        return
    with path.open("ab") as log:
        log.write(chunk)


def _rotate(path: Path, keep: int) -> None:
    if keep < 1:
        path.unlink(missing_ok=True)
        return
    for n in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{n + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


__all__ = ["KEEP", "MAX_BYTES", "StderrLog", "last_error_line"]


def last_error_line(path: Path, start: int) -> str:
    """What a log says went wrong since `start` (where an attempt began), named, cut to 200
    characters: the exception line of its last Python traceback ("error: ..."), else its last
    non-blank line ("last stderr line: ...") — a traceback's last line can be the end of a long
    help text (GitPython's ends `export GIT_PYTHON_REFRESH=quiet`)."""
    try:
        with path.open("rb") as log:
            # A rotation since the attempt began leaves a shorter file.
            log.seek(start if start <= path.stat().st_size else 0)
            tail = log.read()[-8192:]
    except OSError:
        return ""
    raw = tail.decode(errors="replace").splitlines()
    starts = [i for i, line in enumerate(raw) if line.startswith("Traceback (most recent call last):")]
    if starts:
        error = next((line for line in raw[starts[-1] + 1 :] if line.strip() and not line[0].isspace()), "")
        if error:
            return f"error: {error.strip()[:200]}"
    lines = [line.strip() for line in raw if line.strip()]
    return f"last stderr line: {lines[-1][:200]}" if lines else ""
