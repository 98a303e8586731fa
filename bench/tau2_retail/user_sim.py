"""The tau2-bench conversation: an LLM user simulator plays the customer, the proxy's engine the agent.

tau2-bench does not hand the agent a task: a user simulator holds the task's `user_scenario`
(why they call, what they know, what they do not, how they behave) and talks to the agent, and
the agent learns what to do only from what the customer says and what its tools return. This
module is that conversation, as tau2-bench runs it:

    the agent greets ("Hi! How can I help you today?");
    user turn   the simulator model, its system prompt the guidelines and the scenario, sees the
                conversation with roles flipped (the agent's messages as `user`, its own as
                `assistant`; tool calls and results are the agent's own and stay hidden) and
                writes the customer's next message — or a stop token (`###STOP###` when the goal
                is met, `###TRANSFER###`, `###OUT-OF-SCOPE###`), which ends the conversation;
    agent turn  `agent(messages)` (the runner's `engine.run` over the conversation so far) runs
                tools and answers; its committed steps join the conversation as tool calls and
                results, its answer as an assistant message.

The conversation also ends when the agent transfers to a human (`transfer_to_human_agents`), when
an agent turn ends without an answer (max_steps, a model error ...), when the simulator fails or
says nothing, and after `max_turns` agent turns. The agent is only ever given `messages`: the
scenario and the gold actions never reach it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mcp_spec_proxy.engine import RunResult
from mcp_spec_proxy.models import ChatModel, ModelCall, ModelError
from mcp_spec_proxy.prompts import FINAL_ANSWER, agent_messages

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
ENDINGS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"
TRANSFER_TOOL = "transfer_to_human_agents"

# tau2-bench's user simulation guidelines (data/tau2/user_simulator/simulation_guidelines.md).
GUIDELINES = f"""\
You are playing the role of a customer contacting a customer service representative. Your goal \
is to simulate realistic customer interactions while following specific scenario instructions.

## Core Principles
- Generate one message at a time, maintaining natural conversation flow.
- Strictly follow the scenario instructions you have received.
- Never make up or hallucinate information not provided in the scenario instructions. \
Information that is not provided in the scenario instructions should be considered unknown or \
unavailable.
- Avoid repeating the exact instructions verbatim. Use paraphrasing and natural language to \
convey the same information.
- Disclose information progressively. Wait for the agent to ask for specific information before \
providing it.

## Task Completion
- The goal is to continue the conversation until the task is complete.
- If the instruction goal is satisfied, generate the '{STOP}' token to end the conversation.
- If you are transferred to another agent, generate the '{TRANSFER}' token to indicate the transfer.
- If you find yourself in a situation in which the scenario does not provide enough information \
for you to continue the conversation, generate the '{OUT_OF_SCOPE}' token to end the conversation.

Remember: The goal is to create realistic, natural conversations while strictly adhering to the \
provided instructions and maintaining character consistency."""

_SCENARIO_FIELDS = (
    ("domain", "Domain"),
    ("reason_for_call", "Reason for call"),
    ("known_info", "Known info"),
    ("unknown_info", "Unknown info"),
    ("task_instructions", "Task instructions"),
)

Agent = Callable[[list[dict[str, Any]]], Awaitable[RunResult]]


def scenario(task: dict[str, Any]) -> str:
    """The task's user instructions as the simulator reads them (and the persona, if any)."""
    user = task.get("user_scenario") or {}
    instructions = user.get("instructions")
    if isinstance(instructions, str):
        text = instructions
    else:
        parts = [(label, (instructions or {}).get(key)) for key, label in _SCENARIO_FIELDS]
        text = "\n".join(f"{label}: {value}" for label, value in parts if value)
    persona = user.get("persona")
    return f"Persona:\n{persona}\n\nInstructions:\n{text}" if persona else text


def system_prompt(task: dict[str, Any]) -> str:
    return f"{GUIDELINES}\n\n<scenario>\n{scenario(task)}\n</scenario>"


