"""Reviewer kinds: who may decide a held call, and what each kind's decision means — one table.

Every trait the gate, the barrier, the engine and LEASH act on is a column of `ReviewerKind`,
and each member is its own row: a member that leaves out a trait is a `TypeError` when this
module is imported, so no kind is added without saying, above all, whether it asks a person.

A verdict names who decided it as a `Chain` of kinds: `strong`; `human→console` (the client could
not ask, the console decided); `strong→human` (the user decided what the model rejected);
`strong+console` (both accepted, the model first). Logic asks a chain's kinds for their traits.
The text the audit trail (`reviewer`, `decided_by`) and the client's texts show is rendered from
the chain and never read back; the one exception is `Chain.parse`, for the text a LEASH bank
stored with a label before this process ran, and it reads anything but a chain of known kinds
as nothing (None: no judgement).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum, unique
from typing import Literal

Join = Literal["→", "+"]
HANDED: Join = "→"
"""The one before could not, or would not, decide alone: the next one decided."""
BOTH: Join = "+"
"""Each accepted in turn, the first (a model) before the person was troubled."""


class _Row(Enum):
    """How a `ReviewerKind` member states its traits: all of them, in the table's order."""

    text: str
    person: bool
    judgement: bool
    proposes: bool
    met_by_strong_author: bool
    mode: bool

    def __init__(
        self, text: str, person: bool, judgement: bool, proposes: bool, met_by_strong_author: bool, mode: bool
    ) -> None:
        self.text = text
        self.person = person
        self.judgement = judgement
        self.proposes = proposes
        self.met_by_strong_author = met_by_strong_author
        self.mode = mode


@unique
class ReviewerKind(_Row):
    """Who decided, one link of a verdict's chain; each member is its row of the trait table.

    text      what the audit trail and the client's texts call it
    person    it may be waiting on a person: `review.on_error: allow` never forgives its silence
    judgement its verdict judges the steps: it labels LEASH's banks, and the engine's acceptance
              counts it (a chain is a judgement when every kind in it is one)
    proposes  its rejection may carry the step to run instead (`on_reject: replace` / `repair`)
    met_by_strong_author
              as a tool's review mode, a call the strong model wrote itself (strong-led steps, a
              replacement, a repair) has met it: a model decides first, and the model wrote it
    mode      `review:` in servers.yaml may name it (config's `ReviewMode`)
    """

    # fmt: off
    #                         text                      person judgement proposes met_by_strong mode
    ALLOW =                  ("allow",                  False, False,    False,   False,        True)
    DENY =                   ("deny",                   False, False,    False,   False,        True)
    HUMAN =                  ("human",                  True,  True,     False,   False,        True)
    CONSOLE =                ("console",                True,  True,     False,   False,        True)
    STRONG =                 ("strong",                 False, True,     True,    True,         True)
    STRONG_THEN_HUMAN =      ("strong_then_human",      True,  True,     False,   True,         True)
    LEASH =                  ("leash",                  False, False,    False,   True,         True)
    # The links below are never a mode: what a verdict says when no one of the above judged.
    CONSOLE_RULE =           ("console-rule",           False, False,    False,   False,        False)
    CONSOLE_UNAVAILABLE =    ("console-unavailable",    False, False,    False,   False,        False)
    STRONG_UNREADABLE =      ("strong (unreadable)",    False, False,    False,   False,        False)
    STRONG_AUTHORED =        ("strong (authored)",      False, False,    False,   False,        False)
    WEAK_ONLY_BASELINE =     ("weak-only (baseline)",   False, False,    False,   False,        False)
    STRONG_ONLY_BASELINE =   ("strong-only (baseline)", False, False,    False,   False,        False)
    ON_ERROR =               ("on_error",               False, False,    False,   False,        False)
    HELD =                   ("held",                   False, False,    False,   False,        False)
    # fmt: on

    @property
    def chain(self) -> Chain:
        """This kind alone, as a verdict names its reviewer."""
        return Chain((self,), ())

    @classmethod
    def of_mode(cls, mode: str) -> ReviewerKind:
        """The kind a `review:` mode of the config names (a `KeyError` for one that is not a mode)."""
        return _MODES[mode]


