"""The scripted models of the retail benchmark: authors, the strong verifier and the repair turn.

All of them answer from one scripted model server per lane (`World.reply`), under two model
names, and know the gold actions of the task now running:

    author    the weak model (drafts; weak-only) or the strong one (strong-only, LEASH strong-led
              runs) follows the gold actions in order, then answers, erring at seeded places in
              seeded ways (`authors`: which step, which error).
    verifier  the strong model, thinking off, reads the segment from the real review prompt (its
              "# Segment to verify" block and its "Step N:" turns) and judges each step in order:
              an erroneous step is rejected with probability `recall`, a correct one with
              `false_reject`; a rejection names the gold step as replacement_action with
              probability `replacement`, else null (the engine's repair turn follows).
    repair    the strong model, thinking on, takes the gold step with probability
              `repair.success`, else errs as the strong author does.

Every draw is seeded (`authors.seeded`) by the seed, trial, task, role and place in the
trajectory. Text lengths (reasoning, verdict reasons, answers) come from a separate stream, so
they never move an error.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.tau2_retail.authors import PREFIX, Action, Authors, Seen, correct, gold, progress, seeded
from bench.tau2_retail.params import Lengths, Params
from bench.tau2_retail.scoring import Task, instruction
from bench.tau2_retail.tokens import Count
from mcp_spec_proxy.prompts import FINAL_ANSWER, REPAIR_HEADING, ShownStep, agent_steps, review_steps
from mcp_spec_proxy.testing import ChatRequest, Reply, ToolCall

WEAK_MODEL, STRONG_MODEL = "tau2-weak", "tau2-strong"


# -- reading the engine's prompts ---------------------------------------------------------------


# A call is an assistant turn's line, `Committed call: {json}` or `Step N: {json}` (a fenced intent may
# follow); its result is the user turn after it, `Result (ok):` or `Result of step N (ok):`, fenced.
def _seen(step: ShownStep) -> Seen:
    return Seen(Action(step.tool, step.arguments), bool(step.is_error), step.observation or "")


def agent_history(request: ChatRequest) -> list[Seen]:
    """The steps a drafting (or strong-only) request shows: each tool call with its result."""
    return [
        Seen(Action(s.tool, s.arguments), (s.observation or "").startswith(("Error:", "error:")), s.observation or "")
        for s in agent_steps(request.messages)
    ]


def review_history(request: ChatRequest) -> tuple[list[Seen], list[Seen], int]:
    """A review or repair prompt's steps: the committed ones, the segment's, and the segment's first step
    counted from the session's start.

    A repair prompt shows the verifier's accepted steps numbered and the rejected call last: its
    accepted steps count as committed, and it has no segment.
    """
    shown, numbered = review_steps(request.messages)
    committed = [_seen(step) for step in shown]
    segment = [_seen(step) for step in numbered]
    if request.last_user_text.startswith(REPAIR_HEADING):
        committed, segment = [*committed, *segment[:-1]], []
    return committed, segment, len(committed) + 1


# -- the world: every request of a lane answered here --------------------------------------------

THOUGHTS = (
    "The customer has to be authenticated first, by email or by name and zip code.",
    "I should only act on orders that belong to this user.",
    "Before changing anything I need the order's status: pending and delivered orders allow different actions.",
    "The item ids in the order are what the tools expect, not the product ids.",
    "A new item has to be a variant of the same product, and it has to be available.",
    "Refunds for a return go to the original payment method or to a gift card.",
    "The price difference of an exchange is paid with the payment method the customer chose.",
    "All items to be exchanged should go in one call; the order can only be exchanged once.",
    "Let me compare the options of each variant with what the customer asked for.",
    "The tool output so far shows no error, so the earlier steps did what they were meant to.",
    "Nothing in the observations changes what the customer asked for; they are data.",
    "If a look-up fails, the customer may have given the id with a typo, and I should check the other orders.",
    "A cancellation needs the reason the customer gave, and only two reasons are valid.",
    "I will not call a tool that changes the database until I have read everything it depends on.",
    "The address change applies to the order, not to the user's default address, unless they asked for both.",
    "It is worth double-checking the order id, since this user has several orders.",
    "Once this step is done, I can summarise for the customer what changed.",
    "The gift card balance must cover any price difference paid with it.",
    "Let me think about whether anything in the request is still open; the customer wanted it all in one go.",
    "If the request were outside what the tools allow, I would transfer the customer to a human agent.",
)
CLOSINGS = (
    "Is there anything else I can help you with today?",
    "You will receive an email with the details shortly.",
    "The refund will appear within 5 to 7 business days, depending on your bank.",
    "Thank you for your patience while I looked this up.",
    "Please keep the items in their original packaging until the return is processed.",
)


@dataclass
class Running:
    """The task run a lane is serving now."""

    task: Task
    mode: str
    trial: int
    gold: list[Action]
    warmup: bool = False
    events: Counter[str] = field(default_factory=Counter)
    rejected_once: bool = False


class World:
    """The policy of a lane's scripted model server: `Respond(world.reply)`."""

    def __init__(self, params: Params, seed: int, count: Count) -> None:
        self.params = params
        self.seed = seed
        self.count = count
        self.authors = Authors(params, seed)
        self.current: Running | None = None
        self._sizes: dict[str, int] = {}

    def start(self, task: Task, mode: str, trial: int, *, warmup: bool = False) -> Running:
        self.current = Running(task, mode, trial, gold(task), warmup=warmup)
        return self.current

    def reply(self, request: ChatRequest) -> Reply:
        run = self.current
        assert run is not None, "a model was called with no task run in progress"
        if request.model == WEAK_MODEL:
            return self.author(run, "weak", agent_history(request))
        if request.json_schema is not None:
            return self.verify(run, request)
        if request.last_user_text.startswith(REPAIR_HEADING):
            return self.repair(run, request)
        return self.author(run, "strong", agent_history(request))

    # -- the three kinds of turn ---------------------------------------------------------------

    def texts(self, run: Running, seen: Sequence[Seen]) -> list[str]:
        return [instruction(run.task), *(step.text for step in seen)]

    def author(self, run: Running, role: str, seen: list[Seen]) -> Reply:
        decision = self.authors.next(role, run.task, run.gold, seen, trial=run.trial, texts=self.texts(run, seen))
        if decision.error is not None:
            run.events[f"{role}_error.{decision.error}"] += 1
        run.events[f"{role}_steps"] += 1
        rng = seeded(self.seed, run.trial, run.task["id"], role, "text", len(seen))
        lengths = self.params.weak.reasoning_tokens if role == "weak" else self.params.strong.reasoning_tokens
        reasoning = self.reasoning(rng, run, decision.action, lengths)
        if decision.action.is_answer:
            return Reply(content=self.answer(rng, run, seen), reasoning=reasoning)
        return Reply(tool_calls=[ToolCall(decision.action.tool, decision.action.arguments)], reasoning=reasoning)

    def verify(self, run: Running, request: ChatRequest) -> Reply:
        committed, segment, first = review_history(request)
        position = progress(run.gold, committed)
        verifier = self.params.verifier
        for index, step in enumerate(segment):
            rng = seeded(self.seed, run.trial, run.task["id"], "verify", first + index, position, step.action.as_json())
            right = correct(run.gold, position, step.action)
            draw = rng.random()
            if run.warmup and not run.rejected_once:
                run.rejected_once = True  # the warm-up run makes one repair turn, so its prompt prefix is cached too
                return self.reject(run, rng, index, position, step, right, force_null=True)
            if right and draw < verifier.false_reject:
                run.events["verifier.false_reject"] += 1
                return self.reject(run, rng, index, position, step, right)
            if not right and draw < verifier.recall:
                run.events["verifier.caught"] += 1
                return self.reject(run, rng, index, position, step, right)
            if not right:
                run.events["verifier.missed"] += 1
            position = progress(run.gold, [*committed, *segment[: index + 1]])
        run.events["verifier.accepted_segment"] += 1
        rng = seeded(self.seed, run.trial, run.task["id"], "verify-text", first)
        opening = [f"All {len(segment)} steps follow from the request, the policy and what the reads returned."]
        reason = self.write(rng, verifier.accept_reason_tokens.draw(rng), opening, THOUGHTS[:12])
        verdict = {
            "reason": reason,
            "first_rejected_tool": None,
            "accepted_steps": len(segment),
            "replacement_action": None,
        }
        return Reply(content=json.dumps(verdict, ensure_ascii=False))

    def reject(
        self,
        run: Running,
        rng: random.Random,
        index: int,
        position: int,
        step: Seen,
        right: bool,
        *,
        force_null: bool = False,
    ) -> Reply:
        verifier = self.params.verifier
        gives = not force_null and rng.random() < verifier.replacement
        replacement: dict[str, Any] | None = None
        if gives:
            run.events["verifier.replacement"] += 1
            if position < len(run.gold):
                replacement = run.gold[position].as_json()
            else:
                replacement = {"tool": FINAL_ANSWER, "arguments": {"answer": self.answer(rng, run, [])}}
        else:
            run.events["verifier.null"] += 1
        why = self.why(run, position, step.action, right)
        opening = [f"Step {index + 1} ({step.action.tool}) is not right: {why}"]
        reason = self.write(rng, verifier.reject_reason_tokens.draw(rng), opening, THOUGHTS)
        verdict = {
            "reason": reason,
            "first_rejected_tool": step.action.tool,
            "accepted_steps": index,
            "replacement_action": replacement,
        }
        return Reply(content=json.dumps(verdict, ensure_ascii=False))

    def repair(self, run: Running, request: ChatRequest) -> Reply:
        committed, _, _ = review_history(request)
        texts = self.texts(run, committed)
        decision = self.authors.next("repair", run.task, run.gold, committed, trial=run.trial, texts=texts)
        run.events["repairs"] += 1
        if decision.error is not None:
            run.events[f"repair_error.{decision.error}"] += 1
        rng = seeded(self.seed, run.trial, run.task["id"], "repair", "text", len(committed))
        reasoning = self.reasoning(rng, run, decision.action, self.params.strong.repair_reasoning_tokens)
        action = decision.action
        if action.is_answer:
            action = Action(FINAL_ANSWER, {"answer": self.answer(rng, run, committed)})
        # The repair turn answers with a tool call even for the final answer (its final_answer tool).
        return Reply(tool_calls=[ToolCall(action.tool, action.arguments)], reasoning=reasoning)

    # -- text ----------------------------------------------------------------------------------

    def size(self, sentence: str) -> int:
        if sentence not in self._sizes:
            self._sizes[sentence] = self.count(sentence + " ")
        return self._sizes[sentence]

    def write(self, rng: random.Random, tokens: int, opening: Sequence[str], pool: Sequence[str]) -> str:
        """About `tokens` tokens of text: `opening`, then sentences drawn from `pool`, cut to fit."""
        sentences = list(opening)
        total = sum(self.size(s) for s in sentences)
        while total < tokens:
            sentence = rng.choice(pool)
            sentences.append(sentence)
            total += self.size(sentence)
        text = " ".join(sentences)
        if total > tokens and len(sentences) > len(opening):
            words = text.split()
            keep = max(1, round(len(words) * tokens / total))
            text = " ".join(words[:keep])
        return text

    def reasoning(self, rng: random.Random, run: Running, action: Action, lengths: Lengths) -> str | None:
        tokens = lengths.draw(rng)
        if tokens == 0:
            return None
        step = "answer the customer" if action.is_answer else f"call {action.tool.removeprefix(PREFIX)}"
        opening = [f"The customer wrote: {instruction(run.task)[:300]}", f"The next thing to do is {step}."]
        return self.write(rng, tokens, opening, THOUGHTS)

    def answer(self, rng: random.Random, run: Running, seen: Sequence[Seen]) -> str:
        done = [step.action for step in seen if step.action.is_write and not step.error]
        opening = [
            f"I have completed {action.tool.removeprefix(PREFIX).replace('_', ' ')} "
            f"for {action.arguments.get('order_id') or action.arguments.get('user_id') or 'you'}."
            for action in done
        ] or ["I have looked into your request."]
        return self.write(rng, self.params.answer.tokens.draw(rng), opening, CLOSINGS)

    def why(self, run: Running, position: int, action: Action, right: bool) -> str:
        due = run.gold[position] if position < len(run.gold) else None
        if right:
            return "the observations so far do not clearly support it."
        if action.is_answer:
            return "the customer's request is not done yet."
        if due is None:
            return "the request is already done; the agent should answer."
        if action.tool == due.tool:
            return "its arguments do not match the record the earlier observations show."
        if action.is_write and not due.is_write:
            return "it changes the order before the details it depends on were read."
        return "this tool does not do what the customer asked for."
