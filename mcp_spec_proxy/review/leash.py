"""`review: leash`: LEASH's accept layer as a reviewer, over the fallback that decides otherwise.

It sits here, above `leash/`, so that LEASH itself (encoders, banks, layers) knows nothing of
reviewers: it scores steps; this module turns a score into a verdict or hands the call on.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from mcp_spec_proxy.leash.layers import Leash, Score
from mcp_spec_proxy.review import Reviewer, ReviewRequest, UserChannel, Verdict

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
    * the held write's failure score, from enough near neighbours, is at or below the threshold.

    Either way the verdict carries the score and the nearest neighbours, and the audit log records them.
    """

    name = "leash"

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
        score = await self._leash.step_score(request.segment.held)
        evidence: dict[str, Any] = {"layer": "accept", **score.as_json()}
        why_not = await self._why_not_alone(request, score)
        if why_not is None:
            reason = (
                f"LEASH: failure score {score.value:.3f} over {len(score.neighbours)} neighbours is at or below"
                f" accept_threshold {self._leash.config.accept_threshold} (calibrated on held-out labels) and"
                " the tool declares destructiveHint: false; forwarded without a model call"
            )
            return Verdict(True, reason, len(request.segment), reviewer="leash", evidence=evidence)
        evidence["fallback"] = why_not
        verdict = await self._fallback.review(request, user)
        return replace(verdict, evidence=evidence)

    async def _why_not_alone(self, request: ReviewRequest, score: Score) -> str | None:
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
            return f"too few near neighbours to judge ({len(score.neighbours)} within min_similarity)"
        if score.value > threshold:
            return f"failure score {score.value:.3f} is above accept_threshold {threshold}"
        return None

    def _setup(self, why: str) -> str:
        """A reason that holds for every write until the operator acts: logged once, then only audited."""
        if why not in self._told:
            self._told.add(why)
            logger.warning("review: leash sends every write to its fallback reviewer: %s", why)
        return why