_MODES: Mapping[str, ReviewerKind] = {kind.text: kind for kind in ReviewerKind if kind.mode}
_BY_TEXT: Mapping[str, ReviewerKind] = {kind.text: kind for kind in ReviewerKind}

BASELINES: Mapping[str, ReviewerKind] = {
    "weak-only": ReviewerKind.WEAK_ONLY_BASELINE,
    "strong-only": ReviewerKind.STRONG_ONLY_BASELINE,
}
"""The engine's baseline modes whose steps an operator's run lets stand unreviewed, by mode."""


def _check_table(table: type[_Row]) -> None:
    """Every kind has every trait (the row's arity does the rest) and a text a chain can hold."""
    for kind in table:
        traits = (kind.person, kind.judgement, kind.proposes, kind.met_by_strong_author, kind.mode)
        if not all(isinstance(trait, bool) for trait in traits):
            raise TypeError(f"ReviewerKind.{kind.name}: every trait is True or False")
        if not kind.text or HANDED in kind.text or BOTH in kind.text:
            raise TypeError(f"ReviewerKind.{kind.name}: its text must be non-empty and hold no {HANDED} or {BOTH}")


_check_table(ReviewerKind)


@dataclass(frozen=True)
class Chain:
    """Who decided a verdict, in order: `kinds`, and how each came after the one before (`joins`)."""

    kinds: tuple[ReviewerKind, ...]
    joins: tuple[Join, ...]

    def __post_init__(self) -> None:
        if not self.kinds or len(self.joins) != len(self.kinds) - 1:
            raise ValueError("a chain is one or more kinds, one join between each two")

    def then(self, other: Chain) -> Chain:
        """`self` handed the call on, and `other` decided (`human→console`)."""
        return Chain(self.kinds + other.kinds, (*self.joins, HANDED, *other.joins))

    def plus(self, other: Chain) -> Chain:
        """`self` accepted, then `other` decided too (`strong+human`)."""
        return Chain(self.kinds + other.kinds, (*self.joins, BOTH, *other.joins))

    @property
    def decider(self) -> ReviewerKind:
        """The kind whose decision the verdict is: the last of the chain."""
        return self.kinds[-1]

    @property
    def judged(self) -> bool:
        """Whether the verdict is a judgement (every kind in it is one): it labels LEASH, and
        the engine's acceptance counts its steps."""
        return all(kind.judgement for kind in self.kinds)

    @property
    def asks_a_person(self) -> bool:
        """Whether a reviewer with this identity may be waiting on a person."""
        return any(kind.person for kind in self.kinds)

    @property
    def proposes(self) -> bool:
        """Whether the verdict's replacement may be run: its decider is a kind that proposes."""
        return self.decider.proposes

    @property
    def text(self) -> str:
        """The chain as the audit trail and the client's texts show it."""
        parts = [self.kinds[0].text]
        for join, kind in zip(self.joins, self.kinds[1:], strict=True):
            parts += [join, kind.text]
        return "".join(parts)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str | None) -> Chain | None:
        """A chain as a LEASH bank stored it with a label (`leash/provenance.py`), or None when
        `text` is not exactly the text of a chain of known kinds. Only stored text is read so;
        a verdict in hand carries its chain."""
        if not text:
            return None
        parts = re.split(f"([{HANDED}{BOTH}])", text)
        kinds = [_BY_TEXT.get(part) for part in parts[::2]]
        joins: list[Join] = [HANDED if part == HANDED else BOTH for part in parts[1::2]]
        if any(kind is None for kind in kinds):
            return None
        return cls(tuple(kind for kind in kinds if kind is not None), tuple(joins))


__all__ = ["BASELINES", "BOTH", "HANDED", "Chain", "Join", "ReviewerKind"]
