"""Whether a backend's tool is a read or a write, and why: the first rule that speaks wins.

1. a definition that changed since it was first seen  → write, until `tools accept NAME`
2. a tool that appeared after its server's first
   listing (list_changed, a reconnect)                → write, until `tools accept NAME`
3. a config override with `hold: true`                → write
4. a config override with `read_only: true|false`     → read / write
5. `readOnlyHint: true` from an untrusted server      → write
6. `readOnlyHint: true` with `destructiveHint: true`  → write (the annotations contradict)
7. `readOnlyHint: true` and `openWorldHint: true`
   under `hold_open_world` (server, else top level)   → write (reason `hold`)
8. `readOnlyHint: true` from a trusted server         → read
9. anything else (unannotated, `readOnlyHint: false`) → write

"""

from __future__ import annotations

import fnmatch
from typing import Literal

import mcp_types as types

from mcp_spec_proxy.config.schema import ServerConfig, ToolOverride
from mcp_spec_proxy.tools.fingerprints import Status
from mcp_spec_proxy.trajectory import Effect

Reason = Literal["changed-definition", "new-tool", "hold", "override", "annotation", "default"]
HELD_REASONS = ("changed-definition", "new-tool")
"""Why a tool is held (rules 1 and 2): it runs for no one, by no author, until `tools accept`."""


def _override(server: ServerConfig, tool: str) -> tuple[str, ToolOverride] | None:
    for pattern, rule in server.tools.overrides.items():
        if fnmatch.fnmatchcase(tool, pattern):
            return pattern, rule
    return None


def included(server: ServerConfig, tool: str) -> bool:
    tools = server.tools
    return any(fnmatch.fnmatchcase(tool, p) for p in tools.include) and not any(
        fnmatch.fnmatchcase(tool, p) for p in tools.exclude
    )


def classify(
    server: ServerConfig, tool: types.Tool, *, status: Status = "accepted", hold_open_world: bool = False
) -> tuple[Effect, Reason, str, ToolOverride | None]:
    """The effect of one tool, the rule that decided it and why (the module docstring's list).

    `status` is the fingerprint store's word on its definition; `hold_open_world` the setting in
    force for its server (the server's own, else the top-level one).
    """
    matched = _override(server, tool.name)
    rule = matched[1] if matched else None
    if status == "changed":
        return "write", "changed-definition", "definition changed since first seen; accept it with `tools accept`", rule
    if status == "new":
        why = "tool appeared after its server's first listing; accept it with `tools accept`"
        return "write", "new-tool", why, rule
    if matched and rule and rule.hold:
        return "write", "hold", f"override {matched[0]!r}: hold", rule
    if matched and rule and rule.read_only is not None:
        effect: Effect = "read" if rule.read_only else "write"
        return effect, "override", f"override {matched[0]!r}: read_only: {str(rule.read_only).lower()}", rule
    annotations = tool.annotations
    hint = annotations.read_only_hint if annotations else None
    if hint is True and not server.trust_annotations:
        return "write", "default", "readOnlyHint ignored: trust_annotations is false", rule
    if hint is True and annotations and annotations.destructive_hint is True:
        return "write", "annotation", "readOnlyHint: true contradicts destructiveHint: true; held as a write", rule
    if hint is True and hold_open_world and annotations and annotations.open_world_hint:
        return "write", "hold", "readOnlyHint: true but openWorldHint: true, and hold_open_world is true", rule
    if hint is True:
        return "read", "annotation", "readOnlyHint: true", rule
    if hint is False:
        return "write", "annotation", "readOnlyHint: false", rule
    return "write", "default", "no readOnlyHint: unannotated tools are writes", rule


__all__ = ["HELD_REASONS", "Reason", "classify", "included"]
