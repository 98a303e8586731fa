"""The verdict the strong verifier is asked for, and how its answer is read.

`{accepted_steps, first_rejected_tool, reason, replacement_action}` is requested as a JSON
schema built per request (`verdict_schema`) that admits exactly the verdicts `parse_verdict`
reads as a decision on that segment: a grammar-bound server (llama.cpp, vLLM, SGLang) cannot
write an unreadable one. The answer is read leniently in form (a leading thinking block,
fences, prose around one object, numbers as strings) for servers without a grammar, but
strictly in meaning: the count must be within the segment and agree with the tool it names.
The prompt that asks for it is `prompts.py`'s; reading the answer stays with the reviewer,
whose retry and fail-closed rules (`strong.py`) depend on exactly what this module calls
unreadable or cut off.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from mcp_spec_proxy.wire_types import ResponseFormat

REASON_MAX_CHARS = 300
"""The longest reason the schema admits: a sentence or two. A grammar-bound server cannot ramble
inside it until max_tokens cuts the verdict off (the parser reads a longer one from a server
without a grammar)."""
VALUE_MAX_CHARS = 200
"""The longest string a replacement's argument may hold in the schema (an array: 16 items, 100 each)."""

_SCALARS: list[dict[str, Any]] = [{"type": "number"}, {"type": "boolean"}, {"type": "null"}]
_VALUE: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "maxLength": VALUE_MAX_CHARS},
        *_SCALARS,
        {"type": "array", "maxItems": 16, "items": {"anyOf": [{"type": "string", "maxLength": 100}, *_SCALARS]}},
    ]
}
_KEYS = ["accepted_steps", "first_rejected_tool", "reason", "replacement_action"]


def _replacement(calls: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """null, or a call of a tool in `calls` (tool name: its parameter names) with bounded values.

    A free-form `{tool: string, arguments: object}` is where a small model loops until max_tokens
    (a tool name that turns into prose, argument keys that never end). Here the tool is one the
    catalog has and each argument a parameter name of the catalog's, at most once, with a bounded
    value: one branch for all tools (their names, the union of their parameters), so the schema
    grows with the catalog's names, not with its schemas, and stays the same for every review of
    a session. An object-valued argument cannot be proposed this way. Whatever the replacement
    says is checked against its tool's own schema before anything runs (`strong.check_step`).
    """
    if not calls:
        return {"type": "null"}
    parameters = dict.fromkeys(name for names in calls.values() for name in names)
    arguments = {
        "type": "object",
        "properties": {name: {"$ref": "#/$defs/value"} for name in parameters},
        "additionalProperties": False,
    }
    call = {
        "type": "object",
        "properties": {"tool": {"enum": list(calls)}, "arguments": arguments},
        "required": ["tool", "arguments"],
        "additionalProperties": False,
    }
    return {"anyOf": [{"type": "null"}, call]}


def verdict_schema(tools: Sequence[str], calls: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The verdicts on a segment whose steps call `tools`: one branch for each count 0..L.

    Branch k: `accepted_steps` is k and `first_rejected_tool` the tool of step k + 1, or null
    when k = L (every step accepted) — the agreement `parse_verdict` checks, so no count can come
    with the wrong tool, an empty name or a name from elsewhere. The count and the tool are the
    first keys (grammar-bound servers write keys in schema order), then a bounded `reason`, then
    `replacement_action`: null when every step is accepted (accept wins: it would be dropped),
    else null or a call of one of `calls` (`_replacement`).
    """
    length = len(tools)
    branches = []
    for count in range(length + 1):
        rejects = count < length
        properties = {
            "accepted_steps": {"enum": [count]},
            "first_rejected_tool": {"enum": [tools[count]]} if rejects else {"type": "null"},
            "reason": {"$ref": "#/$defs/reason"},
            "replacement_action": {"$ref": "#/$defs/replacement"} if rejects else {"type": "null"},
        }
        branches.append({"properties": properties, "required": list(_KEYS), "additionalProperties": False})
    reason = {"type": "string", "minLength": 1, "maxLength": REASON_MAX_CHARS}
    defs = {"reason": reason, "replacement": _replacement(calls), "value": copy.deepcopy(_VALUE)}
    # `type: object` at the root: some providers insist on it. What the branches share is in
    # $defs, so a long segment's schema stays small where a provider counts it as prompt.
    return {"type": "object", "anyOf": branches, "$defs": defs}


def response_format(tools: Sequence[str], calls: Mapping[str, Sequence[str]]) -> ResponseFormat:
    return {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": verdict_schema(tools, calls), "strict": False},
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


_THINK_TAG = re.compile(r"<(/?)think(?:ing)?>", re.IGNORECASE)

_Span = tuple[int, int]


def _objects(text: str) -> list[tuple[_Span, Any]]:
    """Every top-level JSON object in `text` with its span, in order; prose and fences around them are skipped."""
    decoder = json.JSONDecoder()
    found: list[tuple[_Span, Any]] = []
    index = text.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
            continue
        found.append(((index, end), value))
        index = text.find("{", end)
    return found


def _reasoning(text: str, objects: Sequence[tuple[_Span, Any]]) -> tuple[list[_Span], int | None]:
    """The closed thinking blocks of `text`, and where one that never closed opened (else None).

    A tag counts only outside every JSON object: inside one it is part of a string the model
    wrote — a reason quoting a backend's output, say — and cutting there would let whoever wrote
    that output make every verdict unreadable. A close with no open before it ends a block that
    began where the last one ended (Qwen-style templates open the block in the prompt).
    """
    blocks: list[_Span] = []
    opened: int | None = None
    for tag in _THINK_TAG.finditer(text):
        if any(start <= tag.start() < end for (start, end), _ in objects):
            continue
        if tag.group(1):
            begin = opened if opened is not None else (blocks[-1][1] if blocks else 0)
            blocks.append((begin, tag.end()))
            opened = None
        elif opened is None:
            opened = tag.start()
    return blocks, opened


def _answers(text: str) -> list[Any]:
    """The JSON objects of the answer: those outside thinking blocks.

    One inside a block that never closed counts when there is no other (a server that opens the
    block and never closes it writes the answer there).
    """
    objects = _objects(text)
    blocks, opened = _reasoning(text, objects)

    def thought(start: int) -> bool:
        return any(a <= start < b for a, b in blocks) or (opened is not None and start >= opened)

    answered = [value for (start, _), value in objects if not thought(start)]
    if not answered and opened is not None:
        answered = [value for (start, _), value in objects if start >= opened]
    return answered


def cut_off(content: str | None) -> bool:
    """True when `content` ends inside a JSON object or a thinking block: the answer was cut short."""
    text = content or ""
    objects = _objects(text)
    blocks, opened = _reasoning(text, objects)
    if opened is not None:
        return True
    text = text[blocks[-1][1] :] if blocks else text
    start = text.find("{")
    if start == -1 or any(isinstance(o, dict) and "accepted_steps" in o for _, o in _objects(text)):
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

    What real servers return is read leniently: `<think>` blocks (closed or not) around the
    answer — never a tag inside its JSON (`_reasoning`) — code fences, prose around exactly one
    verdict object, numbers written as strings, and `accepted_steps: true` (every step valid)
    or `false` (the held call, the last step, is rejected; earlier steps stand). What it says
    is checked strictly: accepted_steps within 0..len(tools), and a `first_rejected_tool` that
    is null exactly when every step is accepted and otherwise names the tool of step
    accepted_steps + 1. A verdict without `first_rejected_tool` is not checked against it.
    """
    length = len(tools)
    candidates = [o for o in _answers(content or "") if isinstance(o, dict)]
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
