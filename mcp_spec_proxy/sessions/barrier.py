"""The MCP front's session: run reads at once, hold writes, hand every call to the gate.

`Barrier.call()` is a client's `tools/call` on its way to a backend:

    look up → validate arguments → strip `intent` → the gate: a read runs now; a write is held
    until its verdict (`calls/gate.py`) → a rejected write may be replaced or repaired, and that
    substitute meets the gate again, under its own tool's policy

The barrier owns the session's trajectory (what the reviewer sees: the reads that led to a
write) and the client-facing texts of what happened; the gate owns policy, audit and forwarding.
A call whose client goes away while it is held is abandoned, never forwarded later.

A session's writes are settled one at a time: a write the client sends while another of the same
session is out for review waits for that one's verdict (and its run) before it is held. Its
segment is then the steps since that commit point, so each executed read is reviewed in one
segment and committed once, and the second write's reviewer sees the first as committed history
(it ran, or it did not) instead of judging two calls blind to each other. Reads never wait.

A forwarded call that gets no result (the gate's `CallFailed`) is raised to the front after its
step is kept: the client gets the backend's own JSON-RPC error, or the proxy's. A substitute's
failure is told in its result instead, since the client did not call that tool.

`Barrier.read_tool()` and `read_json()` are the lean front's door for a client's read: the same
lookup, validation and gate (its audit line included), the result as wire JSON, unchanged.
`read_tool` declines (None) every call that is not a read of a tool the catalog holds as one,
and `call` takes those. Both doors feed one read (`_read` → `Gate.read`): `call` only turns its
wire JSON into the model the SDK's handler returns.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types

from mcp_spec_proxy.calls.gate import Gate, GateCall, Outcome
from mcp_spec_proxy.calls.provenance import noted
from mcp_spec_proxy.calls.results import (
    Author,
    Report,
    WireResult,
    as_model,
    as_wire,
    blocked_result,
    capped,
    error_result,
    new_call_id,
)
from mcp_spec_proxy.calls.rules import Decision
from mcp_spec_proxy.calls.trail import on_trail
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import InvalidArguments, ToolNotFound
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.observe.telemetry import Telemetry
from mcp_spec_proxy.principal import Principal, who
from mcp_spec_proxy.prompts import step_json
from mcp_spec_proxy.review import ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.strong import ProposedStep, Repairer, check_step
from mcp_spec_proxy.store.sessions import LocalSessions, SessionStore
from mcp_spec_proxy.tools.catalog import Catalog, CatalogTool, strip_intent
from mcp_spec_proxy.tools.classification import HELD_REASONS
from mcp_spec_proxy.trajectory import History, Segment, Step

logger = logging.getLogger(__name__)


def _text(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


__all__ = ["ALONE_NOTE", "Barrier", "Report", "Session", "blocked_result", "error_result"]

ALONE_NOTE = (
    "[mcp-spec-proxy] this request named no session, so this write was reviewed as a session of its own:"
    " its reviewer saw none of the calls this client made before it. To have a write reviewed with the"
    " reads that led to it, the client sends the header `Mcp-Spec-Proxy-Session: <one name per"
    ' conversation>` on every request (or `_meta["mcp-spec-proxy/session"]`). Its result follows.'
)
"""What a write's result says first when its 2026-07-28 request over HTTP named no session."""


def alone_noted(result: types.CallToolResult) -> types.CallToolResult:
    """`result` with `ALONE_NOTE` leading it, marked as the proxy's, the backend's `_meta` kept."""
    marked = noted(ALONE_NOTE, result, structured=True)
    return marked.model_copy(update={"meta": {**(result.meta or {}), **(marked.meta or {})}})


@dataclass
class Session:
    """One client session's trajectory."""

    id: str
    history: History = field(default_factory=History)
    # Held, reviewed, run (or not) and settled one at a time: see the module docstring.
    writes: anyio.Lock = field(default_factory=anyio.Lock, repr=False, compare=False)
    # Who the client is, where a front authenticated it (`principal.key`): LEASH records it with each label.
    client: str | None = None
    # The principal that opened the session, where the HTTP front authenticates (`auth:`); the
    # audit names it on each call and `rules:` read it. Only a verified token makes one (`principal.py`).
    principal: Principal | None = None
    # A 2026-07-28 request over HTTP that named no session (`named_sessions.py`): a session of its own,
    # whose write is reviewed without the client's earlier reads. Its result says so where a reviewer
    # judged it (`ALONE_NOTE`).
    alone: bool = False