def flipped(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user's view: the agent's text turns as `user`, the customer's as `assistant`, tools hidden."""
    view = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            continue  # a tool call's empty content
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            view.append({"role": "user", "content": content})
        elif message.get("role") == "user":
            view.append({"role": "assistant", "content": content})
    return view


def ending(text: str) -> str | None:
    """The stop token `text` holds, if any."""
    return next((token for token in ENDINGS if token in text), None)


@dataclass
class UserSimulator:
    """The customer of one task: a model, the task's scenario, and every call it made."""

    model: ChatModel
    task: dict[str, Any]

    @property
    def calls(self) -> list[ModelCall]:
        return self.model.calls

    async def reply(self, messages: list[dict[str, Any]]) -> str:
        """The customer's next message to the agent conversation `messages` (may hold a stop token)."""
        view = [{"role": "system", "content": system_prompt(self.task)}, *flipped(messages)]
        # `answer`: the simulator's text is a final answer in the client's terms (no tools, thinking off).
        completion = await self.model.complete(view, purpose="answer", thinking=False)
        return (completion.content or "").strip()


@dataclass
class Conversation:
    """What one conversation left: the agent's turns, the messages, how it ended."""

    messages: list[dict[str, Any]]
    turns: list[RunResult] = field(default_factory=list)
    ended_by: str = "max_turns"

    @property
    def opening(self) -> str:
        """The customer's first message (what LEASH routes the first agent turn on)."""
        return next((str(m["content"]) for m in self.messages if m.get("role") == "user"), "")

    def transcript(self) -> list[dict[str, str]]:
        """The text both sides saw, in order: `agent` and `user` turns (tool traffic left out)."""
        said = flipped(self.messages)
        return [{"role": "agent" if m["role"] == "user" else "user", "content": m["content"]} for m in said]

    def result(self, task_id: str) -> RunResult | None:
        """The agent's turns as one run: steps, calls, counters and wall time added up."""
        if not self.turns:
            return None
        last = self.turns[-1]
        failed = next((turn for turn in self.turns if turn.status != "answered"), None)
        merged = RunResult(
            task_id,
            last.mode,
            (failed or last).status,
            last.answer,
            [step for turn in self.turns for step in turn.steps],
            error=(failed or last).error,
        )
        for turn in self.turns:
            merged.segments += turn.segments
            merged.drafted += turn.drafted
            merged.judged += turn.judged
            merged.accepted += turn.accepted
            merged.failed += turn.failed
            merged.dropped += turn.dropped
            merged.repairs += turn.repairs
            merged.replacements += turn.replacements
            merged.calls.extend(turn.calls)
            merged.wall_s += turn.wall_s
        return merged


def agent_turn_messages(messages: list[dict[str, Any]], result: RunResult, turn: int) -> list[dict[str, Any]]:
    """`messages` with the agent turn's committed steps and its answer; call ids unique over the conversation."""
    steps = [step for step in result.steps if step.tool != FINAL_ANSWER]
    # Every turn numbers its calls from 1; the turn in the id keeps two turns' ids apart.
    added = agent_messages([], steps, call_id=lambda n: f"t{turn}_call_{n}")
    if result.answer:
        added.append({"role": "assistant", "content": result.answer})
    return [*messages, *added]


async def converse(
    agent: Agent,
    user: UserSimulator,
    *,
    system: str,
    max_turns: int,
    say: Callable[[str], Awaitable[None]] | None = None,
) -> Conversation:
    """Alternate user and agent turns from the agent's greeting until a stop, a failure or `max_turns`."""
    talk = Conversation([{"role": "system", "content": system}, {"role": "assistant", "content": GREETING}])
    for turn in range(1, max_turns + 1):
        try:
            text = await user.reply(talk.messages)
        except ModelError as exc:
            talk.ended_by = f"user simulator failed: {exc}"
            return talk
        if not text:
            talk.ended_by = "user simulator said nothing"
            return talk
        if (token := ending(text)) is not None:
            talk.ended_by = token
            return talk
        talk.messages.append({"role": "user", "content": text})
        if say is not None:
            await say(f"turn {turn}: the user wrote {json.dumps(text[:200], ensure_ascii=False)}")
        result = await agent(list(talk.messages))
        talk.turns.append(result)
        talk.messages = agent_turn_messages(talk.messages, result, turn)
        if any(step.tool.rpartition("__")[2] == TRANSFER_TOOL for step in result.steps):
            talk.ended_by = "transfer"
            return talk
        if result.status != "answered" or not result.answer:
            talk.ended_by = f"agent {result.status}"
            return talk
    return talk


__all__ = [
    "ENDINGS",
    "GREETING",
    "GUIDELINES",
    "STOP",
    "Conversation",
    "UserSimulator",
    "converse",
    "flipped",
    "scenario",
    "system_prompt",
]
