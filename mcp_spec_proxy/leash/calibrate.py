"""Choosing LEASH thresholds from labelled data: the curve, and the point that meets a target.

Given failure scores and what really happened (failure or not), each candidate threshold flags
the items scoring at or above it. Its escalation rate is the share flagged, its precision the
share of flagged items that failed, its recall the share of failures flagged. `pick` takes the
threshold for a target escalation rate (the budget of extra strong calls) or a target precision
(how often an escalation must be warranted).

The other side is acceptance (`review: leash`): a held write scoring at or below a threshold may be
forwarded without a model call. `accept_curve` and `pick_accept` choose the threshold that accepts
the most held-out steps while its false-accept rate (the share of them that failed) stays within a
bound, and a `Calibration` record in the bank directory says which encoder that was measured with
and on how much held-out data; `LeashReviewer` forwards nothing on its own without one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mcp_spec_proxy.leash.encoders import EncoderInfo, LeashError
from mcp_spec_proxy.tools.fingerprints import write_atomic

CALIBRATION = "calibration.json"
"""The calibration record's file name, in the bank directory (`leash.bank_dir`)."""
CALIBRATION_FORMAT = "mcp-spec-proxy-leash-calibration"
MIN_HELD_OUT = 20
"""Fewer held-out steps than this say too little about a false-accept rate to record a calibration."""


@dataclass(frozen=True)
class Point:
    threshold: float
    escalation_rate: float
    precision: float
    recall: float


def flags(score: float | None, threshold: float) -> bool:
    """THE escalation decision, at runtime (`Leash.at_least`: routing, step escalation, the shadow
    observer) and in `curve` alike: a score at or above the threshold; no score (too few near
    neighbours) is no opinion, and no opinion never escalates."""
    return score is not None and score >= threshold


def curve(scores: Sequence[float | None], failed: Sequence[bool], steps: int = 20) -> list[Point]:
    """Precision, recall and escalation rate at thresholds 0, 1/steps, …, 1, decided by `flags`."""
    if len(scores) != len(failed):
        raise ValueError("scores and labels differ in length")
    total = len(scores)
    failures = sum(failed)
    points = []
    for i in range(steps + 1):
        threshold = i / steps
        flagged = [f for s, f in zip(scores, failed, strict=True) if flags(s, threshold)]
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


@dataclass(frozen=True)
class AcceptPoint:
    threshold: float
    accept_rate: float  # share of held-out steps at or below the threshold
    accepted: int
    false_accepts: int  # accepted steps that in fact failed
    false_accept_rate: float  # false_accepts / accepted (0 when nothing is accepted)


def accept_curve(scores: Sequence[float | None], failed: Sequence[bool], steps: int = 20) -> list[AcceptPoint]:
    """What accepting at or below each threshold 0, 1/steps, …, 1 would have done; a step without
    a score (too few neighbours) is never accepted, as `review: leash` would not accept it."""
    if len(scores) != len(failed):
        raise ValueError("scores and labels differ in length")
    points = []
    for i in range(steps + 1):
        threshold = i / steps
        accepted = [f for s, f in zip(scores, failed, strict=True) if s is not None and s <= threshold]
        bad = sum(accepted)
        points.append(
            AcceptPoint(
                threshold=threshold,
                accept_rate=len(accepted) / len(scores) if scores else 0.0,
                accepted=len(accepted),
                false_accepts=bad,
                false_accept_rate=bad / len(accepted) if accepted else 0.0,
            )
        )
    return points


def pick_accept(points: Sequence[AcceptPoint], max_false_accept: float) -> AcceptPoint | None:
    """The threshold accepting the most held-out steps with a false-accept rate within the bound, or None.

    Of thresholds that accept the same steps the lowest wins: beyond the last held-out score there
    is no evidence either way.
    """
    meeting = [p for p in points if p.accepted and p.false_accept_rate <= max_false_accept]
    return max(meeting, key=lambda p: (p.accepted, -p.threshold)) if meeting else None


def accept_table(points: Sequence[AcceptPoint]) -> str:
    lines = ["threshold  accepted  false-accepts  false-accept-rate"]
    lines += [
        f"{p.threshold:9.2f}  {p.accept_rate:8.3f}  {p.false_accepts:13d}  {p.false_accept_rate:17.3f}" for p in points
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Calibration:
    """Evidence that `accept_threshold` was chosen on held-out labels, with this encoder."""

    encoder: EncoderInfo
    accept_threshold: float
    held_out: int  # labelled steps scored against the bank, not in it
    held_out_failures: int
    accepted: int
    false_accepts: int
    max_false_accept: float  # the bound the threshold was picked for
    bank_steps: int  # step labels in the bank when measured
    source: str  # the held-out file
    calibrated: str

    @classmethod
    def measured(
        cls,
        encoder: EncoderInfo,
        point: AcceptPoint,
        failed: Sequence[bool],
        *,
        max_false_accept: float,
        bank_steps: int,
        source: str,
    ) -> Calibration:
        return cls(
            encoder=encoder,
            accept_threshold=point.threshold,
            held_out=len(failed),
            held_out_failures=sum(failed),
            accepted=point.accepted,
            false_accepts=point.false_accepts,
            max_false_accept=max_false_accept,
            bank_steps=bank_steps,
            source=source,
            calibrated=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )

    def covers(self, encoder: EncoderInfo) -> bool:
        """Measured with this encoder (a dimension of 0 is "not known yet" and matches any)."""
        ours = self.encoder
        return (ours.name, ours.model) == (encoder.name, encoder.model) and (
            not ours.dim or not encoder.dim or ours.dim == encoder.dim
        )

    def as_json(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, **asdict(self), "encoder": self.encoder.as_json()}

    def save(self, directory: Path) -> Path:
        path = Path(directory).expanduser() / CALIBRATION
        write_atomic(path, json.dumps(self.as_json(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: Path) -> Calibration | None:
        """The record in `directory`, or None if there is none; a record that will not parse is a LeashError."""
        path = Path(directory).expanduser() / CALIBRATION
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise LeashError(f"LEASH calibration record {path} is unreadable: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
            if data.get("format") != CALIBRATION_FORMAT:
                raise ValueError("not a calibration record")
            encoder = data["encoder"]
            fields = {name: data[name] for name in cls.__dataclass_fields__ if name != "encoder"}
            record = cls(EncoderInfo(encoder["name"], str(encoder["model"]), int(encoder["dim"])), **fields)
            if not 0 <= float(record.accept_threshold) <= 1:
                raise ValueError(f"accept_threshold {record.accept_threshold} is not in [0, 1]")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LeashError(
                f"LEASH calibration record {path} is garbled ({exc}) — rerun `mcp-spec-proxy bank calibrate"
                " --max-false-accept ...` to rewrite it"
            ) from None
        return record