class Barrier:
    def __init__(
        self,
        config: ProxyConfig,
        catalog: Catalog,
        gate: Gate,
        telemetry: Telemetry | None = None,
        repairer: Repairer | None = None,
        sessions: SessionStore | None = None,
    ) -> None:
        self._config = config
        # Where each change to a session's history is kept: in memory, or shared by every replica.
        self._sessions: SessionStore = sessions or LocalSessions()
        self._catalog = catalog
        self.gate = gate
        self._telemetry = telemetry or Telemetry(None)
        self._repairer = repairer

    def new_session(self, session_id: str | None = None, principal: Principal | None = None) -> Session:
        commit_every = self._config.speculation.draft_steps
        history, client = History(commit_every=commit_every), principal.key if principal is not None else None
        return Session(session_id or uuid.uuid4().hex[:12], history, client=client, principal=principal)

    async def call(
        self,
        session: Session,
        name: str,
        arguments: dict[str, Any],
        user: UserChannel,
        report: Report | None = None,
        *,
        call: str | None = None,
        key: str | None = None,
    ) -> types.CallToolResult:
        """`call` names the call on the audit trail (the front's id); `key` is the client's
        idempotency key, which the gate lets only one write of the session be forwarded with.

        The call takes its drain slot here, before it waits for the session's earlier write: once
        admitted, its wait, its gate calls and a substitute of it are in flight, never refused."""
        with self.gate.admitted(session.id, name, call, session.principal):
            return await self._call(session, name, arguments, user, report, call, key)

    async def _call(
        self,
        session: Session,
        name: str,
        arguments: dict[str, Any],
        user: UserChannel,
        report: Report | None,
        call: str | None,
        key: str | None,
    ) -> types.CallToolResult:
        prepared = await self._prepare(session, name, arguments)  # ToolNotFound: a protocol error, raised to the front
        if isinstance(prepared, types.CallToolResult):
            return prepared
        tool, forwarded, intent, rule = prepared
        if tool.effect == "read":  # the SDK's handler wants the model; the pipeline builds none
            return as_model(await self._read(session, tool, forwarded, report, call, rule))
        waited = session.writes.locked()
        queued = call if waited and key is not None else None
        if queued is not None:  # a replay of it may be told of it while it waits: the trail knows it first
            fields = {"call": queued, "session": session.id, "tool": tool.name, **who(session.principal)}
            await self.gate.record("queued", **fields, reason="it waits behind an earlier write of its session")
            on_trail()
        why = "it never reached its review: it ended while it waited behind an earlier write of its session"
        try:
            async with session.writes:
                if waited:
                    # The catalog may have changed while the earlier write was decided (a rug pull
                    # makes the tool held): this call meets the tool as it is now, held like a write.
                    prepared = await self._prepare(session, name, arguments)
                    if isinstance(prepared, types.CallToolResult):
                        why = f"it was refused before its review: {_text(prepared)}"
                        return prepared
                    tool, forwarded, intent, rule = prepared
                why = ""
                return await self._hold(session, tool, forwarded, intent, user, report, call, key, rule)
        finally:
            if queued is not None and why:  # its `queued` line does not stay without an end
                self.gate.note("abandoned", **fields, reason=capped(why))

    async def _prepare(
        self, session: Session, name: str, arguments: dict[str, Any]
    ) -> tuple[CatalogTool, dict[str, Any], str | None, Decision] | types.CallToolResult:
        """The tool as this call meets it (`rules:` may make a read a write), the arguments its
        backend gets, the stated intent and what the rules decided; or why the call is refused."""
        tool = self._catalog.lookup(name)
        if tool.reason in HELD_REASONS:
            # `tools accept` may have run since: reread only for tools under suspicion (a small file,
            # or the database with a short bound: the last copy serves when it is slow).
            await self._catalog.refresh_fingerprints()
            tool = self._catalog.lookup(name)
        try:
            self._catalog.validate(tool, arguments)
        except InvalidArguments as exc:
            return error_result(str(exc))
        forwarded, intent = strip_intent(tool, arguments)
        tool, rule = self.gate.policy.decide(tool, forwarded, session.principal, session.id)
        return tool, forwarded, intent, rule

    def read_tool(self, name: str) -> CatalogTool | None:
        """The tool, if `name` is one the catalog holds as a read right now; None for a write, a
        tool whose definition is held, an unknown name. Those take `call`, which holds, re-checks
        or refuses them; only a tool returned here may go to `read_json`. Where a rule may make a
        read a write (`effect: write`, `deny:`), no read is one before its arguments are read."""
        if self.gate.policy.rules.make_writes:
            return None
        try:
            tool = self._catalog.lookup(name)
        except ToolNotFound:
            return None
        return tool if tool.effect == "read" and tool.reason not in HELD_REASONS else None

    async def read_json(
        self, session: Session, tool: CatalogTool, arguments: dict[str, Any], call: str | None = None
    ) -> WireResult:
        """`call` for a read (`read_tool`), its result as wire JSON."""
        current = self.read_tool(tool.name)
        if current is None:
            # A listing refresh landed since `read_tool` said read (a rug pull, a tool withdrawn).
            why = f"{tool.name} changed while this call waited to run, and nothing ran; call it again"
            return as_wire(error_result(why))
        tool = current
        try:
            self._catalog.validate(tool, arguments)
        except InvalidArguments as exc:
            return as_wire(error_result(str(exc)))
        forwarded, _ = strip_intent(tool, arguments)
        _, rule = self.gate.policy.decide(tool, forwarded, session.principal, session.id)  # no rule here makes a write
        return await self._read(session, tool, forwarded, None, call, rule)

    async def _read(
        self,
        session: Session,
        tool: CatalogTool,
        arguments: dict[str, Any],
        report: Report | None,
        call: str | None,
        rule: Decision | None = None,
    ) -> WireResult:
        """The one read of a client's call, whichever door it came by: through the gate, its step
        as it ran kept in the session's history (the store's) whether it got a result or its `CallFailed`."""
        step = Step(tool.name, arguments, "read")
        ran = await self.gate.read(
            session.id, tool, arguments, step, "client", report, call, rule, principal=session.principal
        )
        await self._sessions.read(session.id, session.history, ran.step)
        if ran.error is not None:  # the backend's error, or the proxy's own: the read still happened
            raise ran.error
        return ran.result

    async def _hold(
        self,
        session: Session,
        tool: CatalogTool,
        arguments: dict[str, Any],
        intent: str | None,
        user: UserChannel,
        report: Report | None,
        call_id: str | None = None,
        key: str | None = None,
        rule: Decision | None = None,
    ) -> types.CallToolResult:
        held = Step(tool.name, arguments, "write", intent=intent)
        segment = await self._sessions.hold(session.id, session.history, held)
        request = ReviewRequest(session.id, tool, arguments, intent, segment, session.history, client=session.client)
        call = GateCall(
            session.id,
            tool,
            arguments,
            "client",
            request,
            intent=intent,
            id=call_id or new_call_id(),
            key=key,
            principal=session.principal,
            rule=rule,
        )
        try:
            outcome = await self.gate.write(call, user, report, step=held)
        except BaseException:  # waiting for the user's answer, or the client went away: not settled
            with anyio.CancelScope(shield=True):
                await self._sessions.release(session.id, session.history, segment)
            raise
        verdict = outcome.verdict
        model_calls = list(verdict.model_calls)
        if outcome.result is not None:
            # The held call commits as it ran (`outcome.step`: observed), not as the reviewer saw it.
            await self._sessions.settle(session.id, session.history, segment, len(segment), outcome.step)
            result, action = outcome.result, "forwarded"
        else:
            try:
                alternative = await self._alternative(tool, request, verdict, model_calls)
                if isinstance(alternative, ProposedStep):
                    action = "replaced" if alternative.source == "replacement" else "repaired"
                    result = await self._substitute(session, segment, tool, outcome, alternative, user, report)
                else:
                    result, action = blocked_result(tool, verdict, alternative), "blocked"
            except BaseException:  # the substitute waits for the user, or the client left: the call stays rejected
                with anyio.CancelScope(shield=True):
                    await self._settle_rejected(session, segment, verdict)
                raise
            if action == "blocked":
                await self._settle_rejected(session, segment, verdict)
        await self._telemetry.record(
            "decision",
            session=session.id,
            call=outcome.call,
            tool=tool.name,
            segment=[step_json(step, n) for n, step in enumerate(segment.steps, 1)],
            verdict={
                "accepted": verdict.accepted,
                "reason": capped(verdict.reason),
                "accepted_steps": verdict.accepted_steps,
                "replacement_action": verdict.replacement_action,
                "reviewer": verdict.reviewer,
            },
            action=action,
            review_latency_ms=outcome.latency_ms,
            model_calls=[call.as_json() for call in model_calls],
        )
        if action == "forwarded" and outcome.error is not None:
            raise outcome.error  # forwarded, and the backend's error (or the proxy's) is the answer
        # Said where a reviewer judged the steps (a model, a person): a policy (`allow`, `deny`) reads none.
        return alone_noted(result) if session.alone and verdict.by.judged else result

    async def _settle_rejected(self, session: Session, segment: Segment, verdict: Verdict) -> None:
        """The rejected call's segment: its accepted prefix commits, the held call never does."""
        accepted = min(verdict.accepted_steps, len(segment) - 1)
        await self._sessions.settle(session.id, session.history, segment, accepted)

    async def _alternative(
        self, tool: CatalogTool, request: ReviewRequest, verdict: Verdict, model_calls: list[ModelCall]
    ) -> ProposedStep | str:
        """The step to run instead of a rejected call, or why there is none."""
        on_reject = tool.on_reject or self._config.review.on_reject
        if on_reject == "block":
            return ""
        if not verdict.by.proposes or verdict.failed:
            # Only a kind that proposes (the strong model's judgement): policy, the user and failures replace nothing.
            return f"a {verdict.reviewer} verdict proposes no replacement"
        if verdict.accepted_steps < len(request.segment) - 1:
            return "the first rejected step is an earlier call that already ran, so nothing was run instead"
        checked = check_step(self._catalog, verdict.replacement_action)
        if not isinstance(checked, ProposedStep) and on_reject == "repair" and self._repairer is not None:
            repaired, call = await self._repairer.repair(request, verdict)
            if call is not None:
                model_calls.append(call)
            checked = repaired
        # Answers are the engine's business: at the MCP front there is no answer to give.
        return checked if isinstance(checked, ProposedStep | str) else "the reviewer proposed an answer, not a call"

    async def _substitute(
        self,
        session: Session,
        segment: Segment,
        tool: CatalogTool,
        rejected: Outcome,
        step: ProposedStep,
        user: UserChannel,
        report: Report | None,
    ) -> types.CallToolResult:
        """Run the reviewer's replacement (or repair) in place of the rejected call — through the
        gate, under the substitute's own tool policy: a `deny` tool never runs, a `human` one asks."""
        verdict = rejected.verdict
        original = segment.held.tool
        arguments, intent = strip_intent(step.tool, step.arguments)
        # The substitute meets `rules:` as its own call would: a rule may make it a write, or refuse it.
        substitute, rule = self.gate.policy.decide(step.tool, arguments, session.principal, session.id)
        executed = Step(substitute.name, arguments, substitute.effect, intent=intent)
        # The accepted prefix was judged (and labelled) with the rejected call, and commits with
        # whatever happens next: the substitute's reviewer reads it as committed history.
        prefix = segment.steps[: verdict.accepted_steps]
        history = History(session.history.commit_every, [*session.history.committed, *prefix])
        request = ReviewRequest(session.id, substitute, arguments, intent, Segment((executed,)), history)
        author: Author = "replacement" if step.source == "replacement" else "repair"
        if substitute.effect == "read":
            # The client called another tool: its failure is told in words (the read's error result).
            ran = await self.gate.read(
                session.id, substitute, arguments, executed, author, report, rule=rule, principal=session.principal
            )
            inner, executed = as_model(ran.result), ran.step
        else:
            # In the rejected call's place: it claims that call's idempotency key.
            call = GateCall(
                session.id,
                substitute,
                arguments,
                author,
                request,
                intent=intent,
                replaces=rejected.call,
                key=rejected.key,
                principal=session.principal,
                rule=rule,
            )
            outcome = await self.gate.write(call, user, report, step=executed)
            if outcome.result is None:
                await self._settle_rejected(session, segment, verdict)
                refusal = outcome.verdict
                why = f"its {author} {step.tool.name} was refused too ({refusal.reviewer}: {refusal.reason})"
                return blocked_result(tool, verdict, why)
            inner, executed = outcome.result, outcome.step or executed
        await self._sessions.settle(session.id, session.history, segment, verdict.accepted_steps, executed)
        how = "replaced it with" if step.source == "replacement" else "repaired it as"
        note = (
            f"[mcp-spec-proxy] {original} was rejected by the reviewer ({verdict.reason}); the reviewer "
            f"{how} {step.tool.name} {json.dumps(arguments, ensure_ascii=False)}, which ran. Its result follows."
        )
        same = step.tool.name == original
        result = noted(note, inner, structured=same)
        if not same and tool.definition.output_schema is not None and not result.is_error:
            # The client's library checks a success of `original` against its output schema, which
            # another tool's result cannot meet (it would fail the client): the call the client made
            # did not run, so the answer is an error result that says what ran instead.
            result = result.model_copy(update={"is_error": True})
        return result
