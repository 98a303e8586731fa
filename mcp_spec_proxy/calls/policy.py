"""The gate's policy: which reviewer a call meets, chosen once per call from the whole call.

The gate holds one `Policy` (it is no part of the gate's own class). It chooses from the call as
it stands — the tool and its annotations, the arguments, the session, the principal, who wrote
it — and returns what it chose (`Choice`) without touching the call. The effective reviewer is the
reviewer of the first of `rules:` that matches the call (`decide`, `calls/rules.py`: a rule may
also refuse it, or make a read a write), else the tool's override or `review.default` (`mode`),
then (`calls/gate.py` states the whole promise): a held tool runs for no one until `tools accept`;
`deny` never runs and a person's own mode always asks; a call the strong model wrote counts as
reviewed by it under a mode a model decides first; the engine's drafted segment meets its own
strong verifier (and then the user, for a `human` tool); an operator's baseline runs its steps
unreviewed; and `allow` forwards unless LEASH's shadow observer flags the call, which then goes
to the strong model (or the user) with its evidence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp_spec_proxy.calls.call import GateCall
from mcp_spec_proxy.calls.rules import NO_RULE, Decision, Rules
from mcp_spec_proxy.config.schema import ProxyConfig, ReviewMode
from mcp_spec_proxy.errors import ToolNotFound
from mcp_spec_proxy.review import Reviewer, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import BASELINES, Chain, ReviewerKind
from mcp_spec_proxy.review.policy import DenyReviewer
from mcp_spec_proxy.review.waiting import Both
from mcp_spec_proxy.tools.catalog import Catalog, CatalogTool, is_held

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

STRONG_AUTHORS: frozenset[str] = frozenset({"strong", "replacement", "repair"})
"""Authors whose calls count as reviewed by the strong model: it wrote them itself."""


@dataclass(frozen=True)
class Choice:
    """What the policy chose for one call: its reviewer, the `rules:` decision behind it, and the
    escalation to audit (`leash-escalated`) when LEASH flagged the call, else None."""

    reviewer: Reviewer
    decision: Decision
    flagged: dict[str, Any] | None = None


class Policy:
    """How the gate picks a call's reviewer: the config's reviewers and `rules:`, LEASH's shadow
    observer where it is on, and the catalog (to reread `tools accept` before refusing a held tool)."""

    def __init__(
        self,
        config: ProxyConfig,
        reviewers: Mapping[ReviewMode, Reviewer],
        leash: Leash | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self._config = config
        self._reviewers = reviewers
        self._leash = leash
        self._catalog = catalog
        self.rules = Rules(config.rules, config.review.default)

    def mode(self, tool: CatalogTool) -> ReviewMode:
        """The tool's configured reviewer: its override, else `review.default`."""
        return tool.review or self._config.review.default

    def decide(
        self, tool: CatalogTool, arguments: Mapping[str, Any], principal: object | None, session: str
    ) -> tuple[CatalogTool, Decision]:
        """The config's `rules:` for this call (`calls/rules.py`): the tool as the call meets it (a read
        a rule makes a write is a write) and the decision, which the call's `GateCall.rule` carries."""
        decision = self.rules.decide(tool, arguments, principal, session) if self.rules else NO_RULE
        if decision.write and tool.effect == "read":
            made = f"rule {decision.rule} makes this call a write"
            tool = dataclasses.replace(tool, effect="write", why=f"{made} ({tool.why})" if tool.why else made)
        return tool, decision

    async def _still_held(self, tool: CatalogTool) -> bool:
        """`tools accept` may have run since (in another process): the store is reread first."""
        if self._catalog is None:
            return True
        await self._catalog.refresh_fingerprints()
        try:
            return is_held(self._catalog.lookup(tool.name))
        except ToolNotFound:
            return True

    async def choose(self, call: GateCall, strong: Reviewer | None, verified: bool) -> Choice:
        """The reviewer `call` meets, from the whole call: what `rules:` decided for it (`GateCall.rule`,
        else decided here over its tool, arguments, principal and session), its author, and LEASH's
        shadow observer. `strong` is the engine's own verifier, `verified` its drafted segment."""
        decision = call.rule
        if decision is None:
            decision = self.decide(call.tool, call.arguments, call.principal, call.session)[1]
        reviewer, flagged = await self._reviewer(call, strong, verified, decision)
        if call.flagged and flagged is None:
            # The engine's shadow observer flagged it (its score is in telemetry): audited like the
            # front's, whichever reviewer the call meets, so the trail has every escalation.
            flagged = {"to": reviewer.by.text, "layer": "flagged by the engine"}
        return Choice(reviewer, decision, flagged)

    async def _reviewer(
        self, call: GateCall, strong: Reviewer | None, verified: bool, decision: Decision = NO_RULE
    ) -> tuple[Reviewer, dict[str, Any] | None]:
        """The reviewer this call meets, and LEASH's evidence when its shadow observer escalated;
        `decision` is what the config's `rules:` decided for it (a rule's reviewer replaces the tool's)."""
        tool = call.tool
        if is_held(tool) and await self._still_held(tool):
            # Whoever wrote the call (the client, a replacement, a repair, the engine): a tool whose
            # definition changed, or that is new, runs for no one until the operator accepts it.
            return _HeldTool(tool), None
        if decision.deny is not None:
            return DenyReviewer(decision.deny), None  # whoever wrote the call: nothing runs
        loop = strong is not None and verified and call.author not in STRONG_AUTHORS
        # A read is held only when LEASH flags it: then it is the strong verifier's to judge.
        mode = (decision.review or self.mode(tool)) if tool.effect == "write" else "strong"
        if mode == "strong" and strong is None and "strong" not in self._reviewers:
            mode = "human"
        kind = ReviewerKind.of_mode(mode)
        if kind is ReviewerKind.DENY:
            return self._reviewers[mode], None
        if kind.person and not kind.met_by_strong_author:
            # A person's own mode: they are asked whoever wrote the call.
            human = self._reviewers[mode]
            if loop and strong is not None:
                # The engine's drafted segment is verified first; only then is the user asked.
                return Both(strong, human), None
            return human, None
        if loop and strong is not None:
            return strong, None  # SpecAgent's own verification; a rejection goes to its repair turn
        if call.author in STRONG_AUTHORS and kind.met_by_strong_author and not call.flagged:
            return _Authored(ReviewerKind.STRONG_AUTHORED, "the strong model wrote this call itself"), None
        baseline = BASELINES.get(call.baseline or "")
        if baseline is not None and (kind.met_by_strong_author or kind is ReviewerKind.ALLOW) and not call.flagged:
            why = f"the operator's {call.baseline} baseline runs its steps unreviewed"
            return _Authored(baseline, why), None
        if kind is ReviewerKind.ALLOW and call.flagged:
            return strong or self._reviewers.get("strong") or self._reviewers["human"], None
        if kind is ReviewerKind.ALLOW:
            if self._leash is not None:
                score = await self._leash.step_score(call.request.segment.held)
                if self._leash.at_least(score, self._leash.config.observe_threshold):
                    escalate: ReviewMode = "strong" if "strong" in self._reviewers or strong else "human"
                    reviewer = strong if escalate == "strong" and strong is not None else self._reviewers[escalate]
                    return reviewer, {"to": reviewer.by.text, **score.as_json()}
            return self._reviewers[mode], None
        if kind is ReviewerKind.STRONG and strong is not None:
            return strong, None
        return self._reviewers[mode], None


class _HeldTool:
    """The verdict on a held tool: refused, whoever wrote the call, until `tools accept`."""

    by = ReviewerKind.HELD.chain

    def __init__(self, tool: CatalogTool) -> None:
        self._reason = (
            f"{tool.name} is held and runs for no one: {tool.why}"
            f" (the operator accepts it with `mcp-spec-proxy tools accept {tool.name}`)"
        )

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(False, self._reason, len(request.segment) - 1, by=self.by)


class _Authored:
    """The verdict of a call whose author's own standing is its review (strong-authored, baselines)."""

    def __init__(self, kind: ReviewerKind, reason: str) -> None:
        self.by: Chain = kind.chain
        self._reason = reason

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(True, self._reason, len(request.segment), by=self.by)


__all__ = ["STRONG_AUTHORS", "Choice", "Policy"]
