"""Strong-model review at the write barrier: one-prefill verification, and the repair turn.

`StrongReviewer` is SpecAgent's verifier. The held call and the steps that led to it are
reviewed in ONE request with thinking off. The request puts the stable part first — system
instructions and the operator's policy, then one message of data: the catalog's tool
definitions and the user's request, then the session's committed history, unnumbered — and
the segment last, its steps numbered 1..L in their turns and in a JSON block, so a prefix
cache on the model server (SGLang's radix cache, vLLM prefix caching, provider prompt caching)
serves everything up to the last committed step on the next review of the same session.
Calls are assistant turns and results fenced text in user turns; runs of one role are merged,
so no chat template meets two messages of one role in a row.

The verdict `{accepted_steps, first_rejected_tool, reason, replacement_action}` is requested as
a JSON schema built per request (each count 0..L with the tool it rejects, nothing else, so a
grammar-bound server cannot write an unreadable verdict) and read leniently in form (thinking
blocks, fences, prose around one object, numbers as strings) but strictly in meaning: the count
must be within the segment and agree with the tool it names (`verdict.py`; the prompts
themselves are `prompts.py`'s). An unreadable verdict gets one
bounded retry (with more room when it was cut off); one still unreadable rejects the held call
(`review.unreadable: reject`, the default) or fails the review (`error`: the barrier fails
closed unless `on_error` says otherwise). It is never an acceptance.

`Repairer` is the repair turn: the strong model, thinking on, proposes the one step to take
instead, as a tool call. Its prompt is the verifier's, every message as it was sent, then the
verdict as an assistant turn and the repair instruction in a last user message: what differs
comes after the verification's bytes, so the prefix cache that served it serves the repair.
Whatever a backend or the agent under review wrote — tool definitions, tool output, the agent's
stated intent — is fenced as data in every prompt (`fence`), outside the system message: it can
inform a verdict, never instruct the reviewer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from mcp_spec_proxy.errors import InvalidArguments, ToolNotFound
from mcp_spec_proxy.models import ChatModel, ModelCall, ModelError
from mcp_spec_proxy.prompts import FINAL_ANSWER, FINAL_ANSWER_TOOL, openai_tool, repair_messages, verify_messages
from mcp_spec_proxy.review import InputNeeded, ReviewFailed, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import ReviewerKind
from mcp_spec_proxy.review.policy import HumanReviewer
from mcp_spec_proxy.review.verdict import cut_off, parse_verdict, response_format
from mcp_spec_proxy.tools.catalog import INTENT_ARGUMENT, CatalogTool, ToolSource, is_held

Unreadable = Literal["reject", "error"]
_ECHO_LIMIT = 4_000  # characters of an unreadable answer shown back to the model on the retry


class StrongReviewer:
    """SpecAgent's verifier: one request, thinking off; see the module docstring.

    A verdict that cannot be read gets one retry (with more room when the answer was cut off);
    one still unreadable then rejects the held call (`unreadable="reject"`: reviewer
    `strong (unreadable)`, earlier steps stand) or fails the review (`"error"`: `ReviewFailed`,
    which the gate turns into a verdict by `review.on_error`).
    """

    by = ReviewerKind.STRONG.chain
    RETRY_MAX_TOKENS = 4096  # the retry's room when the configured max_tokens is unset

    def __init__(
        self, model: ChatModel, catalog: ToolSource, policy: str = "", *, unreadable: Unreadable = "reject"
    ) -> None:
        self.model = model
        self._catalog = catalog
        self._policy = policy
        self._unreadable = unreadable

    def messages(self, request: ReviewRequest) -> list[dict[str, Any]]:
        committed = request.history.committed
        return verify_messages(
            self._catalog, self._policy, committed, request.segment, request.task, intent_asked=intent_asked(request)
        )

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        messages = self.messages(request)
        tools = [step.tool for step in request.segment.steps]
        length = len(tools)
        offered = self._replacements(engine=bool(request.task) or FINAL_ANSWER in tools)
        calls: list[ModelCall] = []
        problem = ""
        room: dict[str, Any] = {}
        for attempt in range(2):  # one bounded retry on a malformed verdict
            try:
                completion = await self.model.complete(
                    messages, purpose="verify", thinking=False, response_format=response_format(tools, offered), **room
                )
            except ModelError as exc:
                if exc.call is not None:
                    calls.append(exc.call)
                raise ReviewFailed(str(exc), tuple(calls)) from None
            calls.append(completion.call)
            try:
                parsed = parse_verdict(completion.content, tools)
            except ValueError as exc:
                problem = str(exc)
                # The server's word (`finish_reason`), or an answer that ends inside its JSON: a
                # server (or a scripted double) may stop early without saying so.
                truncated = completion.finish_reason == "length" or cut_off(completion.content)
                if truncated:
                    problem = f"the answer was cut off ({problem})"
                    room = self._more_room()
                if attempt == 0:
                    ask = (
                        "Your answer was cut off. Answer again with only the JSON object and a short reason."
                        if truncated
                        else f"That is not a valid verdict ({problem}). Answer with only the JSON object."
                    )
                    messages = [
                        *messages,
                        {"role": "assistant", "content": (completion.content or "")[:_ECHO_LIMIT]},
                        {"role": "user", "content": ask},
                    ]
                continue
            accepted = parsed.accepted_steps == length
            replacement = parsed.replacement_action.model_dump() if parsed.replacement_action else None
            return Verdict(
                accepted,
                parsed.reason,
                parsed.accepted_steps,
                None if accepted else replacement,
                by=self.by,
                model_calls=tuple(calls),
            )
        why = f"the strong model's verdict was malformed twice: {problem}"
        if self._unreadable == "error":
            raise ReviewFailed(why, tuple(calls))
        # Never an acceptance, and no judgement either (`failed`): the held call is refused, nothing
        # is labelled or counted, and the steps before it (which ran) commit unjudged.
        by = ReviewerKind.STRONG_UNREADABLE.chain
        return Verdict(False, f"{why}; failing closed", length - 1, by=by, model_calls=tuple(calls), failed=True)

    def _replacements(self, *, engine: bool) -> dict[str, list[str]]:
        """The calls a replacement may make (tool: its parameter names) — the catalog's, and the
        final answer when the proxy drives the agent (the engine takes one as a replacement)."""
        calls = {t.name: list(t.input_schema.get("properties") or {}) for t in self._catalog.tools()}
        if engine:
            calls[FINAL_ANSWER] = ["answer"]
        return calls

    def _more_room(self) -> dict[str, Any]:
        """`max_tokens` for the retry of a cut-off answer: twice the configured room, or `RETRY_MAX_TOKENS`."""
        configured = self.model.config.max_tokens
        return {"max_tokens": 2 * configured if configured is not None else self.RETRY_MAX_TOKENS}


def intent_asked(request: ReviewRequest) -> bool:
    """A client's write that came without the optional `intent`: the reviewer is told so (and the
    repair turn's prompt, the verifier's, says the same)."""
    return request.tool is not None and request.tool.wants_intent and not request.task


@dataclass(frozen=True)
class ProposedStep:
    tool: CatalogTool
    arguments: dict[str, Any]
    source: str  # "replacement" or "repair"


@dataclass(frozen=True)
class ProposedAnswer:
    """A replacement or repair that is the final answer (engine only)."""

    answer: str
    source: str


def check_step(
    catalog: ToolSource, action: dict[str, Any] | None, *, answers: bool = False, task: str = ""
) -> ProposedStep | ProposedAnswer | str:
    """A replacement the proxy may run, or why it may not: it must name a catalog tool and validate.

    `answers` and `task` are the engine's: it may end with a final answer, and its task stands in
    for a write's `intent` when the model left it out.
    """
    if not action:
        return "the reviewer gave no replacement"
    name, arguments = action.get("tool"), action.get("arguments")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return "the replacement is not {tool, arguments}"
    if answers and name == FINAL_ANSWER:
        answer = arguments.get("answer")
        return ProposedAnswer(answer, "replacement") if isinstance(answer, str) else "final_answer needs an answer"
    try:
        tool = catalog.lookup(name)
        if task and tool.wants_intent:
            arguments = {**arguments, INTENT_ARGUMENT: arguments.get(INTENT_ARGUMENT, task)}
        catalog.validate(tool, arguments)
    except (ToolNotFound, InvalidArguments) as exc:
        return f"the replacement is not valid: {exc}"
    return ProposedStep(tool, arguments, "replacement")


class Repairer:
    """One strong-model turn, thinking on, that produces the step to take instead.

    Its prompt is the verifier's messages, the same bytes (`repair_messages`), so a prefix cache
    serves it; the verdict and the repair instruction come after them. With JSON actions the
    guide is added at the end (`tools_defined`), never to the system message. (Native `tools=`
    are the server's to place: chat templates that render them into the system preamble cost
    that sharing — a server-side limit, not the prompt's.)
    """

    def __init__(self, model: ChatModel, catalog: ToolSource, policy: str = "") -> None:
        self.model = model
        self._catalog = catalog
        self._policy = policy

    def messages(self, request: ReviewRequest, verdict: Verdict) -> list[dict[str, Any]]:
        rejected = min(max(verdict.accepted_steps, 0), len(request.segment) - 1)
        committed = request.history.committed
        return repair_messages(
            self._catalog,
            self._policy,
            committed,
            request.segment,
            rejected,
            verdict.reason,
            request.task,
            intent_asked=intent_asked(request),
        )

    async def repair(
        self, request: ReviewRequest, verdict: Verdict, *, answers: bool = False
    ) -> tuple[ProposedStep | ProposedAnswer | str, ModelCall | None]:
        """One repair turn; `answers` lets it end the task with a final answer (engine only)."""
        messages = self.messages(request, verdict)
        engine = answers  # the engine's tools carry no `intent`: its task is the intent
        offered = sorted((t for t in self._catalog.tools() if not is_held(t)), key=lambda t: t.name)
        tools = [openai_tool(t, with_intent=not engine) for t in offered]  # a held tool runs for no one
        if answers:
            tools.append(FINAL_ANSWER_TOOL)
        try:
            completion = await self.model.complete(
                messages, purpose="repair", thinking=True, tools=tools, tool_choice="required", tools_defined=True
            )
        except ModelError as exc:
            return f"the repair turn failed: {exc}", exc.call
        if not completion.tool_calls:
            return "the repair turn made no tool call", completion.call
        call = completion.tool_calls[0]
        try:
            arguments = json.loads(call.arguments)
        except json.JSONDecodeError:
            return f"the repair turn's arguments are not JSON: {call.arguments[:200]}", completion.call
        checked = check_step(
            self._catalog, {"tool": call.name, "arguments": arguments}, answers=answers, task=request.task
        )
        if isinstance(checked, str):
            return checked.replace("replacement", "repaired step"), completion.call
        if isinstance(checked, ProposedAnswer):
            return ProposedAnswer(checked.answer, "repair"), completion.call
        return ProposedStep(checked.tool, checked.arguments, "repair"), completion.call


class EscalatingReviewer:
    """`strong_then_human`: the strong model decides; what it rejects (or fails on) goes to the user."""

    by = ReviewerKind.STRONG_THEN_HUMAN.chain
    MEMO = "strong_then_human.strong"

    def __init__(self, strong: StrongReviewer, human: HumanReviewer) -> None:
        self._strong = strong
        self._human = human

    def waiting_note(self) -> str | None:
        return self._human.waiting_note()

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        memo: dict[str, Any] = getattr(user, "memo", None) or {}
        remembered = memo.get(self.MEMO)
        if isinstance(remembered, tuple):
            why, calls = remembered  # a retry with the user's answer: the model has spoken already
        else:
            try:
                first = await self._strong.review(request, user)
            except ReviewFailed as exc:
                why, calls = f"the strong reviewer failed ({exc})", exc.calls
            else:
                if first.accepted:
                    return first
                why, calls = f"the strong reviewer rejected it: {first.reason}", first.model_calls
        try:
            second = await self._human.review(request, user, context=why)
        except InputNeeded as need:
            need.memo[self.MEMO] = (why, ())  # its model calls are accounted for on this first pass
            raise
        return Verdict(
            second.accepted,
            f"{second.reason} (after {why})",
            second.accepted_steps,
            by=self._strong.by.then(second.by),
            model_calls=calls,
            evidence=second.evidence,
            arguments=second.arguments,
        )
