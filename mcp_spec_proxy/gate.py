"""The one write gate: the only way a tool call reaches a backend, whoever authored it.

Every door hands its calls here — the MCP front's `tools/call` (through the barrier), the
engine's drafted and strong-led steps (`delegate`, `run`, the gateway), a reviewer's
replacement and the repair turn — and the gate applies one policy to all of them:

    read   forward at once; one audit line (group-committed, not fsynced on its own)
    write  resolve the tool's effective reviewer once → audit `held` (fsynced)
           → verdict → audit `verdict` (fsynced) → forward only if accepted → audit `forwarded`

One call id joins a call's lines, with its `author` (client, weak, strong, replacement, repair)
and its `reviewer`; the front chooses it for a client's call and hands it back in the result's
`_meta` (`CALL_META`), so a client and an operator name the same call. The effective reviewer
is the tool's override or `review.default`, then:

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
bound) — is that call's `CallFailed`: raised from `read` and `read_json` after its audit line,
and carried by a write's `Outcome` (`error`), audited as forwarded with its code. The step's
observation states the failure either way, so a reviewer and the engine's models see it.

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
and `read_json`): it never carries the mark of the proxy's own words, which `error_result` gives
every result the proxy writes, so a client tells them apart on every path.

A reviewer that fails or times out becomes a refusing verdict (or, with `review.on_error:
allow`, an accepting one); the exception never reaches the door. A verdict and its reason are
capped before they are written, so a model cannot flood the audit trail.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio
import mcp_types as types
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError

from mcp_spec_proxy.audit import AuditSink
from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.catalog import Catalog, CatalogTool, digest, is_held
from mcp_spec_proxy.config import ProxyConfig, ReviewMode
from mcp_spec_proxy.drain import SHUT_DOWN, SHUTTING_DOWN_REASON, Drain
from mcp_spec_proxy.errors import (
    BackendClosed,
    BackendError,
    BackendUnavailable,
    CallReplayed,
    ShuttingDown,
    StateError,
    ToolNotFound,
)
from mcp_spec_proxy.logs import about_call
from mcp_spec_proxy.models import ModelCall
from mcp_spec_proxy.provenance import from_backend, noted, notice
from mcp_spec_proxy.review import InputNeeded, Reviewer, ReviewFailed, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import BASELINES, Chain, ReviewerKind
from mcp_spec_proxy.review.waiting import Both, asks_a_person, waiting_note, with_heartbeat
from mcp_spec_proxy.trajectory import Step, observation_text

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

logger = logging.getLogger(__name__)

Report = ProgressFnT
"""Sends a progress notification to the calling client: `await report(progress, total, message)`."""

Author = Literal["client", "weak", "strong", "replacement", "repair"]
STRONG_AUTHORS: frozenset[str] = frozenset({"strong", "replacement", "repair"})
"""Authors whose calls count as reviewed by the strong model: it wrote them itself."""

Executor = Callable[[CatalogTool, dict[str, Any], "Report | None"], Awaitable[types.CallToolResult]]
"""Runs an accepted call somewhere other than a backend (the gateway's client tools)."""

AUDIT_TEXT_CAP = 4000
"""Characters of one free-text audit field (a reviewer's reason); the rest is cut with a marker."""
CALL_META = "mcp-spec-proxy/call"
"""The `_meta` key of a tools/call result (and the `data` key of a proxy error about a call that
reached the gate) that names the call, as the audit trail names it."""
FIRST_META = "mcp-spec-proxy/first-call"
"""The `data` key of a `CallReplayed` error: the call that holds the idempotency key."""
AUDIT_META = "mcp-spec-proxy/audit"
"""The `_meta` key of a result whose audit line could not be written yet: why, and that it is retried."""


def new_call_id() -> str:
    """128 random bits: call ids share one audit table across replicas and years (48 bits met by
    chance past ~10M calls), and a client must not guess another's."""
    return secrets.token_hex(16)


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


CallFailed = MCPError | BackendError
"""A forwarded call that got no result: the backend's own error, or the proxy's observation."""
CALL_FAILED = (MCPError, BackendError)


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

    @property
    def forwarded(self) -> bool:
        return self.result is not None


class Gate:
    def __init__(
        self,
        config: ProxyConfig,
        backends: BackendPool,
        reviewers: Mapping[ReviewMode, Reviewer],
        audit: AuditSink,
        leash: Leash | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        self._config = config
        self._backends = backends
        self._reviewers = reviewers
        self._audit = audit
        self._leash = leash
        self._catalog = catalog  # to reread `tools accept` before refusing a held tool
        self.drain = Drain()  # the calls in flight; on SIGTERM, no new ones (drain.py)

    # -- policy ------------------------------------------------------------------------------

    def mode(self, tool: CatalogTool) -> ReviewMode:
        """The tool's configured reviewer: its override, else `review.default`."""
        return tool.review or self._config.review.default

    @contextmanager
    def admitted(self, session: str, what: str, call: str | None = None, **about: Any) -> Iterator[None]:
        """The drain's slot for one call (`Drain.call`); a call refused because the replica is
        shutting down is on the audit trail (`refused`, with `about`, else the tool `what`): nothing
        ran, and the trail says why."""
        with ExitStack() as slot:
            try:
                slot.enter_context(self.drain.call(what))
            except ShuttingDown:
                ids = {"call": call} if call is not None else {}
                named = about or {"tool": what}
                self._audit.note("refused", **ids, session=session, **named, reason=SHUTTING_DOWN_REASON)
                raise
            yield

    # -- reads -------------------------------------------------------------------------------

    async def read(
        self,
        session: str,
        tool: CatalogTool,
        arguments: dict[str, Any],
        step: Step,
        author: Author,
        report: Report | None,
        call: str | None = None,
    ) -> types.CallToolResult:
        """Forward a read at once; its audit line is buffered and written with the next commit."""
        with self.admitted(session, tool.name, call), about_call(call, session):
            self._note_read(session, tool, arguments, author, call)
            return await self._forward(tool, arguments, step, report)

    async def read_json(
        self, session: str, tool: CatalogTool, arguments: dict[str, Any], step: Step, call: str | None = None
    ) -> dict[str, Any]:
        """`read` for the fast path (a client's read with no progress to report): the same audit
        line, and the result as wire JSON, forwarded unchanged (no model built for it)."""
        with self.admitted(session, tool.name, call), about_call(call, session):
            return await self._read_json(session, tool, arguments, step, call)

    async def _read_json(
        self, session: str, tool: CatalogTool, arguments: dict[str, Any], step: Step, call: str | None
    ) -> dict[str, Any]:
        self._note_read(session, tool, arguments, "client", call)
        started = time.perf_counter()
        try:
            result = from_backend(await self._backends.get(tool.server).call_tool_json(tool.original, arguments))
        except CALL_FAILED as exc:
            _observe(step, failed_result(tool, exc), started)
            raise
        except Exception as exc:  # boundary: as in `_forward`
            result = as_wire(failed_result(tool, exc))
        step.duration_s = time.perf_counter() - started
        step.is_error = bool(result.get("isError"))
        content = result.get("content") or []
        step.observation = observation_text([block for block in content if isinstance(block, dict)])
        return result

    def _note_read(
        self, session: str, tool: CatalogTool, arguments: dict[str, Any], author: Author, call: str | None
    ) -> None:
        assert tool.effect == "read", f"{tool.name} is a write: it must be held"
        self._audit.note(
            "read",
            **({"call": call} if call is not None else {}),
            session=session,
            tool=tool.name,
            server=tool.server,
            arguments_digest=digest(arguments),
            author=author,
            why=tool.why,
        )

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
        with self.admitted(call.session, call.tool.name, call.id), about_call(call.id, call.session):
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
        reviewer, flagged = await self._reviewer(call, strong, verified)
        if call.flagged and flagged is None:
            # The engine's shadow observer flagged it (its score is in telemetry): audited here like
            # the front's, whichever reviewer the call meets, so the trail has every escalation.
            flagged = {"to": reviewer.by.text, "layer": "flagged by the engine"}
        common = {
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
        if call.key is not None:
            common["key"] = digest(call.key)  # a digest: the key is the client's text
        await self._before(call, "held", **common, segment_length=len(call.request.segment))
        logger.debug("%s held for its verdict (reviewer %s)", tool.name, reviewer.by.text)
        if flagged is not None:
            await self._before(call, "leash-escalated", call=call.id, session=call.session, **flagged)
        started = time.perf_counter()
        settled = False  # its terminal line (`blocked`) is written: a cancel after it abandons nothing
        try:
            request = dataclasses.replace(call.request, call=call.id)
            with self.drain.holding() as hold:
                verdict = await self._review(reviewer, request, user, report)
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
                    await self._after("blocked", call=call.id, session=call.session)
                await self._label(call, verdict)
                return Outcome(call.id, verdict, None, latency_ms, key=call.key)
            step = step or Step(tool.name, call.arguments, tool.effect, intent=call.intent)
            edit_note = None
            if verdict.arguments is not None and verdict.arguments != call.arguments:
                # A person edited the call on the approval console (validated there against its schema).
                edited = {"original_digest": digest(call.arguments), "edited_digest": digest(verdict.arguments)}
                await self._before(call, "edited", call=call.id, session=call.session, by=verdict.reviewer, **edited)
                call.arguments = step.arguments = dict(verdict.arguments)
                # The agent is told what ran: else it believes its own arguments did, and builds on that.
                shown = capped(json.dumps(call.arguments, ensure_ascii=False))
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
                started = time.perf_counter()
                result = await executor(tool, call.arguments, report)
                _observe(step, result, started)
            else:
                result = await self._forward(tool, call.arguments, step, report)
        except CALL_FAILED as exc:
            code = exc.code
            # A backend that was not connected was sent nothing: the audit says so, not "forwarded".
            sent = not isinstance(exc, BackendUnavailable) or isinstance(exc, BackendClosed)
            event = "forwarded" if sent else "unsent"
            await self._after(event, call=call.id, session=call.session, is_error=True, error_code=code)
            await self._label(call, verdict)
            failed = failed_result(tool, exc)
            failed = noted(edit_note, failed, structured=True) if edit_note else failed
            return Outcome(call.id, verdict, failed, latency_ms, error=exc, key=call.key)
        except BaseException as exc:  # cancelled (or worse) mid-send: the call may have run
            why = SHUT_DOWN if self.drain.ending else type(exc).__name__
            with anyio.CancelScope(shield=True):
                await self._after(
                    "forward-interrupted",
                    call=call.id,
                    session=call.session,
                    reason=f"{why} while forwarding: the backend may or may not have run it",
                )
            raise
        late = await self._after("forwarded", call=call.id, session=call.session, is_error=bool(result.is_error))
        if late is not None:
            # It ran: the client gets the backend's result, told that its audit line is late.
            note = f"the backend ran this call; its audit line could not be written yet ({late}): it is retried"
            result = result.model_copy(update={"meta": {**(result.meta or {}), AUDIT_META: note}})
        if edit_note is not None:
            result = noted(edit_note, result, structured=True)
        await self._label(call, verdict)  # after the write: a slow bank never delays an accepted call
        return Outcome(call.id, verdict, result, latency_ms, key=call.key)

    async def _before(self, gated: GateCall, kind: str, /, **fields: Any) -> None:
        """A line the forward waits for. When it cannot be written the write is refused, and the
        call's terminal line (`abandoned`) is left to the sink: the call never stays `held`."""
        try:
            await self._audit.record(kind, **fields)
        except StateError as exc:
            self._audit.later("abandoned", call=gated.id, session=gated.session, reason=f"its {kind} line: {exc}")
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
            first = await self._audit.claim(call.session, digest(call.key), call.id)
        except StateError as exc:
            self._audit.later("abandoned", call=call.id, session=call.session, reason=f"its key's claim: {exc}")
            raise StateError(f"{exc}: {call.tool.name} was not forwarded (call {call.id})") from None
        if first is None:
            return
        reason = f"its idempotency key belongs to call {first}, which may have run"
        with anyio.CancelScope(shield=True):  # its terminal line: a cancel now must not add `abandoned`
            await self._after("blocked", call=call.id, session=call.session, reason=reason)
        raise CallReplayed(
            first,
            f"{call.tool.name} was not forwarded: its idempotency key was used by call {first} of this session"
            " (forwarded, or about to be; `mcp-spec-proxy audit` shows its outcome) — send a new key for a new call",
        )

    async def _label(self, call: GateCall, verdict: Verdict) -> None:
        """Labels for free: a judgement's accepted prefix succeeded, its first rejected step failed.

        Each label says who judged which session's call, so `review: leash` never takes a
        session's (or its client's) own accepted calls as evidence for its next one."""
        if self._leash is not None and verdict.by.judged:
            from mcp_spec_proxy.leash.provenance import Provenance  # LEASH loads only with a `leash:` section

            provenance = Provenance(
                "verdict", verdict.reviewer, "proxy", call.session, call.request.client, time.time()
            )
            await self._leash.label_verdict(call.request.segment.steps, verdict.accepted_steps, provenance=provenance)

    async def _still_held(self, tool: CatalogTool) -> bool:
        """`tools accept` may have run since (in another process): the store is reread first."""
        if self._catalog is None:
            return True
        await self._catalog.refresh_fingerprints()
        try:
            return is_held(self._catalog.lookup(tool.name))
        except ToolNotFound:
            return True

    async def _reviewer(
        self, call: GateCall, strong: Reviewer | None, verified: bool
    ) -> tuple[Reviewer, dict[str, Any] | None]:
        """The reviewer this call meets, and LEASH's evidence when its shadow observer escalated."""
        tool = call.tool
        if is_held(tool) and await self._still_held(tool):
            # Whoever wrote the call (the client, a replacement, a repair, the engine): a tool whose
            # definition changed, or that is new, runs for no one until the operator accepts it.
            return _HeldTool(tool), None
        loop = strong is not None and verified and call.author not in STRONG_AUTHORS
        # A read is held only when LEASH flags it: then it is the strong verifier's to judge.
        mode = self.mode(tool) if tool.effect == "write" else "strong"
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
    ) -> types.CallToolResult:
        """Send the call to its backend. Private to the gate's own decisions: `read` and `write`.
        A `CallFailed` is raised once the step has observed it."""
        started = time.perf_counter()
        try:
            backend = self._backends.get(tool.server)
            result = from_backend(await backend.call_tool(tool.original, arguments, report))
        except CALL_FAILED as exc:
            _observe(step, failed_result(tool, exc), started)
            raise
        except Exception as exc:  # boundary: a fault past the backend's answer is that call's error result
            result = failed_result(tool, exc)
        _observe(step, result, started)
        return result

    async def get_prompt(self, session: str, server: str, name: str, arguments: dict[str, str] | None) -> Any:
        """A backend's prompt, audited like a read (a backend may do work to render it)."""
        with self.admitted(session, f"prompt {name!r}", server=server, prompt=name):  # in flight for the drain
            self._audit.note("prompt", session=session, server=server, prompt=name, arguments_digest=digest(arguments))
            return await self._backends.get(server).get_prompt(name, arguments)

    async def read_resource(self, session: str, server: str, uri: str) -> Any:
        """A backend's resource, audited like a read."""
        with self.admitted(session, f"the read of {capped(uri, 500)}", server=server, uri=capped(uri, 500)):
            self._audit.note("resource", session=session, server=server, uri=capped(uri, 500))
            return await self._backends.get(server).read_resource(uri)

    async def complete(self, session: str, server: str, params: types.CompleteRequestParams) -> types.CompleteResult:
        """A backend's completion of a prompt's or template's argument, audited like a read; a
        server that declares no `completions` has none to offer (an empty completion)."""
        ref = capped(_ref_name(params.ref), 500)
        with self.admitted(session, f"the completion of {ref}", server=server, ref=ref):
            self._audit.note("completion", session=session, server=server, ref=ref)
            backend = self._backends.get(server)
            caps = backend.capabilities
            if caps is not None and caps.completions is None:
                return types.CompleteResult(completion=types.Completion(values=[]))
            return await backend.complete(params)

    async def set_logging_level(self, session: str, level: types.LoggingLevel) -> list[str]:
        """Fan a client's `logging/setLevel` out to every backend (remembered for those that
        connect later); the names of the connected ones that refused it."""
        self._audit.note("log-level", session=session, level=level)
        refused: list[str] = []
        for backend in self._backends.backends.values():
            try:
                await backend.set_logging_level(level)
            except Exception as exc:  # boundary: one backend's refusal must not keep the level from the others
                logger.info("backend %r: logging/setLevel %s refused: %s", backend.name, level, exc)
                refused.append(backend.name)
        return refused

    async def subscribe(self, session: str, server: str, uri: str) -> None:
        """Subscribe the proxy to `uri` at the backend that serves it, audited like a read."""
        with self.admitted(session, f"the subscription to {capped(uri, 500)}", server=server, uri=capped(uri, 500)):
            self._audit.note("subscribe", session=session, server=server, uri=capped(uri, 500))
            await self._backends.get(server).subscribe(uri)

    async def unsubscribe(self, session: str, server: str, uri: str) -> None:
        self._audit.note("unsubscribe", session=session, server=server, uri=capped(uri, 500))
        await self._backends.get(server).unsubscribe(uri)

    def note(self, kind: str, **fields: Any) -> None:
        """A best-effort audit line about something the front answered itself (a replayed key's outcome)."""
        self._audit.note(kind, **fields)

    async def record(self, kind: str, **fields: Any) -> None:
        """An audit line about a decision that sends nothing anywhere (the engine's graded answers)."""
        if isinstance(fields.get("reason"), str):
            fields["reason"] = capped(fields["reason"])
        await self._audit.record(kind, **fields)


_ON_ERROR = ReviewerKind.ON_ERROR.chain  # a verdict the gate gave for a reviewer that gave none


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


def _ref_name(ref: types.PromptReference | types.ResourceTemplateReference) -> str:
    return ref.name if isinstance(ref, types.PromptReference) else ref.uri


def failed_result(tool: CatalogTool, exc: Exception) -> types.CallToolResult:
    """A call its backend could not answer (`BackendError`: the pool's own words) or answered
    with a JSON-RPC error, as an error result: what a model reads of it, and what a substitute's
    caller gets."""
    if isinstance(exc, BackendError):
        return error_result(str(exc))
    if isinstance(exc, MCPError):
        return error_result(f"backend {tool.server!r} answered {tool.original} with error {exc.code}: {exc.message}")
    return error_result(f"backend {tool.server!r} answered {tool.original} with an error: {exc}")


def _observe(step: Step, result: types.CallToolResult, started: float) -> None:
    step.duration_s = time.perf_counter() - started
    step.is_error = bool(result.is_error)
    step.observation = observation_text([block.model_dump(mode="json") for block in result.content])


def as_wire(result: types.CallToolResult) -> dict[str, Any]:
    """A result as the JSON the wire carries."""
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def capped(text: str, limit: int = AUDIT_TEXT_CAP) -> str:
    """`text` within `limit` characters; a cut is marked with how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters cut]"


def error_result(text: str) -> types.CallToolResult:
    """An error result in the proxy's own words, marked as its (`provenance.py`)."""
    return notice(text)


def text_result(text: str, is_error: bool = False) -> types.CallToolResult:
    """A result in someone else's words (a gateway client's observation): unmarked."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error)


def blocked_result(tool: CatalogTool, verdict: Verdict, why_not_replaced: str = "") -> types.CallToolResult:
    reason = capped(verdict.reason)
    text = f"Blocked at the write barrier: {tool.name} was not executed. Reviewer {verdict.reviewer}: {reason}"
    if verdict.replacement_action:
        text += "\nSuggested instead: " + json.dumps(verdict.replacement_action, ensure_ascii=False)
    if why_not_replaced:
        text += f"\n(Nothing was run in its place: {why_not_replaced}.)"
    return error_result(text)


__all__ = [
    "AUDIT_META",
    "CALL_FAILED",
    "CALL_META",
    "FIRST_META",
    "Author",
    "CallFailed",
    "Gate",
    "GateCall",
    "Outcome",
    "Report",
    "as_wire",
    "blocked_result",
    "error_result",
    "failed_result",
    "new_call_id",
    "text_result",
]
