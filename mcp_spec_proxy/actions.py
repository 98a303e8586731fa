"""Tool calls a model drafts, and JSON actions: tool calls for servers whose tool parsers fail.

A drafting model acts either by native `tools` (OpenAI tool calls) or, with `actions: json`, by
one JSON object: the tools are described in the system prompt (`action_messages`) and the reply
is constrained by a `response_format` json_schema (`action_format`) — the anyOf of `{tool: const
name, arguments: its input schema}` per tool and `{answer: string}` — which grammar-constrained
local servers follow far better than their tool-call parsers. `parse_action` reads the reply back
into the same `ToolCall`s a native answer gives, so callers never see the difference; a reply that
does not parse comes back as an error text for the model to see, never as an exception.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcp_spec_proxy.wire_types import ResponseFormat


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model drafted, natively or as a JSON action."""

    name: str
    arguments: str  # as the model wrote it: JSON text, not yet trusted
    id: str = ""


ACTION_INSTRUCTIONS = """\
You act by replying with exactly one JSON object and nothing else: {"tool": "<tool name>", \
"arguments": {...}} calls one tool with arguments that follow its schema{answer}. The tools:"""


def action_format(tools: Sequence[Mapping[str, Any]], *, answers: bool = True) -> ResponseFormat:
    """`response_format` json_schema: one call of an offered tool, or (with `answers`) a final answer."""
    branches: list[dict[str, Any]] = []
    for tool in tools:
        function = tool.get("function") or {}
        schema = function.get("parameters") or {"type": "object"}
        branches.append(
            {
                "type": "object",
                "properties": {"tool": {"const": function.get("name", "")}, "arguments": schema},
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
        )
    if answers:
        branches.append(
            {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
                "additionalProperties": False,
            }
        )
    return {"type": "json_schema", "json_schema": {"name": "action", "schema": {"anyOf": branches}, "strict": False}}


def action_messages(
    messages: list[dict[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    *,
    answers: bool = True,
    defined: bool = False,
) -> list[dict[str, Any]]:
    """The conversation for JSON actions: the tools described in the system prompt (first, so the
    prefix cache keeps serving it), earlier tool calls as the JSON the model writes, and tool
    results as user turns (chat templates without a tool role render them too).

    `defined`: the messages define the tools already (the repair turn's prompt is the verifier's,
    whose fenced tool definitions hold every tool offered) and are another request's prefix. The
    guide then only names the tools, at the end of the last user message: the system message and
    every message before keep the bytes the other request sent, which a prefix cache serves, and
    no backend-written description reaches the prompt outside the messages' own fences."""
    answer = ', or {"answer": "<text>"} gives your final answer and ends the task' if answers else ""
    lines = [ACTION_INSTRUCTIONS.replace("{answer}", answer)]
    if defined:  # names are the catalog's (letters, digits, `_.-`); the grammar holds the arguments
        offered = ", ".join(str((tool.get("function") or {}).get("name", "")) for tool in tools)
        lines[0] += f" {offered} (their definitions are above)."
    for tool in [] if defined else tools:
        function = tool.get("function") or {}
        lines.append(f"- {function.get('name', '')}: {function.get('description') or ''}".rstrip())
        schema = json.dumps(function.get("parameters") or {}, ensure_ascii=False, sort_keys=True)
        lines.append(f"  arguments: {schema}")
    guide = "\n".join(lines)
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            actions = []
            for tool_call in message["tool_calls"]:
                function = tool_call.get("function") or {}
                names[str(tool_call.get("id", ""))] = str(function.get("name", ""))
                actions.append(action_text(str(function.get("name", "")), function.get("arguments") or "{}"))
            out.append({"role": "assistant", "content": "\n".join(actions)})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id", "")), "the tool")
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            out.append({"role": "user", "content": f"Result of {name}:\n{text}"})
        else:
            out.append(dict(message))
    if defined:
        if out and out[-1].get("role") == "user" and isinstance(out[-1].get("content"), str):
            out[-1]["content"] = f"{out[-1]['content']}\n\n{guide}"
        else:
            out.append({"role": "user", "content": guide})
    elif out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{guide}"
    else:
        out.insert(0, {"role": "system", "content": guide})
    return out


def action_text(name: str, arguments: str | dict[str, Any]) -> str:
    """A tool call as the JSON action a model writes (also the text embedded for its hidden state)."""
    if isinstance(arguments, str):
        try:
            parsed: Any = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            parsed = arguments
    else:
        parsed = arguments
    return json.dumps({"tool": name, "arguments": parsed}, ensure_ascii=False)


def parse_action(content: str | None) -> tuple[str | None, tuple[ToolCall, ...], str | None]:
    """A JSON action as (answer, tool calls, error): a call, an answer, or what was wrong with it."""
    text = (content or "").strip()
    if text.startswith("```"):  # a server that did not enforce the schema may fence it
        text = text.strip("`").removeprefix("json").strip()
    try:
        action = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, (), f"the reply is not a JSON action ({exc}): {shorten(text, 200)}"
    if isinstance(action, dict) and isinstance(action.get("tool"), str) and action["tool"]:
        arguments = action.get("arguments", {})
        if not isinstance(arguments, dict):
            return None, (), f"the arguments of {action['tool']} are not a JSON object: {shorten(text, 200)}"
        return None, (ToolCall(action["tool"], json.dumps(arguments, ensure_ascii=False), "action_1"),), None
    if isinstance(action, dict) and isinstance(action.get("answer"), str):
        return action["answer"], (), None
    return None, (), f'the reply is neither {{"tool", "arguments"}} nor {{"answer"}}: {shorten(text, 200)}'


def shorten(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters for an error message."""
    return text if len(text) <= limit else text[:limit] + "…"
