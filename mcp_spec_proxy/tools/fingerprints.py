"""Tool definition fingerprints, kept on disk: the rug-pull guard.

A server's first listing ever seen is accepted as it stands: each tool's definition
(description, input schema, annotations) is the accepted one. A later, different definition, or
a tool that first appears after that listing (list_changed, a reconnect with more tools), makes
the catalog hold the tool like a write until the user runs `mcp-spec-proxy tools accept NAME`,
which accepts the latest definition seen. Both are kept on disk, so a restart does not launder
them: a new tool stays new until accepted, whichever process lists it next.
The file is rewritten crash-safely (temporary file, fsync, rename), so a proxy killed at any
moment leaves either the old or the new store, never a torn one. Several processes may share it
(a proxy in each of two desktop apps, `tools accept` beside them): each change is made under the
file's lock (`<file>.lock`, flock) to the store as it is on disk then, so no process writes back
a copy that drops another's listings or acceptances — losing a server's first listing would let
its next listing be taken for a first one, and the tools it added be accepted unasked.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import mcp_types as types

from mcp_spec_proxy.errors import StateError

Status = Literal["accepted", "changed", "new"]

SERVERS = "@servers"
"""The store's one key that is not `server/tool`: the servers whose first listing was seen."""


def fingerprint(tool: types.Tool) -> str:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else None
    material = {"description": tool.description, "inputSchema": tool.input_schema, "annotations": annotations}
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a crash leaves the old or the new file, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class FingerprintStore:
    """`{"server/tool": {"accepted": sha, "latest": sha, "first_seen": t, "changed_at": t}}` on disk.

    A tool that appeared after its server's first listing has `"accepted": null` until accepted;
    `"@servers": {"server": {"first_listing": t}}` records which servers have been listed.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self._read_as: tuple[int, int, int] | None = None  # (inode, size, mtime) of the file last read or written
        self._listeners: list[Callable[[], None]] = []
        self.reload()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever the copy changes by the store's own doing (a shared store's
        merge or refresh, off the request path): the catalog then classifies its tools again."""
        self._listeners.append(listener)

    def _changed_by_itself(self) -> None:
        for listener in self._listeners:
            listener()

    async def refresh(self, *, settle: bool = False) -> None:
        """`reload`, as a request may ask for it (a tool under suspicion): never keeping the loop
        waiting on anything slower than a small file. A shared store waits a short bound, then
        serves its last copy; with `settle` (start-up, which may wait), up to its own timeout."""
        self.reload()

    def reload(self) -> None:
        """Read the store from disk again (nothing without a file, or while it is unchanged)."""
        if self.path is None:
            return
        try:
            found = self.path.stat()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateError(f"cannot read fingerprint store {self.path}: {exc.strerror}") from None
        if (found.st_ino, found.st_size, found.st_mtime_ns) == self._read_as:
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise StateError(
                f"fingerprint store {self.path} is unreadable ({exc}); move it aside to start over"
                " (every tool's current definition will then be accepted)"
            ) from None
        if not isinstance(data, dict):
            raise StateError(f"fingerprint store {self.path} is not a JSON object; move it aside to start over")
        self._entries = data
        self._read_as = (found.st_ino, found.st_size, found.st_mtime_ns)

    @contextmanager
    def _changing(self) -> Iterator[None]:
        """Hold the file's lock and start from the store on disk: the one way to change it."""
        if self.path is None:
            yield
            return
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            handle = lock.open("a")
        except OSError as exc:
            raise StateError(f"cannot lock fingerprint store {self.path}: {exc.strerror}") from None
        with handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                FingerprintStore.reload(self)
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def observe(self, prints: dict[str, str], *, server: str | None = None) -> None:
        """Record definitions just listed (`{"server/tool": sha}`).

        Tools of a server never listed before are accepted as first seen; a tool of a server
        listed before is new (held until accepted); changes are noted. `server` names the server
        whose whole listing `prints` is: from then on, that server has been listed (an empty
        listing counts too). A store written before listings were recorded gives each server one
        first listing more, as the store did before.
        """
        with self._changing():
            dirty = False
            now = time.time()
            listed = self._listed()
            for key, sha in prints.items():
                entry = self._entries.get(key)
                if entry is None:
                    accepted = None if key.split("/", 1)[0] in listed else sha
                    self._entries[key] = {"accepted": accepted, "latest": sha, "first_seen": now}
                    dirty = True
                elif entry.get("latest") != sha:
                    entry["latest"] = sha
                    entry["changed_at"] = now
                    dirty = True
            if server is not None and server not in listed:
                self._entries[SERVERS] = {**listed, server: {"first_listing": now}}
                dirty = True
            if dirty:
                self._save()

    def status(self, key: str, sha: str) -> Status:
        """`new` (never accepted, or never observed: fail closed), `changed`, or `accepted`."""
        entry = self._entries.get(key)
        if entry is None or entry.get("accepted") is None:
            return "new"
        return "accepted" if entry.get("accepted") == sha else "changed"

    def changed(self, key: str, sha: str) -> bool:
        return self.status(key, sha) == "changed"

    def is_new(self, key: str) -> bool:
        """Whether `key` was observed but never accepted (it appeared after its server's first listing)."""
        entry = self._entries.get(key)
        return entry is not None and entry.get("accepted") is None

    def pending(self) -> list[str]:
        """Keys whose latest definition differs from the accepted one (new tools included)."""
        return sorted(k for k, e in self._tool_entries() if e.get("accepted") != e.get("latest"))

    def accept(self, key: str) -> bool:
        """Accept the latest definition of `key`; False if there was nothing to accept."""
        with self._changing():
            entry = self._entries.get(key) if "/" in key else None
            if entry is None or entry.get("accepted") == entry.get("latest"):
                return False
            entry["accepted"] = entry["latest"]
            entry["accepted_at"] = time.time()
            self._save()
            return True

    def keys(self) -> list[str]:
        return sorted(key for key, _ in self._tool_entries())

    def _tool_entries(self) -> list[tuple[str, dict[str, Any]]]:
        return [(key, entry) for key, entry in self._entries.items() if "/" in key and isinstance(entry, dict)]

    def _listed(self) -> dict[str, Any]:
        servers = self._entries.get(SERVERS)
        return servers if isinstance(servers, dict) else {}

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            write_atomic(self.path, json.dumps(self._entries, indent=1, sort_keys=True))
            found = self.path.stat()
        except OSError as exc:
            raise StateError(f"cannot write fingerprint store {self.path}: {exc.strerror}") from None
        self._read_as = (found.st_ino, found.st_size, found.st_mtime_ns)
