"""A call at the gate, as a value that travels down its stages, and what became of it.

`GateCall` is what a door hands the gate: the tool, the arguments its backend gets, who wrote it,
for which session and principal, and what its reviewer reads. The policy chooses from the whole
of it (`calls/policy.py`), the write stages carry it (`calls/stages.py`), and `Outcome` is what
the last stage returns. Neither is changed on the way: a stage that learns something returns it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from mcp_spec_proxy.calls.results import Author, CallFailed, new_call_id
from mcp_spec_proxy.calls.rules import Decision
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.review import ReviewRequest, Verdict
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import Step


@dataclass
class GateCall:
    """One tool call at the gate: who wrote it, for which session, with what the reviewer reads."""

    session: str
    tool: CatalogTool
    arguments: dict[str, Any]  # as the backend gets them: the `intent` argument already stripped
    author: Author
    request: ReviewRequest  # the held call last in its segment, the history before it
    intent: str | None = None
    baseline: str | None = None  # an operator's baseline run (`run`, benchmarks): the loop's mode
    replaces: str | None = None  # the call id of the rejected call this one stands in for
    flagged: bool = False  # LEASH flagged it: a model verdict is due even if the strong model wrote it
    id: str = field(default_factory=new_call_id)
    key: str | None = None  # the client's idempotency key: at most one call of the session is forwarded with it
    principal: Principal | None = None  # who asks, where the front authenticated them: on its audit lines
    rule: Decision | None = None  # what `rules:` decided (`Policy.decide`); None: the policy decides it at the gate


@dataclass(frozen=True)
class Outcome:
    """What became of a write: its verdict, and the result when it ran. A call that was
    forwarded and failed has `error`, and `result` is that failure as an error result."""

    call: str
    verdict: Verdict
    result: types.CallToolResult | None
    latency_ms: float
    error: CallFailed | None = None
    key: str | None = None  # the call's idempotency key, which a substitute run in its place claims
    step: Step | None = None  # the call as it ran, observed; None when it was not forwarded

    @property
    def forwarded(self) -> bool:
        return self.result is not None


__all__ = ["GateCall", "Outcome"]
