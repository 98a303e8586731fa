"""`review: leash`: LEASH's accept layer as a reviewer, over the fallback that decides otherwise.

It sits here, above `leash/`, so that LEASH itself (encoders, banks, layers) knows nothing of
reviewers: it scores steps; this module turns a score into a verdict or hands the call on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from mcp_spec_proxy.config.schema import LeashConfig
from mcp_spec_proxy.leash.bank import Neighbour
from mcp_spec_proxy.leash.layers import Leash, Score
from mcp_spec_proxy.review import Reviewer, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import Chain, ReviewerKind

logger = logging.getLogger(__name__)


class LeashReviewer:
    """`review: leash`: a held write confidently in the success region may pass without a model call.

    Only when all of these hold; otherwise the fallback reviewer (the strong model, or the user
    when no model is configured) decides, and the verdict's evidence says why it was not LEASH:

    * the operator set `leash.accept_threshold`, and the encoder is not `hashing` (config refuses
      that pairing at load; this is the same rule for a Leash built by hand);
    * the tool declares `destructiveHint: false` and its server's annotations are trusted;
    * a calibration record for this encoder is in the bank directory (`bank calibrate
      --max-false-accept`), and the threshold is no looser than the one calibrated on held-out labels;
    * the held write's failure score, from enough near neighbours, is at or below the threshold —
      counting only the labels the operator trusts for it (`trusted`: a success from the calling
      session, from its client's recent calls, or from a source outside `leash.accept_from` is no
      evidence; a failure always is), with the successes from at least `leash.accept_min_sessions`
      independent sessions (the sessions of one identified client — under `auth:`, one principal —
      count as one), and the nearest of them not a failure.

    Either way the verdict carries the score and the nearest neighbours, and the audit log records them.
    """

    by = ReviewerKind.LEASH.chain

    def __init__(self, leash: Leash, fallback: Reviewer, *, untrusted_servers: Collection[str] = ()) -> None:
        self._leash = leash
        self._fallback = fallback
        self._untrusted = frozenset(untrusted_servers)
        self._told: set[str] = set()

    @property
    def fallback(self) -> Reviewer:
        """Who decides what LEASH does not pass alone: the strong model, or the person when there is none."""
        return self._fallback

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        found = await self._leash.step_score(request.segment.held)
        score, distrusted = trusted(found, request, self._leash.config)
        # The score counts trusted labels only; the neighbours shown are all the near ones, with who labelled them.
        evidence: dict[str, Any] = {"layer": "accept", **found.as_json(), "score": score.as_json()["score"]}
        for shown, neighbour in zip(evidence["neighbours"], found.neighbours, strict=False):
            origin = neighbour.provenance
            shown |= {"reporter": origin.reporter, **({"session": origin.session} if origin.session else {})}
        if distrusted:
            evidence["distrusted"] = distrusted
        why_not = await self._why_not_alone(request, score, distrusted)
        if why_not is None:
            reason = (
                f"LEASH: failure score {score.value:.3f} over {len(score.neighbours)} neighbours is at or below"
                f" accept_threshold {self._leash.config.accept_threshold} (calibrated on held-out labels) and"
                " the tool declares destructiveHint: false; forwarded without a model call"
            )
            return Verdict(True, reason, len(request.segment), by=self.by, evidence=evidence)
        evidence["fallback"] = why_not
        verdict = await self._fallback.review(request, user)
        return replace(verdict, evidence=evidence)

    async def _why_not_alone(self, request: ReviewRequest, score: Score, distrusted: dict[str, int]) -> str | None:
        """Why this write may not pass on LEASH's word alone, or None when it may."""
        leash = self._leash
        threshold = leash.config.accept_threshold
        if threshold is None:
            return "leash.accept_threshold is not set"
        info = leash.encoder.info
        if info.name == "hashing":
            return self._setup("the hashing encoder never forwards a write on its own; use an embedding encoder")
        if info.name == "hidden" and score.representation == "fallback":
            # Not the calibrated representation: a call no weak model drafted is scored in the fallback's bank.
            return "under encoder: hidden this call has no drafting state: a fallback score never passes it alone"
        tool = request.tool
        if tool is None:
            return "the held step is not a tool call"
        annotations = tool.definition.annotations
        if annotations is None or annotations.destructive_hint is not False:
            return f"{tool.name} does not declare destructiveHint: false"
        if tool.server in self._untrusted:
            return f"server {tool.server!r} is not trusted for annotations (trust_annotations: false)"
        calibration = await leash.calibration()
        if calibration is None:
            return self._setup(
                f"no calibration record in {leash.config.bank_dir} (or it is unreadable) — run `mcp-spec-proxy"
                " bank calibrate HELD_OUT.jsonl --max-false-accept RATE` on labels the bank does not hold"
            )
        if not calibration.covers(info):
            return self._setup(
                f"the calibration record was measured with the {calibration.encoder.describe()}, not the configured"
                f" {info.describe()} — run `mcp-spec-proxy bank calibrate` again"
            )
        if threshold > calibration.accept_threshold:
            return self._setup(
                f"accept_threshold {threshold} is looser than the {calibration.accept_threshold} calibrated on"
                f" {calibration.held_out} held-out steps — lower it, or recalibrate"
            )
        if score.value is None:
            left_out = "".join(f"; {count} left out: {why}" for why, count in distrusted.items())
            return f"too few trusted near neighbours to judge ({len(score.neighbours)} within min_similarity{left_out})"
        if score.neighbours[0].label == "failure":
            return "its nearest trusted neighbour is a failure"
        witnesses = len({witness(n) for n in score.neighbours if n.label == "success"})
        if witnesses < leash.config.accept_min_sessions:
            return (
                f"its accepting neighbours come from {witnesses} independent session(s) (an identified"
                " client's sessions count as one), fewer than"
                f" leash.accept_min_sessions {leash.config.accept_min_sessions}"
            )
        if score.value > threshold:
            return f"failure score {score.value:.3f} is above accept_threshold {threshold}"
        return None

    def _setup(self, why: str) -> str:
        """A reason that holds for every write until the operator acts: logged once, then only audited."""
        if why not in self._told:
            self._told.add(why)
            logger.warning("review: leash sends every write to its fallback reviewer: %s", why)
        return why


