"""The verdict the strong verifier is asked for, and how its answer is read.

`{reason, first_rejected_tool, accepted_steps, replacement_action}` is requested as a JSON
schema built per request (accepted_steps at most L) and read leniently in form (thinking
blocks, fences, prose around one object, numbers as strings) but strictly in meaning: the count
must be within the segment and agree with the tool it names. The prompt that asks for it is
`prompts.py`'s; reading the answer stays with the reviewer, whose retry and fail-closed rules
(`strong.py`) depend on exactly what this module calls unreadable or cut off.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string"},
        "first_rejected_tool": {"type": ["string", "null"]},
        "accepted_steps": {"type": "integer", "minimum": 0},
        "replacement_action": {
            "anyOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}},
                    "required": ["tool", "arguments"],
                    "additionalProperties": False,
                },
            ]
        },
    },
    "required": ["reason", "first_rejected_tool", "accepted_steps", "replacement_action"],
    "additionalProperties": False,
}


def verdict_schema(segment_length: int) -> dict[str, Any]:
    """`VERDICT_SCHEMA` for one request: accepted_steps can be no more than the segment's length."""
    schema = copy.deepcopy(VERDICT_SCHEMA)
    schema["properties"]["accepted_steps"]["maximum"] = segment_length
    return schema


def response_format(segment_length: int) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": verdict_schema(segment_length), "strict": False},
    }


class _Replacement(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tool: str
    arguments: dict[str, Any]


class _Verdict(BaseModel):
    # Unknown keys are ignored (models add their own); what is there must be right.
    model_config = ConfigDict(extra="ignore")
    reason: str
    accepted_steps: int
    replacement_action: _Replacement | None = None
    first_rejected_tool: str | None = None


_THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think(?:ing)?>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think(?:ing)?>", re.IGNORECASE)


def _without_thinking(text: str) -> str:
    """The answer part of `text`: thinking blocks removed, also one whose tag a server cut."""
    text = _THINK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:  # the opening tag was in the prompt (Qwen-style templates): the answer follows the close
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    if opened:  # never closed: the reasoning ran to the end; an answer can only be inside it
        text = text[opened.end() :]
    return text


def _objects(text: str) -> list[Any]:
    """Every top-level JSON object in `text`, in order; prose and code fences around them are skipped."""
    decoder = json.JSONDecoder()
    found: list[Any] = []
    index = text.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
            continue
        found.append(value)
        index = text.find("{", end)
    return found


def cut_off(content: str | None) -> bool:
    """True when `content` ends inside a JSON object or a thinking block: the answer was cut short."""
    text = _THINK.sub("", content or "")
    if _THINK_OPEN.search(text) and not _THINK_CLOSE.search(text):
        return True
    text = _without_thinking(text)
    start = text.find("{")
    if start == -1 or any(isinstance(o, dict) and "accepted_steps" in o for o in _objects(text)):
        return False
    depth, quoted, escaped = 0, False, False
    for char in text[start:]:
        if quoted:
            escaped, quoted = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            quoted = True
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
    return depth > 0 or quoted


def parse_verdict(content: str | None, tools: Sequence[str]) -> _Verdict:
    """The verdict in `content` on a segment whose steps call `tools`, or ValueError saying what is wrong.

    What real servers return is read leniently: `<think>` blocks (closed or not) before the
    answer, code fences, prose around exactly one verdict object, numbers written as strings,
    and `accepted_steps: true` (every step valid) or `false` (the held call, the last step, is
    rejected; earlier steps stand). What it says is checked strictly: accepted_steps within
    0..len(tools), and a `first_rejected_tool` that is null exactly when every step is accepted
    and otherwise names the tool of step accepted_steps + 1. A verdict without
    `first_rejected_tool` is not checked against it.
    """
    length = len(tools)
    candidates = [o for o in _objects(_without_thinking(content or "")) if isinstance(o, dict)]
    verdicts = [o for o in candidates if "accepted_steps" in o] or candidates
    if len(verdicts) != 1:
        raise ValueError(f"expected one JSON verdict object, found {len(verdicts)}")
    data = dict(verdicts[0])
    accepted = data.get("accepted_steps")
    if isinstance(accepted, bool):
        data["accepted_steps"] = length if accepted else length - 1
    elif isinstance(accepted, str) and accepted.strip().isdigit():
        data["accepted_steps"] = int(accepted.strip())
    try:
        verdict = _Verdict.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'verdict'}: {e['msg']}" for e in exc.errors()[:3])
        raise ValueError(problems) from None
    count = verdict.accepted_steps
    if not 0 <= count <= length:
        raise ValueError(
            f"accepted_steps {count} is outside 0..{length}: count the steps of the segment (Step 1 to Step "
            f"{length}), not of the session"
        )
    if "first_rejected_tool" in data:
        named = verdict.first_rejected_tool
        if count == length and named is not None:
            raise ValueError(
                f"accepted_steps {count} accepts every step, yet first_rejected_tool names {named!r}: if a step "
                "is invalid, accepted_steps is the number of steps before it"
            )
        if count < length and named != tools[count]:
            raise ValueError(
                f"accepted_steps {count} makes step {count + 1} ({tools[count]}) the first rejected step, but "
                f"first_rejected_tool is {named!r}; steps are numbered 1 to {length} within the segment"
            )
    return verdict
