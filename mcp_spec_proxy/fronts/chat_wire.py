"""The chat-completions wire format the gateway speaks: bodies, stream chunks, error bodies.

Everything here is pure formatting, with no session state: a finished run rendered as the
messages the models see next turn (`rendered`), a message's text (`message_text`), a completion
cut into server-sent-event chunks (`chunks`), JSON that is always ASCII (`AsciiJSON`: a lone
surrogate a model wrote still makes a valid answer), and OpenAI-shaped error bodies.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse

from mcp_spec_proxy.engine import RunResult
from mcp_spec_proxy.prompts import agent_messages
from mcp_spec_proxy.wire_types import ChatCompletion, Delta, ErrorBody, ToolCallDelta


def rendered(result: RunResult) -> list[dict[str, Any]]:
    """A finished run's committed steps and answer, as the models will see them next turn.

    Fresh call ids: the transcript outlives the run, and a later run numbers its own calls.
    """
    return agent_messages([], result.steps, answer=result.answer, call_id=lambda _: f"call_{uuid.uuid4().hex[:12]}")


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


async def chunks(response: ChatCompletion, include_usage: bool) -> AsyncIterator[str]:
    base = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
    }
    choice = response["choices"][0]
    message = choice["message"]

    def chunk(delta: Delta, finish: str | None = None) -> str:
        payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return f"data: {json.dumps(payload)}\n\n"  # ASCII-escaped, like AsciiJSON

    yield chunk({"role": "assistant", "content": ""})
    if message.get("tool_calls"):
        for index, call in enumerate(message["tool_calls"]):
            head: ToolCallDelta = {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            yield chunk({"tool_calls": [head]})
            arguments = call["function"]["arguments"]
            for start in range(0, len(arguments), 64):
                yield chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": arguments[start : start + 64]}}]}
                )
    else:
        text = message.get("content") or ""
        for start in range(0, len(text), 64):
            yield chunk({"content": text[start : start + 64]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield f"data: {json.dumps({**base, 'choices': [], 'usage': response['usage']})}\n\n"
    yield "data: [DONE]\n\n"


class AsciiJSON(JSONResponse):
    """JSON with every non-ASCII character escaped: a lone surrogate in a model's text cannot be
    encoded as UTF-8, but `\\udXXX` is valid JSON, so the answer still goes out."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(status: int, message: str, code: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 and status != 424 else "server_error"  # 424: upstream failed
    body: ErrorBody = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return AsciiJSON(body, status_code=status)
