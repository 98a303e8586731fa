"""Tool definition fingerprints, kept on disk: the rug-pull guard.

The first definition seen of each backend tool (description, input schema, annotations) is the
accepted one. A later, different definition makes the catalog hold the tool like a write until
the user runs `mcp-spec-proxy tools accept NAME`, which accepts the latest definition seen.
The file is rewritten crash-safely (temporary file, fsync, rename), so a proxy killed at any
moment leaves either the old or the new store, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import mcp_types as types

from mcp_spec_proxy.errors import StateError


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
    """`{"server/tool": {"accepted": sha, "latest": sha, "first_seen": t, "changed_at": t}}` on disk."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self.reload()

    def reload(self) -> None:
        if self.path is None or not self.path.exists():
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

    def observe(self, prints: dict[str, str]) -> None:
        """Record definitions just listed: new tools are accepted as first seen, changes noted."""
        dirty = False
        now = time.time()
        for key, sha in prints.items():
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = {"accepted": sha, "latest": sha, "first_seen": now}
                dirty = True
            elif entry.get("latest") != sha:
                entry["latest"] = sha
                entry["changed_at"] = now
                dirty = True
        if dirty:
            self._save()

    def changed(self, key: str, sha: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.get("accepted") != sha

    def pending(self) -> list[str]:
        """Keys whose latest definition differs from the accepted one."""
        return sorted(k for k, e in self._entries.items() if e.get("accepted") != e.get("latest"))

    def accept(self, key: str) -> bool:
        """Accept the latest definition of `key`; False if there was nothing to accept."""
        self.reload()
        entry = self._entries.get(key)
        if entry is None or entry.get("accepted") == entry.get("latest"):
            return False
        entry["accepted"] = entry["latest"]
        entry["accepted_at"] = time.time()
        self._save()
        return True

    def keys(self) -> list[str]:
        return sorted(self._entries)

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            write_atomic(self.path, json.dumps(self._entries, indent=1, sort_keys=True))
        except OSError as exc:
            raise StateError(f"cannot write fingerprint store {self.path}: {exc.strerror}") from None
