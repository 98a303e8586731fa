"""Step, Segment, History: the one data model every layer speaks.

A session's trajectory is a list of committed steps plus the open segment: the reads executed
since the last commit point. When a write is held, the open segment plus the held call is what a
reviewer sees. A verdict commits the accepted prefix and discards the rejected suffix, so later
reviews (and models) never see steps that were thrown away. Observations are kept as bounded
text: the history is for review prompts, not a copy of every payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Effect = Literal["read", "write"]

OBSERVATION_LIMIT = 8_000
"""Characters of a result kept in the history; the client always gets the whole result."""

Representation = Literal["call", "turn"]
"""What a drafted step's hidden state is: `call`, the drafting model's state at this call's own last
token; `turn`, the state at the turn's last token standing in for an earlier call of that turn
(SGLang's chat API returns one state per turn), shared with the turn's other calls."""


@dataclass(frozen=True)
class DraftState:
    """The weak model's final-layer state for a step, returned with the call that drafted it."""

    vector: tuple[float, ...]
    representation: Representation
    turn: str  # the drafting turn: its `turn` states are one vector, so they label the turn, not each call


@dataclass
class Step:
    tool: str
    arguments: dict[str, Any]
    effect: Effect
    observation: str | None = None
    is_error: bool = False
    duration_s: float = 0.0
    intent: str | None = None
    ref: str | None = field(default=None, compare=False, repr=False)  # its row in a shared session store
    # Travels with the step to whoever labels it (the gate, the engine), so a label carries the state
    # the step was drafted with, whatever other step has the same tool and arguments.
    state: DraftState | None = field(default=None, compare=False, repr=False)

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"tool": self.tool, "arguments": self.arguments, "effect": self.effect}
        if self.intent is not None:
            data["intent"] = self.intent
        if self.observation is not None:
            data["observation"] = self.observation
            data["is_error"] = self.is_error
        return data


@dataclass(frozen=True)
class Segment:
    """The steps since the last commit point, the held call last."""

    steps: tuple[Step, ...]

    @property
    def held(self) -> Step:
        return self.steps[-1]

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class History:
    """One session's trajectory."""

    commit_every: int = 8
    committed: list[Step] = field(default_factory=list)
    open: list[Step] = field(default_factory=list)
    discarded: int = 0
    held: int = 0  # segments out for review; while any is, no read commits behind a reviewer's back

    def record_read(self, step: Step) -> None:
        self.open.append(step)
        # A run of K reads with no write commits without review.
        if len(self.open) >= self.commit_every and self.held == 0:
            self.committed.extend(self.open)
            self.open.clear()

    def segment(self, held: Step) -> Segment:
        self.held += 1
        return Segment((*self.open, held))

    def release(self, segment: Segment) -> None:
        """The held call went nowhere (abandoned, or waiting for the client): its reads stay open."""
        self.held = max(0, self.held - 1)

    def settle(self, segment: Segment, accepted_steps: int, executed: Step | None = None) -> None:
        """Commit the first `accepted_steps` of the segment, drop the rest, then append `executed`.

        `executed` is the step that actually ran in place of the segment's tail (the held call
        itself when it was accepted, or a replacement); the rejected suffix never returns.
        """
        self.held = max(0, self.held - 1)
        accepted_steps = max(0, min(accepted_steps, len(segment)))
        # A read commits, or is dropped, only while it is still open: one that another segment
        # settled already has its place (as the shared store's rows do), never a second one.
        still_open = {id(step) for step in self.open}
        live = [step is segment.held or id(step) in still_open for step in segment.steps]
        self.committed.extend(s for s, ok in zip(segment.steps[:accepted_steps], live, strict=False) if ok)
        self.discarded += sum(live[accepted_steps:])
        # Reads that arrived while the write was held stay open for the next segment.
        self.open = [step for step in self.open if all(step is not s for s in segment.steps)]
        if executed is not None:
            self.committed.append(executed)


def observation_text(content: list[dict[str, Any]]) -> str:
    """Flatten MCP content blocks into the bounded text a reviewer reads."""
    parts: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "resource":
            resource = block.get("resource") or {}
            parts.append(str(resource.get("text", f"[resource {resource.get('uri', '')}]")))
        else:
            parts.append(f"[{kind} content]")
    text = "\n".join(parts)
    if len(text) > OBSERVATION_LIMIT:
        text = text[:OBSERVATION_LIMIT] + f"\n[… {len(text) - OBSERVATION_LIMIT} more characters]"
    return text
