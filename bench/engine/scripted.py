"""The scripted weak and strong models behind one server: they read the real prompts, follow the gold."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from bench.engine.tasks import Act, Task, answer
from mcp_spec_proxy.prompts import REPAIR_HEADING, review_steps, segment_block
from mcp_spec_proxy.testing import ChatRequest, Reply, ToolCall
from mcp_spec_proxy.testing.tokens import tokenize

WEAK, STRONG = "weak-model", "strong-model"

THOUGHTS = (
    "I should make sure every path stays inside the allowed directory.",
    "The tool output so far shows no error, so the earlier steps did what they were meant to.",
    "Let me reread the last observation before acting on it, because the file names are similar.",
    "Writing a file replaces all of its content, so whatever I write has to be complete.",
    "The user was specific about the file name, and I should not invent a different one.",
    "There is no need to ask the user anything here; the request is clear enough.",
    "If I am unsure about the exact text, reading the file again is cheap compared with a wrong edit.",
    "I want to keep the existing wording and line breaks exactly as they are in the original.",
    "A listing tells me what exists, but not what the files say, so I still need to read them.",
    "The observations are data, not instructions, so nothing in them changes what I was asked to do.",
    "Doing this in one call is better than several partial writes that could leave the file half done.",
    "I will not touch any other file than the ones the task names or clearly implies.",
    "The previous step succeeded, so the state on disk now matches what I expect.",
    "Checking the arguments against the schema: the path is a string and every required field is set.",
    "Once this step is done, the remaining work is small and I can tell the user what changed.",
    "It is worth double-checking dates and version numbers, since those are easy to copy from the wrong place.",
    "The final answer should say what was done and where, in one or two sentences, without extra detail.",
    "Nothing here is destructive beyond what the user asked for, so I can go ahead.",
    "If the tool returns an error, I will read the message and adjust rather than retry blindly.",
    "Let me think about whether there is a simpler way to do this; I do not see one that is also safe.",
)


def reasoning(seed: int, task: Task, position: int, purpose: str) -> str:
    """A thinking text of 150-400 words, the same for the same seed, task, step and purpose."""
    rng = random.Random(f"{seed}:{task.id}:{purpose}:{position}")
    words = rng.randint(150, 400)
    act = task.gold[position]
    target = act.arguments.get("path") or act.arguments.get("source") or act.arguments.get("paths") or "the user"
    sentences = [
        f"The user asked: {task.prompt}",
        f"{position} step{'s' if position != 1 else ''} of this task are done so far.",
        f"The next thing to do is {act.tool.removeprefix('fs__').replace('_', ' ')} for {target}.",
    ]
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(rng.choice(THOUGHTS))
    return " ".join(" ".join(sentences).split()[:words]).rstrip(".,;:") + "."


def segment_steps(request: ChatRequest) -> list[dict[str, Any]]:
    """The segment block's steps, each with the tool and arguments of its "Step N" turn."""
    _, numbered = review_steps(request.messages)
    return [{**step, **numbered[step["step"] - 1].call()} for step in segment_block(request.messages)]


def step_messages(request: ChatRequest) -> list[dict[str, Any]]:
    """The steps a review or repair prompt lists as done: committed, plus a repair's accepted prefix.

    A repair prompt shows the verifier's accepted steps numbered, then the rejected call last.
    """
    committed, numbered = review_steps(request.messages)
    calls = [step.call() for step in committed]
    if is_repair(request):
        return [*calls, *(step.call() for step in numbered[:-1])]
    return calls


def is_repair(request: ChatRequest) -> bool:
    return request.json_schema is None and request.last_user_text.startswith(REPAIR_HEADING)


def committed_steps(request: ChatRequest) -> list[Act]:
    return [Act(step["tool"], step["arguments"]) for step in step_messages(request)]


def gold_progress(task: Task, steps: list[Act]) -> int:
    """How far along the gold `steps` are: steps off the gold (a wrong read a short K let through) are skipped."""
    position = 0
    for step in steps:
        if position < len(task.gold) and step == task.gold[position]:
            position += 1
    return position


def agent_history(request: ChatRequest) -> list[Act]:
    acts: list[Act] = []
    for message in request.messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        if not calls:
            acts.append(answer(str(message.get("content") or "")))
        for call in calls:
            acts.append(Act(call["function"]["name"], json.loads(call["function"]["arguments"])))
    return acts


@dataclass
class Scripted:
    """Both models behind one server, for the task now running."""

    seed: int
    task: Task | None = None
    repair_mismatches: list[str] = field(default_factory=list)
    expected_repair_listing: int | None = None  # committed steps the next repair prompt should list

    def reply(self, request: ChatRequest) -> Reply:
        task = self.task
        assert task is not None, "a model was called with no task running"
        if request.model == WEAK:
            return task.weak_next(agent_history(request)).as_reply()
        if request.json_schema is not None:
            return self.verify(task, request)
        if is_repair(request):
            listed = committed_steps(request)
            expected = self.expected_repair_listing
            if expected is not None and len(listed) > expected:
                extra = step_messages(request)[expected:]
                tokens = len(tokenize(json.dumps(extra, ensure_ascii=False, separators=(",", ":"))))
                self.repair_mismatches.append(
                    f"{task.id}: the repair prompt lists {len(listed)} committed steps, the run had {expected} "
                    f"(history + the verdict's accepted prefix): ~{tokens} extra prompt tokens"
                )
            position = gold_progress(task, listed)
            return self.tool_call(task.gold[position], reasoning(self.seed, task, position, "repair"))
        position = len(agent_history(request))  # strong-only: the strong model authors the gold
        return task.gold[position].as_reply(reasoning(self.seed, task, position, "author"))

    def verify(self, task: Task, request: ChatRequest) -> Reply:
        """Accept the longest prefix that follows the gold; else name the first wrong step."""
        committed, steps = committed_steps(request), segment_steps(request)
        position = gold_progress(task, committed)
        for j, step in enumerate(steps):
            k = position + j
            if k >= len(task.gold) or Act(step["tool"], step["arguments"]) != task.gold[k]:
                self.expected_repair_listing = len(committed) + j
                detour = task.detour
                reason = detour.reason if detour else f"step {j + 1} does not follow from the request"
                replacement = task.gold[k].as_action() if detour and detour.replace and k < len(task.gold) else None
                verdict = {"reason": reason, "first_rejected_tool": step["tool"], "accepted_steps": j}
                return Reply(content=json.dumps({**verdict, "replacement_action": replacement}))
        reason = f"All {len(steps)} steps follow from the request and what the reads returned; the held call is right."
        verdict = {"reason": reason, "first_rejected_tool": None, "accepted_steps": len(steps)}
        return Reply(content=json.dumps({**verdict, "replacement_action": None}))

    @staticmethod
    def tool_call(act: Act, thinking: str) -> Reply:
        # The repair turn answers with a tool call even for the final answer (its final_answer tool).
        return Reply(tool_calls=[ToolCall(act.tool, act.arguments)], reasoning=thinking)
