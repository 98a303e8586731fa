"""The one write gate: the only way a tool call reaches a backend, whoever authored it.

Every door hands its calls here — the MCP front's `tools/call` (through the barrier), the
engine's drafted and strong-led steps (`delegate`, `run`, the gateway), a reviewer's
replacement and the repair turn — and the gate applies one policy to all of them:

    read   forward at once; one audit line (group-committed, not fsynced on its own); `calls/reads.py`
    write  hold: the policy chooses its reviewer once → audit `held` (fsynced)
           decide: the verdict → audit `verdict` (fsynced)
           run: only if accepted, its key claimed, forwarded once
           settle: audit `forwarded` (or `blocked`, `unsent`), the outcome to the caller

One call id joins a call's lines, with its `author` (client, weak, strong, replacement, repair)
and its `reviewer`; the front chooses it for a client's call and hands it back in the result's
`_meta` (`CALL_META`), so a client and an operator name the same call. The effective reviewer
is a matching rule's (`rules:`, which the audit lines name), else the tool's override or `review.default`, then:

* `deny` never runs, and a person's mode (`human`, `console`) always asks, whoever authored the call;
* a call the strong model authored (strong-led steps, a replacement, a repair) counts as
  reviewed by `strong`, so it needs no second model verdict under a mode a model decides first
  (`strong`, `strong_then_human`, `leash`: `ReviewerKind.met_by_strong_author`);
* a call another author made meets the reviewer it names; a segment the engine drafted in
  `spec` (`verified=True`) always gets the engine's strong verifier, which reviews the whole
  drafted segment in one request — and then the user too, where the tool's reviewer is `human`;
* `allow` forwards with an audit line — unless LEASH's shadow observer flags the call, which
  then goes to the strong model (or the user). Every such escalation, the front's or the
  engine's (`GateCall.flagged`), is audited here as `leash-escalated` on the call's id.

A person may approve an edited call (the approval console): the verdict carries the edited
arguments, the gate audits the edit (`edited`: both digests) and forwards those.

A call that reaches its backend and gets no result — the backend's own JSON-RPC error, or a
failure the proxy saw itself (`BackendError`: its timeout, the connection ending, the size
bound) — is that call's `CallFailed`: carried by a read's `Read` (`calls/reads.py`) and a write's
`Outcome` (`error`) after its audit line, a write's audited as forwarded with its code. The
observed step states the failure either way, so a reviewer and the engine's models see it.
Steps are values: the gate never writes into the step it is handed; what ran comes back as a
new step (`Read.step`, `Outcome.step`) for the caller's history to keep.

Where an audit line cannot be written decides what the caller is told (`calls/trail.py`): before
the forward the write is refused (`StateError`, saying it was not forwarded) and its `abandoned`
line is left to the sink; after it, the backend's real outcome stands and a result says in its
`_meta` (`AUDIT_META`) that its audit line is late. So no call stays `held` for ever while the
process lives, and nothing that ran is reported as not run.

A client's write that carries an idempotency key (`GateCall.key`) is forwarded only if the key
is still free in its session: the gate claims it through the audit sink just before the forward
(every replica sees a Postgres store's claim), and a call that finds it taken is refused
(`CallReplayed`, naming the call that holds it) and audited `blocked`. A substitute of a rejected
call claims its client's key, since it runs in that call's place.

A backend's tool result leaves the gate through `provenance.from_backend` on both doors (the `run`
stage for writes and their substitutes, `read` for every read): it never carries the mark of the proxy's
own words, which `error_result` gives every result the proxy writes, so a client tells them apart
on every path.

The gate is composed, not mixed in: it holds its policy (`calls/policy.py`: which reviewer a call
meets, chosen from the whole call), its read door (`calls/reads.py`), its drain, and the write
stages (`calls/stages.py`); each write's lines go to the audit trail it holds (`calls/trail.py`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.calls.call import GateCall, Outcome
from mcp_spec_proxy.calls.drain import Drain
from mcp_spec_proxy.calls.policy import Policy
from mcp_spec_proxy.calls.reads import Reads
from mcp_spec_proxy.calls.results import Author, Read, Report, WireResult, capped
from mcp_spec_proxy.calls.rules import Decision
from mcp_spec_proxy.calls.stages import Executor, WriteStages
from mcp_spec_proxy.calls.trail import Trail
from mcp_spec_proxy.config.schema import ProxyConfig, ReviewMode
from mcp_spec_proxy.observe.logs import about_call
from mcp_spec_proxy.observe.telemetry import Tracing
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.review import Reviewer, UserChannel, Verdict
from mcp_spec_proxy.tools.catalog import Catalog, CatalogTool, digest
from mcp_spec_proxy.trajectory import Step

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash


class Gate:
    """The one gate: its policy, its read door, its drain, the write stages, and the audit trail."""

    def __init__(
        self,
        config: ProxyConfig,
        backends: BackendPool,
        reviewers: Mapping[ReviewMode, Reviewer],
        audit: AuditSink,
        leash: Leash | None = None,
        catalog: Catalog | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._audit = audit
        self.policy = Policy(config, reviewers, leash, catalog)
        self.drain = Drain()  # the calls in flight; on SIGTERM, no new ones (calls/drain.py)
        self.tracing = tracing or Tracing(None)  # each call's spans, where traces are on (observe/telemetry.py)
        self.reads = Reads(backends, audit, self.drain, self.tracing)
        self._stages = WriteStages(config.review, self.policy, backends, self.drain, self.tracing, leash)

    # -- writes ------------------------------------------------------------------------------

    async def write(
        self,
        call: GateCall,
        user: UserChannel,
        report: Report | None = None,
        *,
        strong: Reviewer | None = None,
        verified: bool = False,
        executor: Executor | None = None,
        step: Step | None = None,
        decided: Callable[[Verdict], Awaitable[None]] | None = None,
    ) -> Outcome:
        """Hold `call` until the verdict its tool's policy asks for; forward it only if accepted.

        `strong` replaces the configured strong reviewer for this call (the engine's verifier over
        its own tool view); `verified` says the loop verifies this segment with it whatever the
        tool's reviewer (SpecAgent's `spec`); `executor` runs an accepted call that is not a backend's;
        `decided` hears the verdict once it is audited, before anything runs (a client's tool may
        run only at the client's next request, and the verdict belongs to this one).
        """
        spans = self.tracing.call(call.id, call.tool, call.author, call.principal)
        admitted = self.admitted(call.session, call.tool.name, call.id, call.principal)
        with admitted, about_call(call.id, call.session), spans:
            stages = self._stages
            held = await stages.hold(call, Trail(self._audit, call), strong, verified)
            verdict = await stages.decide(held, user, report, step, decided)
            ran = await stages.run(held, verdict, executor, report) if verdict.verdict.accepted else None
            return await stages.settle(held, verdict, ran)

    # -- the read door -----------------------------------------------------------------------

    async def read(
        self,
        session: str,
        tool: CatalogTool,
        arguments: dict[str, Any],
        step: Step,
        author: Author = "client",
        report: Report | None = None,
        call: str | None = None,
        rule: Decision | None = None,
        principal: Principal | None = None,
    ) -> Read[WireResult]:
        """Forward a read at once (`Reads.read`)."""
        return await self.reads.read(session, tool, arguments, step, author, report, call, rule, principal)

    @contextmanager
    def admitted(
        self, session: str, what: str, call: str | None = None, principal: Principal | None = None, **about: Any
    ) -> Iterator[None]:
        """The drain's slot for one call, a refusal audited with who asked (`Reads.admitted`)."""
        with self.reads.admitted(session, what, call, principal, **about):
            yield

    # -- lines about what the front or the engine did itself ---------------------------------

    async def key_holder(self, session: str, key: str) -> str | None:
        """The call that holds the client's idempotency `key` in `session` at the gate (the first call
        with it to reach its forward, on any replica), or None."""
        return await self._audit.holder(session, digest(key))

    def note(self, kind: str, **fields: Any) -> None:
        """A best-effort audit line about something the front answered itself (a replayed key's outcome)."""
        self._audit.note(kind, **fields)

    async def record(self, kind: str, **fields: Any) -> None:
        """An audit line about a decision that sends nothing anywhere (the engine's graded answers)."""
        if isinstance(fields.get("reason"), str):
            fields["reason"] = capped(fields["reason"])
        await self._audit.record(kind, **fields)


__all__ = ["Executor", "Gate", "GateCall", "Outcome"]
