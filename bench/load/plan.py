"""What each session of a level does: its calls in order, a fifth of them reviewed writes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_spec_proxy.tools.catalog import digest

ERAS = ("legacy", "2026-07-28")
WRITE_EVERY = 5  # every 5th call is a write: 20 %
CALL_TIMEOUT_S = 60.0  # a client gives up on a call after this; the proxy's review timeout is shorter
READS = ("fs__read_text_file", "memory__search_nodes", "fs__read_text_file", "memory__read_graph")


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]

    @property
    def is_write(self) -> bool:
        return "intent" in self.arguments

    def forwarded_digest(self) -> str:
        """The proxy audits the arguments the backend gets: the call's, less `intent`."""
        return digest({k: v for k, v in self.arguments.items() if k != "intent"})


@dataclass(frozen=True)
class Plan:
    level: int
    session: int
    era: str
    calls: list[Call]

    @property
    def tag(self) -> str:
        return f"L{self.level}-s{self.session}"


def plan(level: int, session: int, calls: int, root: Path, notes: Path) -> Plan:
    tag = f"L{level}-s{session}"
    own_file = str(root / f"session-{tag}.txt")
    steps: list[Call] = []
    writes = reads = 0
    for n in range(calls):
        if n % WRITE_EVERY == WRITE_EVERY - 1:
            token = uuid.uuid4().hex
            if writes % 2 == 0:
                content = f"{tag} write {writes}: {token}\n"
                intent = f"the user asked to save note {writes} of session {tag}"
                steps.append(Call("fs__write_file", {"path": own_file, "content": content, "intent": intent}))
            else:
                entity = {"name": f"{tag}-w{writes}", "entityType": "bench", "observations": [token]}
                intent = f"the user asked to remember item {writes} of session {tag}"
                steps.append(Call("memory__create_entities", {"entities": [entity], "intent": intent}))
            writes += 1
            continue
        tool = READS[reads % len(READS)]
        reads += 1
        if tool == "fs__read_text_file":
            steps.append(Call(tool, {"path": str(notes)}))
        elif tool == "memory__search_nodes":
            steps.append(Call(tool, {"query": tag}))
        else:
            steps.append(Call(tool, {}))
    return Plan(level, session, ERAS[session % 2], steps)


def notes_text() -> str:
    """About 2 KB of plain notes: the shared file every session reads."""
    lines = ["# Release planning", ""]
    lines += [f"- item {i}: review and merge the open pull request, then update the changelog" for i in range(24)]
    return "\n".join(lines) + "\n"
