"""The one write gate: the only way a tool call reaches a backend, whoever authored it.

Every door hands its calls here — the MCP front's `tools/call` (through the barrier), the
engine's drafted and strong-led steps (`delegate`, `run`, the gateway), a reviewer's
replacement and the repair turn — and the gate applies one policy to all of them:

    read   forward at once; one audit line (group-committed, not fsynced on its own); `calls/reads.py`
    write  resolve the tool's effective reviewer once → audit `held` (fsynced)
           → verdict → audit `verdict` (fsynced) → forward only if accepted → audit `forwarded`

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

Where an audit line cannot be written decides what the caller is told. Before the forward (its
`held`, `verdict`, `edited` line, its key's claim) the write is refused — `StateError`, saying it
was not forwarded — and its terminal line (`abandoned`) is left to the sink to write when it can
(`AuditSink.later`). After the forward (`forwarded`, `unsent`, `forward-interrupted`, and a
`blocked`) the backend's real outcome stands: the line is left to the sink, and a result says in
its `_meta` (`AUDIT_META`) that its audit line is late. So no call stays `held` for ever while
the process lives, and nothing that ran is reported as not run.

A client's write that carries an idempotency key (`GateCall.key`) is forwarded only if the key
is still free in its session: the gate claims it through the audit sink just before the forward
(every replica sees a Postgres store's claim), and a call that finds it taken is refused
(`CallReplayed`, naming the call that holds it) and audited `blocked`. A substitute of a rejected
call claims its client's key, since it runs in that call's place.

A backend's tool result leaves the gate through `provenance.from_backend` on both doors (`_forward`
for writes and their substitutes, `read` for every read): it never carries the mark of the proxy's
own words, which `error_result` gives every result the proxy writes, so a client tells them apart
on every path.

A reviewer that fails or times out becomes a refusing verdict (or, with `review.on_error:
allow`, an accepting one); the exception never reaches the door. A verdict and its reason are
capped before they are written, so a model cannot flood the audit trail.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.calls.drain import SHUT_DOWN, Drain
from mcp_spec_proxy.calls.policy import Policy
from mcp_spec_proxy.calls.provenance import from_backend, noted
from mcp_spec_proxy.calls.reads import Reads
from mcp_spec_proxy.calls.results import (
    AUDIT_META,
    CALL_FAILED,
    AuditCall,
    Author,
    CallFailed,
    Read,
    Report,
    capped,
    failed_result,
    new_call_id,
)
from mcp_spec_proxy.calls.rules import Decision, Rules
from mcp_spec_proxy.config.schema import ProxyConfig, ReviewMode
from mcp_spec_proxy.errors import (
    BackendClosed,
    BackendUnavailable,
    CallReplayed,
    ShuttingDown,
    StateError,
)
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.observe.logs import about_call
from mcp_spec_proxy.observe.telemetry import Tracing
from mcp_spec_proxy.principal import Principal, who
from mcp_spec_proxy.review import InputNeeded, Reviewer, ReviewFailed, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import ReviewerKind
from mcp_spec_proxy.review.waiting import asks_a_person, waiting_note, with_heartbeat
from mcp_spec_proxy.tools.catalog import Catalog, CatalogTool, digest
from mcp_spec_proxy.trajectory import Step, observation_text

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

logger = logging.getLogger(__name__)

Executor = Callable[[CatalogTool, dict[str, Any], "Report | None"], Awaitable[types.CallToolResult]]
"""Runs an accepted call somewhere other than a backend (the gateway's client tools)."""


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
    rule: Decision | None = None  # what `rules:` decided (`Policy.decide`); None: the gate decides it here


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


class Gate(Reads, Policy):
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
        self._config = config
        self._backends = backends
        self._reviewers = reviewers
        self._audit = audit
        self._leash = leash
        self._catalog = catalog  # to reread `tools accept` before refusing a held tool
        self.rules = Rules(config.rules, config.review.default)
        self.drain = Drain()  # the calls in flight; on SIGTERM, no new ones (calls/drain.py)
        self.tracing = tracing or Tracing(None)  # each call's spans, where traces are on (observe/telemetry.py)

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
            return await self._write(call, user, report, strong, verified, executor, step, decided)

    async def _write(
        self,
        call: GateCall,
        user: UserChannel,
        report: Report | None,
        strong: Reviewer | None,
        verified: bool,
        executor: Executor | None,
        step: Step | None,
        decided: Callable[[Verdict], Awaitable[None]] | None,
    ) -> Outcome:
        tool = call.tool
        call = dataclasses.replace(call, request=_named(call))
        decision = call.rule
        if decision is None:
            decision = self.decide(tool, call.arguments, call.principal, call.session)[1]
        reviewer, flagged = await self._reviewer(call, strong, verified, decision)
        if call.flagged and flagged is None:
            # The engine's shadow observer flagged it (its score is in telemetry): audited here like
            # the front's, whichever reviewer the call meets, so the trail has every escalation.
            flagged = {"to": reviewer.by.text, "layer": "flagged by the engine"}
        common: AuditCall = {
            "call": call.id,
            "session": call.session,
            "tool": tool.name,
            "server": tool.server,
            "arguments_digest": digest(call.arguments),
            "effect": tool.effect,
            "why": tool.why,
            "author": call.author,
            "reviewer": reviewer.by.text,
        }
        if call.replaces:
            common["replaces"] = call.replaces
        if decision.rule is not None:  # the rule that decided it, and why it failed closed if it did
            common["rule"] = decision.rule
        if decision.failed is not None:
            common["rule_failed"] = capped(decision.failed)
        if call.key is not None:
            common["key"] = digest(call.key)  # a digest: the key is the client's text
        if call.principal is not None:
            common["principal"] = call.principal.audit_fields()  # on every line of the call (`_ids`)
        await self._before(call, "held", **common, segment_length=len(call.request.segment))
        logger.debug("%s held for its verdict (reviewer %s)", tool.name, reviewer.by.text)
        if flagged is not None:
            await self._before(call, "leash-escalated", **_ids(call), **flagged)
        started = time.perf_counter()
        settled = False  # its terminal line (`blocked`) is written: a cancel after it abandons nothing
        try:
            request = call.request
            with self.drain.holding() as hold, self.tracing.review(reviewer.by) as review:
                verdict = review.decided(await self._review(reviewer, request, user, report))
            if hold.cancelled_caught:  # the drain's grace ran out while it was held
                with anyio.CancelScope(shield=True):
                    await self._after("abandoned", **common, reason=SHUT_DOWN)
                raise ShuttingDown(
                    f"{tool.name} was not forwarded (call {call.id}): {SHUT_DOWN} while it waited for its verdict"
                )
            latency_ms = round((time.perf_counter() - started) * 1000, 3)
            await self._before(
                call,
                "verdict",
                **common,
                accepted=verdict.accepted,
                reason=capped(verdict.reason),
                accepted_steps=verdict.accepted_steps,
                decided_by=verdict.reviewer,
                latency_ms=latency_ms,
                **({"evidence": verdict.evidence} if verdict.evidence else {}),
            )
            logger.debug("%s %s by %s", tool.name, "accepted" if verdict.accepted else "rejected", verdict.reviewer)
            if decided is not None:
                await decided(verdict)
            if not verdict.accepted:
                settled = True
                with anyio.CancelScope(shield=True):  # once begun, the terminal line is written whole
                    await self._after("blocked", **_ids(call))
                await self._label(call, verdict)
                return Outcome(call.id, verdict, None, latency_ms, key=call.key)
            step = step or Step(tool.name, call.arguments, tool.effect, intent=call.intent)
            arguments, edit_note = call.arguments, None
            edited: dict[str, Any] | None = None  # what a person rewrote the call to, which LEASH learns
            if verdict.arguments is not None and verdict.arguments != call.arguments:
                # A person edited the call on the approval console (validated there against its schema).
                digests = {"original_digest": digest(call.arguments), "edited_digest": digest(verdict.arguments)}
                await self._before(call, "edited", **_ids(call), by=verdict.reviewer, **digests)
                # What runs is a new step: the segment the reviewer was shown keeps the call as it was sent.
                arguments = edited = dict(verdict.arguments)
                step = dataclasses.replace(step, arguments=arguments)
                # The agent is told what ran: else it believes its own arguments did, and builds on that.
                shown = capped(json.dumps(arguments, ensure_ascii=False))
                edit_note = (
                    f"[mcp-spec-proxy] the reviewer ({verdict.reviewer}) changed this call's arguments before"
                    f" approving it: {tool.name} ran with {shown}, not with the arguments you sent. Its result follows."
                )
            if call.key is not None:
                await self._claim(call)
        except InputNeeded:
            await self._before(call, "awaiting-input", **common)
            raise
        except anyio.get_cancelled_exc_class():
            # Cancelled from outside before the forward (in its review, or while its verdict, edit or
            # key was made durable): by its client, or by the replica stopping after (or during) a drain.
            if not settled:
                why = SHUT_DOWN if self.drain.ending else "the client cancelled or disconnected"
                with anyio.CancelScope(shield=True):
                    await self._after("abandoned", **common, reason=why)
            raise
        try:
            if executor is not None:
                ran = await _execute(executor, tool, arguments, step, report)
            else:
                ran = await self._forward(tool, arguments, step, report)
        except BaseException as exc:  # cancelled (or worse) mid-send: the call may have run
            why = SHUT_DOWN if self.drain.ending else type(exc).__name__
            with anyio.CancelScope(shield=True):
                await self._after(
                    "forward-interrupted",
                    **_ids(call),
                    reason=f"{why} while forwarding: the backend may or may not have run it",
                )
            raise
        if (error := ran.error) is not None:
            # A backend that was not connected was sent nothing: the audit says so, not "forwarded".
            sent = not isinstance(error, BackendUnavailable) or isinstance(error, BackendClosed)
            event = "forwarded" if sent else "unsent"
            await self._after(event, **_ids(call), is_error=True, error_code=error.code)
            await self._label(call, verdict, edited)
            failed = noted(edit_note, ran.result, structured=True) if edit_note else ran.result
            return Outcome(call.id, verdict, failed, latency_ms, error=error, key=call.key, step=ran.step)
        result = ran.result
        late = await self._after("forwarded", **_ids(call), is_error=bool(result.is_error))
        if late is not None:
            # It ran: the client gets the backend's result, told that its audit line is late.
            note = f"the backend ran this call; its audit line could not be written yet ({late}): it is retried"
            result = result.model_copy(update={"meta": {**(result.meta or {}), AUDIT_META: note}})
        if edit_note is not None:
            result = noted(edit_note, result, structured=True)
        await self._label(call, verdict, edited)  # after the write: a slow bank never delays an accepted call
        return Outcome(call.id, verdict, result, latency_ms, key=call.key, step=ran.step)

    async def _before(self, gated: GateCall, kind: str, /, **fields: Any) -> None:
        """A line the forward waits for. When it cannot be written the write is refused, and the
        call's terminal line (`abandoned`) is left to the sink: the call never stays `held`."""
        try:
            await self._audit.record(kind, **fields)
        except StateError as exc:
            self._audit.later("abandoned", **_ids(gated), reason=f"its {kind} line: {exc}")
            raise StateError(
                f"{exc}: {gated.tool.name} was not forwarded (call {gated.id}) — no write runs without its audit"
                " line; writes are refused until the audit trail takes lines again, reads keep working"
            ) from None

    async def _after(self, kind: str, **fields: Any) -> str | None:
        """A line about what already happened (the forward, a refusal): when it cannot be written
        now the sink keeps it and writes it later; the problem, or None when it was written."""
        try:
            await self._audit.record(kind, **fields)
        except StateError as exc:
            self._audit.later(kind, **fields)
            return str(exc)
        return None

    async def _claim(self, call: GateCall) -> None:
        """Take the call's idempotency key before it is forwarded, or refuse the call."""
        assert call.key is not None
        try:
            first = await self._audit.claim(call.session, digest(call.key), call.id, **who(call.principal))
        except StateError as exc:
            self._audit.later("abandoned", **_ids(call), reason=f"its key's claim: {exc}")
            raise StateError(f"{exc}: {call.tool.name} was not forwarded (call {call.id})") from None
        if first is None:
            return
        reason = f"its idempotency key belongs to call {first}, which may have run"
        with anyio.CancelScope(shield=True):  # its terminal line: a cancel now must not add `abandoned`
            await self._after("blocked", **_ids(call), reason=reason)
        raise CallReplayed(
            first,
            f"{call.tool.name} was not forwarded: its idempotency key was used by call {first} of this session"
            " (forwarded, or about to be; `mcp-spec-proxy audit` shows its outcome) — send a new key for a new call",
        )

    async def _label(self, call: GateCall, verdict: Verdict, ran: dict[str, Any] | None = None) -> None:
        """Labels for free: a judgement's accepted prefix succeeded, its first rejected step failed.

        Each label says who judged which session's call, so `review: leash` never takes a
        session's (or its client's) own accepted calls as evidence for its next one. `ran` is
        what the held call ran with: a person's edit is what was approved, so the held step is
        labelled with it, never with the arguments the person rewrote."""
        if self._leash is not None and verdict.by.judged:
            from mcp_spec_proxy.leash.provenance import Provenance  # LEASH loads only with a `leash:` section

            provenance = Provenance(
                "verdict", verdict.reviewer, "proxy", call.session, call.request.client, time.time()
            )
            steps = call.request.segment.steps
            if ran is not None and steps:
                steps = (*steps[:-1], dataclasses.replace(steps[-1], arguments=dict(ran)))
            await self._leash.label_verdict(steps, verdict.accepted_steps, provenance=provenance)

    async def _review(
        self, reviewer: Reviewer, request: ReviewRequest, user: UserChannel, report: Report | None
    ) -> Verdict:
        """The verdict, or a refusing one when the reviewer fails; `InputNeeded` passes through."""
        held = len(request.segment)
        calls: tuple[ModelCall, ...] = ()
        try:
            with anyio.fail_after(self._config.review.timeout):
                if report is None:
                    return await reviewer.review(request, user)
                return await with_heartbeat(reviewer, request, user, report)
        except TimeoutError:
            problem = f"review by {reviewer.by.text} timed out after {self._config.review.timeout:g}s"
            if note := waiting_note(reviewer):
                problem += f" (no decision came: {note})"
        except InputNeeded:
            raise
        except ReviewFailed as exc:
            problem, calls = f"review by {reviewer.by.text} failed: {exc}", exc.calls
        except Exception as exc:  # boundary: a reviewer failure must become a verdict, never a forward
            logger.exception("reviewer %s failed", reviewer.by.text)
            problem = f"review by {reviewer.by.text} failed: {type(exc).__name__}: {exc}"
        if self._config.review.on_error == "allow" and not asks_a_person(reviewer):
            # `on_error: allow` forgives a model's failure, never a person's silence.
            reason = f"{problem}; allowed because review.on_error is allow"
            return Verdict(True, reason, held, by=_ON_ERROR, model_calls=calls)
        return Verdict(False, f"{problem}; failing closed", held - 1, by=_ON_ERROR, model_calls=calls, failed=True)

    # -- forwarding --------------------------------------------------------------------------

    async def _forward(
        self, tool: CatalogTool, arguments: dict[str, Any], step: Step, report: Report | None
    ) -> Read[types.CallToolResult]:
        """Send an accepted write to its backend (reads have their own door, `calls/reads.py`). A
        `CallFailed` comes back as the call's `error`, with the step that observed it."""
        started = time.perf_counter()
        try:
            with self.tracing.forward(tool):
                result = from_backend(await self._backends.get(tool.server).call_tool(tool.original, arguments, report))
        except CALL_FAILED as exc:
            failed = failed_result(tool, exc)
            return Read(_observe(step, failed, started), failed, exc)
        except Exception as exc:  # boundary: any other fault of the call, answered or not, is its error result
            result = failed_result(tool, exc)
        return Read(_observe(step, result, started), result)

    def note(self, kind: str, **fields: Any) -> None:
        """A best-effort audit line about something the front answered itself (a replayed key's outcome)."""
        self._audit.note(kind, **fields)

    async def record(self, kind: str, **fields: Any) -> None:
        """An audit line about a decision that sends nothing anywhere (the engine's graded answers)."""
        if isinstance(fields.get("reason"), str):
            fields["reason"] = capped(fields["reason"])
        await self._audit.record(kind, **fields)


def _ids(call: GateCall) -> dict[str, Any]:
    """What names a call on each of its audit lines: its id, its session and who asked."""
    return {"call": call.id, "session": call.session, **who(call.principal)}


_ON_ERROR = ReviewerKind.ON_ERROR.chain  # a verdict the gate gave for a reviewer that gave none


def _named(call: GateCall) -> ReviewRequest:
    """The request its reviewer reads, named by the call's id and by who asks: the approval console
    shows the principal, and LEASH labels and distrusts by the client — the session's, else the
    principal's key (a substitute's request, `delegate`'s steps), so one principal's sessions are one client."""
    request, principal = call.request, call.principal
    client = request.client or (principal.key if principal is not None else None)
    return dataclasses.replace(request, call=call.id, principal=principal, client=client)


def _observe(step: Step, result: types.CallToolResult, started: float) -> Step:
    """`step` as it ran: a new step with what `result` says, never an edit of the one held."""
    text = observation_text([block.model_dump(mode="json") for block in result.content])
    return step.observed(text, is_error=bool(result.is_error), duration_s=time.perf_counter() - started)


async def _execute(
    executor: Executor, tool: CatalogTool, arguments: dict[str, Any], step: Step, report: Report | None
) -> Read[types.CallToolResult]:
    """An accepted call run by `executor` (not a backend), as `_forward` returns a backend's."""
    started = time.perf_counter()
    try:
        result = await executor(tool, arguments, report)
    except CALL_FAILED as exc:
        failed = failed_result(tool, exc)
        return Read(_observe(step, failed, started), failed, exc)
    return Read(_observe(step, result, started), result)


__all__ = ["Gate", "GateCall", "Outcome"]
