"""Step, Segment, History: the one data model every layer speaks.

A session's trajectory is a list of committed steps plus the open segment: the reads executed
since the last commit point. When a write is held, the open segment plus the held call is what a
reviewer sees. A verdict commits the accepted prefix and discards the rejected suffix, so later
reviews (and models) never see steps that were thrown away. Observations are kept as bounded
text: the history is for review prompts, not a copy of every payload.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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


@dataclass(frozen=True)
class Step:
    """One call of a trajectory: a value. What became of it (its observation) is a new step
    (`observed`), never written into this one, so a segment a reviewer was shown stays as shown."""

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

    def observed(self, observation: str, *, is_error: bool = False, duration_s: float | None = None) -> Step:
        """This call as it ran: the same call with what it returned."""
        took = self.duration_s if duration_s is None else duration_s
        return replace(self, observation=observation, is_error=is_error, duration_s=took)

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

    def settled(self, accepted_steps: int, executed: Step | None = None) -> tuple[tuple[Step, ...], int]:
        """What a verdict commits of this segment, in order, and from which index on it drops it.

        `executed` is what ran at the segment's end: the held call as it ran (with its
        observation) when every step was accepted, else a substitute for the rejected suffix."""
        accepted_steps = max(0, min(accepted_steps, len(self)))
        kept = self.steps[:accepted_steps]
        if executed is not None and accepted_steps == len(self):
            kept = kept[:-1]  # the held call commits as it ran, not as it was held
        return (*kept, *([executed] if executed is not None else [])), accepted_steps


class History:
    """One session's (or one engine run's) trajectory, and the only place its steps land.

    Steps enter through its methods alone: `record_read` (a read ran), `segment`/`release`/
    `settle` (a write held and decided), `commit` (an owner that decides its own commit points,
    the engine). What it holds is read as tuples, so no caller appends behind its back.
    `commit_every=None` never commits reads by itself: the owner calls `commit`.
    """

    def __init__(self, commit_every: int | None = 8, committed: tuple[Step, ...] | list[Step] = ()) -> None:
        self.commit_every = commit_every
        self._committed: list[Step] = list(committed)
        self._open: list[Step] = []
        self._discarded = 0
        self._held = 0  # segments out for review; while any is, no read commits behind a reviewer's back

    @property
    def committed(self) -> tuple[Step, ...]:
        return tuple(self._committed)

    @property
    def open(self) -> tuple[Step, ...]:
        return tuple(self._open)

    @property
    def discarded(self) -> int:
        return self._discarded

    @property
    def held(self) -> int:
        return self._held

    def before(self) -> History:
        """The committed history as it is now, apart from this one: what a review request reads
        while this history goes on (the repair turn adds the accepted prefix itself)."""
        return History(self.commit_every, self._committed)

    def load(self, committed: list[Step], open: list[Step], held: int, discarded: int) -> None:
        """The session as a shared store holds it (every replica's changes), in place of this copy's."""
        self._committed, self._open, self._held, self._discarded = list(committed), list(open), held, discarded

    def commit(self, *steps: Step) -> None:
        """Steps that ran and that their owner commits now (the engine's own commit points)."""
        self._committed.extend(steps)

    def record_read(self, step: Step) -> None:
        self._open.append(step)
        # A run of K reads with no write commits without review.
        if self.commit_every is not None and len(self._open) >= self.commit_every and self._held == 0:
            self._committed.extend(self._open)
            self._open.clear()

    def segment(self, held: Step) -> Segment:
        self._held += 1
        return Segment((*self._open, held))

    def release(self, segment: Segment) -> None:
        """The held call went nowhere (abandoned, or waiting for the client): its reads stay open."""
        self._held = max(0, self._held - 1)

    def settle(self, segment: Segment, accepted_steps: int, executed: Step | None = None) -> None:
        """Commit the first `accepted_steps` of the segment, drop the rest, then append `executed`.

        `executed` is the step that actually ran (`Segment.settled`): the held call as it ran
        when it was accepted, or a replacement; the rejected suffix never returns.
        """
        self._held = max(0, self._held - 1)
        kept, cut = segment.settled(accepted_steps, executed)
        # A read commits, or is dropped, only while it is still open: one that another segment
        # settled already has its place (as the shared store's rows do), never a second one.
        still_open = {id(step) for step in self._open}
        live = [step is segment.held or id(step) in still_open for step in segment.steps]
        self._committed.extend(step for step in kept if step is executed or _live(step, segment, live))
        self._discarded += sum(live[cut:])
        # Reads that arrived while the write was held stay open for the next segment.
        self._open = [step for step in self._open if all(step is not s for s in segment.steps)]


def _live(step: Step, segment: Segment, live: list[bool]) -> bool:
    return any(step is s and ok for s, ok in zip(segment.steps, live, strict=True))


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
