"""How the scripted model server renders an answer on the wire: a chat completion, non-streamed
or as SSE `chat.completion.chunk` events, and OpenAI-shaped error bodies."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import JSONResponse

from mcp_spec_proxy.testing.replies import Reply
from mcp_spec_proxy.testing.requests import ChatRequest
from mcp_spec_proxy.testing.tokens import embed_text
from mcp_spec_proxy.wire_types import AssistantMessage, Delta, ErrorBody, ToolCall, ToolCallDelta, Usage

# Streamed text goes out a word at a time, leading whitespace attached, so the pieces rejoin exactly.
_WORD = re.compile(r"\s*\S+|\s+")
_ARGUMENT_PIECES = 3


def _error_payload(message: str, type_: str, code: str | None = None) -> ErrorBody:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def error_response(status: int, message: str, type_: str, code: str | None = None) -> JSONResponse:
    """An OpenAI-shaped error: `{"error": {"message", "type", "param", "code"}}`."""
    return JSONResponse(_error_payload(message, type_, code), status_code=status)


def _sse(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _split(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


class Completion:
    """One reply rendered as a completion, non-streamed or as SSE chunks."""

    def __init__(
        self,
        id_: str,
        request: ChatRequest,
        reply: Reply,
        calls: list[ToolCall],
        usage: Usage,
        hidden_size: int | None = None,
        per_call_states: bool = False,
    ):
        self.hidden_size = hidden_size
        self.per_call_states = per_call_states
        self.id = id_
        self.request = request
        self.reply = reply
        self.calls = calls
        self.usage = usage
        self.created = int(time.time())
        self.finish_reason = reply.finish_reason or ("tool_calls" if calls else "stop")

    def _envelope(self, object_: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.request.model}

    def body(self) -> dict[str, Any]:
        message: AssistantMessage = {"role": "assistant", "content": self.reply.content}
        if self.reply.reasoning is not None:
            message["reasoning_content"] = self.reply.reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
        if self.hidden_size is not None and self.request.wants_hidden_states:
            choice["hidden_states"] = self.hidden_state(self.hidden_size)
        return {**self._envelope("chat.completion"), "choices": [choice], "usage": self.usage}

    def hidden_state(self, size: int) -> list[float] | list[list[float]]:
        """SGLang's non-streamed `hidden_states`: the last generated token's vector — or, with
        `per_call_states`, the state at each call's last token, one vector per call in call order."""
        if self.reply.hidden_states is not None:
            return self.reply.hidden_states
        actions = [
            json.dumps(
                {"tool": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])},
                ensure_ascii=False,
            )
            for c in self.calls
        ]
        if self.per_call_states and len(actions) > 1:
            # Each call's state has read the calls before it, as a causal model's would.
            return [embed_text("\n".join(actions[: i + 1]), size) for i in range(len(actions))]
        return embed_text("\n".join(actions) or self.reply.content or "", size)

    def _chunk(self, delta: Delta, finish_reason: str | None = None) -> str:
        chunk = self._envelope("chat.completion.chunk")
        chunk["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        if self.request.include_usage:
            chunk["usage"] = None
        return _sse(chunk)

    async def chunks(self) -> AsyncIterator[str]:
        reply = self.reply
        yield self._chunk({"role": "assistant", "content": "" if reply.content is not None else None})
        for piece in _WORD.findall(reply.reasoning or ""):
            yield self._chunk({"reasoning_content": piece})
        for piece in _WORD.findall(reply.content or ""):
            yield self._chunk({"content": piece})
        for index, call in enumerate(self.calls):
            function = call["function"]
            head: ToolCallDelta = {"index": index, "id": call["id"], "type": "function"}
            yield self._chunk({"tool_calls": [{**head, "function": {"name": function["name"], "arguments": ""}}]})
            for piece in _split(function["arguments"], _ARGUMENT_PIECES):
                yield self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield self._chunk({}, self.finish_reason)
        if self.request.include_usage:
            yield _sse({**self._envelope("chat.completion.chunk"), "choices": [], "usage": self.usage})
        yield "data: [DONE]\n\n"
