"""What the scripted "model" answers: `Reply`, and the policies that choose one per request.

A `Policy` decides the reply to each chat request: `Scripted` replays replies in order (and
raises `ScriptExhausted` when they run out), `Respond` wraps a function of the request.
`EmbeddingFaults` scripts failures of embeddings requests the same way.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from mcp_spec_proxy.testing.errors import ScriptExhausted
from mcp_spec_proxy.testing.requests import ChatRequest, EmbeddingRequest


@dataclass(frozen=True)
class ToolCall:
    """One function call in a reply; `id` defaults to a fresh `call_N`."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class Reply:
    """What the model answers to one request.

    `reasoning` comes back as `message.reasoning_content` (thinking-on models). `delay_s` holds
    the answer back that long, as a slow model would. A `status` of 400 or more, or an
    `error_body`, answers with an error instead (an OpenAI-shaped one unless `error_body` is
    given). `raw_body` is sent verbatim with `status`, as `application/json` — or as
    `text/event-stream` when the request streams — to script malformed answers.
    `finish_reason` defaults to `tool_calls` when there are tool calls, else `stop`.
    """

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    delay_s: float = 0
    status: int = 200
    error_body: dict[str, Any] | None = None
    raw_body: str | None = None
    finish_reason: str | None = None
    # Sent when the request asks and the server has hidden_size: one vector, or one per call.
    hidden_states: list[float] | list[list[float]] | None = None


class Policy(Protocol):
    """Decides the reply to each chat request."""

    async def reply(self, request: ChatRequest) -> Reply: ...


def _as_reply(value: Reply | str) -> Reply:
    return Reply(content=value) if isinstance(value, str) else value


class Scripted:
    """Replies in order, one per request; a plain string stands for `Reply(content=...)`.

    When the replies run out, the request is answered 500 with a message naming the script.
    """

    def __init__(self, replies: Iterable[Reply | str], *, name: str = "scripted") -> None:
        self.name = name
        self._replies = deque(_as_reply(r) for r in replies)
        self._total = len(self._replies)

    @property
    def remaining(self) -> int:
        return len(self._replies)

    async def reply(self, request: ChatRequest) -> Reply:
        if not self._replies:
            raise ScriptExhausted(
                f"script '{self.name}' is exhausted: all {self._total} of its replies were used, and a request for "
                f"model '{request.model}' (last user message {request.last_user_text[:80]!r}) has none left "
                "— add replies to the script, or answer with Respond(fn)"
            )
        return self._replies.popleft()

    def __repr__(self) -> str:
        return f"Scripted(name={self.name!r}, remaining={self.remaining})"


class Respond:
    """Replies with `fn(request)`; `fn` may be sync or async and may return a plain string."""

    def __init__(self, fn: Callable[[ChatRequest], Reply | str | Awaitable[Reply | str]]) -> None:
        self._fn = fn

    async def reply(self, request: ChatRequest) -> Reply:
        result = self._fn(request)
        if inspect.isawaitable(result):
            result = await result
        return _as_reply(result)

    def __repr__(self) -> str:
        return f"Respond({getattr(self._fn, '__qualname__', self._fn)!r})"


EmbeddingFaults = Callable[[EmbeddingRequest], "Reply | None"]
"""Decides whether an embeddings request fails: a `Reply` whose `status`, `error_body` or `raw_body`
is answered instead (as for chat), or None for the ordinary answer."""