def trusted(score: Score, request: ReviewRequest, config: LeashConfig) -> tuple[Score, dict[str, int]]:
    """`score` recomputed over the neighbours `review: leash` may accept on, and how many were left
    out, by why. Every failure stays (it can only send the write to a reviewer); a success stays
    only when `distrust` finds nothing against it."""
    now = time.time()
    kept: list[Neighbour] = []
    left_out: dict[str, int] = {}
    for neighbour in score.neighbours:
        why = None if neighbour.label == "failure" else distrust(neighbour, request, config, now)
        if why is None:
            kept.append(neighbour)
        else:
            left_out[why] = left_out.get(why, 0) + 1
    if not left_out:
        return score, {}
    near = tuple(kept)
    if len(near) < config.min_neighbours:
        return Score(None, near), left_out
    weights = [float(n.score) for n in near]
    failed = sum(w for w, n in zip(weights, near, strict=True) if n.label == "failure")
    return Score(failed / sum(weights), near), left_out


def distrust(neighbour: Neighbour, request: ReviewRequest, config: LeashConfig, now: float) -> str | None:
    """Why a success label is no ground to accept `request`'s write, or None when it is."""
    origin = neighbour.provenance
    if origin.reporter == "operator":
        return None if "operator" in config.accept_from else "operator"
    if origin.reporter == "unknown":
        return None if "unknown" in config.accept_from else "unknown provenance"
    if origin.session is None:
        return "no session"  # nothing to tell it from the caller's own
    if origin.session == request.session:
        return "the calling session's own"
    recent = origin.at is None or now - origin.at <= config.same_client_window
    if request.client is not None and origin.client == request.client and recent:
        return "the calling client's recent"
    if origin.reporter == "agent":
        return None if "agent_outcomes" in config.accept_from else "reported by the agent"
    # The reviewer as the bank stored it, read by the kinds' one reader: anything but a chain of
    # judgements (LEASH's own word, a policy, a garbled text) is no evidence.
    chain = Chain.parse(origin.reviewer)
    if origin.source != "verdict" or chain is None or not chain.judged:
        return f"source {origin.source} ({origin.reviewer or 'no reviewer'})"
    return None if "judgements" in config.accept_from else "a judgement"


def witness(neighbour: Neighbour) -> str:
    """Who vouches for a label: its client where a front authenticated one (under `auth:` the
    principal's key, so one principal's many sessions are one witness), else its session; the row
    itself when the operator (or nobody) stored it."""
    origin = neighbour.provenance
    if origin.reporter in ("operator", "unknown") or origin.session is None:
        return f"row:{neighbour.id}"
    if origin.client is not None:
        return f"client:{origin.client}"
    return f"session:{origin.session}"
