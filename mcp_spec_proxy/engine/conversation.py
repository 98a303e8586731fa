"""The conversation a run starts from, and what the user asked in it.

A bare task gets our agent instructions as its system message; a client's conversation keeps its
own system message when it has one. The reviewer sees the user's turns, in order, as the task.
"""

from __future__ import annotations

from typing import Any

AGENT_INSTRUCTIONS = """\
You are an agent working for a user through the tools provided. Call tools to find out what you \
need and to act. Make one step at a time; you may call several read-only tools at once. When \
the task is done, reply with your final answer to the user as plain text, without a tool call."""


def conversation(task: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages a run starts from: ours around a bare task, or the client's own conversation."""
    if isinstance(task, str):
        return [{"role": "system", "content": AGENT_INSTRUCTIONS}, {"role": "user", "content": task}]
    if any(message.get("role") == "system" for message in task):
        return list(task)
    return [{"role": "system", "content": AGENT_INSTRUCTIONS}, *task]


def user_request(messages: list[dict[str, Any]]) -> str:
    """What the user asked, for the reviewer: the user turns of the conversation, in order."""
    turns = [content_text(m.get("content")) for m in messages if m.get("role") == "user"]
    return "\n\n".join(turn for turn in turns if turn)


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
