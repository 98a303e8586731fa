"""Choosing LEASH thresholds from labelled data: the curve, and the point that meets a target.

Given failure scores and what really happened (failure or not), each candidate threshold flags
the items scoring at or above it. Its escalation rate is the share flagged, its precision the
share of flagged items that failed, its recall the share of failures flagged. `pick` takes the
threshold for a target escalation rate (the budget of extra strong calls) or a target precision
(how often an escalation must be warranted).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    threshold: float
    escalation_rate: float
    precision: float
    recall: float


def curve(scores: Sequence[float], failed: Sequence[bool], steps: int = 20) -> list[Point]:
    """Precision, recall and escalation rate at thresholds 0, 1/steps, …, 1."""
    if len(scores) != len(failed):
        raise ValueError("scores and labels differ in length")
    total = len(scores)
    failures = sum(failed)
    points = []
    for i in range(steps + 1):
        threshold = i / steps
        flagged = [f for s, f in zip(scores, failed, strict=True) if s >= threshold]
        hits = sum(flagged)
        points.append(
            Point(
                threshold=threshold,
                escalation_rate=len(flagged) / total if total else 0.0,
                precision=hits / len(flagged) if flagged else 1.0,
                recall=hits / failures if failures else 1.0,
            )
        )
    return points


def pick(points: Sequence[Point], *, target_rate: float | None = None, target_precision: float | None = None) -> Point:
    """The threshold meeting the target: the escalation rate closest to (not above) `target_rate`,
    or the lowest threshold whose precision reaches `target_precision` (most failures caught)."""
    if (target_rate is None) == (target_precision is None):
        raise ValueError("give exactly one of target_rate and target_precision")
    if target_rate is not None:
        within = [p for p in points if p.escalation_rate <= target_rate]
        if not within:
            return max(points, key=lambda p: p.threshold)
        return max(within, key=lambda p: (p.escalation_rate, -p.threshold))
    assert target_precision is not None
    meeting = [p for p in points if p.precision >= target_precision and p.escalation_rate > 0]
    if not meeting:
        return max(points, key=lambda p: p.threshold)
    return min(meeting, key=lambda p: p.threshold)


def table(points: Sequence[Point]) -> str:
    lines = ["threshold  escalation  precision  recall"]
    lines += [f"{p.threshold:9.2f}  {p.escalation_rate:10.3f}  {p.precision:9.3f}  {p.recall:6.3f}" for p in points]
    return "\n".join(lines)
