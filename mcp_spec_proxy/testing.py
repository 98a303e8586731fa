"""A scripted OpenAI-compatible model server: a test double shipped with the package on purpose.

`from mcp_spec_proxy.testing import ScriptedModelServer, Scripted, Respond, Reply, ToolCall` gives
your own tests (and ours, and the benchmarks in the repository's `bench/`) a model to point the
proxy's `weak`/`strong` endpoints at, in place of a real LLM.

`ScriptedModelServer(policy)` is a real HTTP server (Starlette on uvicorn, 127.0.0.1, port 0)
that speaks the OpenAI chat-completions wire format, so the product's model client — the official
`openai.AsyncOpenAI` — is exercised over real HTTP. What the "model" answers is decided by a
`Policy`: `Scripted` replays `Reply` objects in order, `Respond` wraps a function of the request.

Endpoints: `GET /v1/models`; `POST /v1/chat/completions`, plain or streamed (`"stream": true`:
SSE `chat.completion.chunk` events, tool calls as indexed deltas with their arguments split over
chunks, a usage chunk with empty choices when `stream_options.include_usage` is set, then
`data: [DONE]`); `POST /v1/embeddings` (OpenAI format, `encoding_format` `float` or `base64`):
deterministic vectors from `embed_text` — a bag of words, each word a unit-variance Gaussian
vector seeded by the word's blake2b hash, normalised — so equal texts get equal vectors and texts
sharing words are similar; `embedding_dim` (64) unless the request asks for `dimensions`.
With `hidden_size`, a chat request that says `"return_hidden_states": true` gets SGLang's answer
shape: `choices[0].hidden_states`, the last generated token's vector — the reply's scripted
`hidden_states`, else `embed_text` of its tool calls' JSON actions (or its content); without
`hidden_size` the field is ignored, as servers without hidden states do.

Promises:

- Every request is recorded in `server.requests` (method, path, parsed JSON body) in arrival
  order before it is answered, malformed ones included; valid chat requests also appear, parsed,
  in `server.chat_requests`, valid embeddings requests in `server.embedding_requests`. A
  `response_format` (e.g. `json_schema`) is recorded, never enforced: a policy may answer with
  content that does not conform.
- Every completion reports usage. Token counts are an APPROXIMATION, not any real tokenizer's: a
  deterministic regex (`\\w+|[^\\w\\s]`) over the rendered prompt — the JSON of tools, then
  messages, then response_format — and over the reply's reasoning, content and tool-call
  arguments. Good for comparing prompts with each other, not for absolute numbers. With a
  `tokenizer` (a callable text -> token count, e.g. a real model's), the same texts are counted
  with it instead, and the cached prefix is the text of the regex tokens the cache matched,
  counted with it and rounded down to whole blocks.
- `prompt_tokens_details.cached_tokens` simulates a prefix cache (SGLang's radix cache, vLLM's
  prefix caching): the longest common token prefix between this prompt and any of the last
  `PREFIX_CACHE_PROMPTS` prompts sent to the same model, rounded down to whole blocks of
  `cache_block` tokens (16 by default, vLLM's block size) — so the few tokens of JSON framing
  every prompt starts with never count, and an unrelated prompt reports 0. `cache_block=1` gives
  the exact common prefix. Tools render first because chat templates put tool definitions in the
  system preamble, so a stable system prompt plus tools is a reusable prefix. An identical prompt
  is cached in full (up to block rounding).
- Errors have the OpenAI shape `{"error": {"message", "type", "param", "code"}}`: a body that is
  not JSON, or not a chat request, → 400; a `Reply` may script any status, error body or raw
  bytes; a policy that raises (an exhausted `Scripted` included) → 500 whose message names it.
- Lifetime: `async with ScriptedModelServer(policy) as server:` serves on the caller's event loop
  (asyncio: uvicorn needs it). The socket listens before the block is entered, so
  `server.base_url` is usable at once. Leaving the block cuts scripted delays short (they answer
  503), stops uvicorn, and waits at most `SHUTDOWN_TIMEOUT_S` before cancelling it.

Beware when pointing `openai.AsyncOpenAI` at it: the client retries 408/409/429/5xx and timeouts
(`max_retries=2` by default), so a scripted error consumes as many replies as attempts are made;
tests that script errors should pass `max_retries=0`.
"""

from __future__ import annotations

import base64
import hashlib
import inspect
import itertools
import json
import logging
import re
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

import anyio
import anyio.abc
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 5.0
PREFIX_CACHE_PROMPTS = 256
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
EMBEDDINGS_PATH = "/v1/embeddings"

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = re.compile(r"\w+")
# Streamed text goes out a word at a time, leading whitespace attached, so the pieces rejoin exactly.
_WORD = re.compile(r"\s*\S+|\s+")
_ARGUMENT_PIECES = 3
# Request fields ChatRequest names; the rest go to `extra`.
_KNOWN_FIELDS = frozenset(("model", "messages", "tools", "response_format", "stream", "stream_options"))
_KNOWN_FIELDS |= {"chat_template_kwargs", "reasoning_effort"}


class ScriptedModelError(Exception):
    """Base of the errors this module raises on purpose.

    ScriptedModelError
    ├── InvalidChatRequest   the body is not a chat-completions request (answered 400)
    ├── InvalidEmbeddingRequest  the body is not an embeddings request (answered 400)
    └── ScriptExhausted      a `Scripted` policy has no reply left (answered 500)
    """


class InvalidChatRequest(ScriptedModelError):
    """The request body is not a chat-completions request."""


class InvalidEmbeddingRequest(ScriptedModelError):
    """The request body is not an embeddings request."""


class ScriptExhausted(ScriptedModelError):
    """A `Scripted` policy was asked for more replies than it holds."""


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
    hidden_states: list[float] | None = None  # sent when the request asks and the server has hidden_size


@dataclass(frozen=True)
class ChatRequest:
    """A typed view of a chat-completions request body.

    `extra` holds every top-level field not named here (temperature, max_tokens, tool_choice...);
    `raw` is the whole body as received.
    """

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    response_format: dict[str, Any] | None = None
    stream: bool = False
    include_usage: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: object) -> ChatRequest:
        """Validate a parsed JSON body; raises `InvalidChatRequest` saying what is wrong."""
        if not isinstance(body, dict):
            raise InvalidChatRequest(f"request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if not isinstance(model, str):
            raise InvalidChatRequest("'model' is required and must be a string")
        stream = body.get("stream") or False
        if not isinstance(stream, bool):
            raise InvalidChatRequest("'stream' must be a boolean")
        stream_options = _optional_dict(body, "stream_options") or {}
        reasoning_effort = body.get("reasoning_effort")
        if reasoning_effort is not None and not isinstance(reasoning_effort, str):
            raise InvalidChatRequest("'reasoning_effort' must be a string")
        return cls(
            model=model,
            messages=_list_of_dicts(body, "messages", required=True),
            tools=_list_of_dicts(body, "tools", required=False),
            response_format=_optional_dict(body, "response_format"),
            stream=stream,
            include_usage=bool(stream_options.get("include_usage")),
            chat_template_kwargs=_optional_dict(body, "chat_template_kwargs") or {},
            reasoning_effort=reasoning_effort,
            extra={k: v for k, v in body.items() if k not in _KNOWN_FIELDS},
            raw=body,
        )

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The `json_schema` object of a `response_format` of that type, else None."""
        rf = self.response_format
        if rf is None or rf.get("type") != "json_schema":
            return None
        schema = rf.get("json_schema")
        return schema if isinstance(schema, dict) else None

    @property
    def wants_hidden_states(self) -> bool:
        """The request asks for SGLang's `return_hidden_states`."""
        return self.raw.get("return_hidden_states") is True

    @property
    def last_user_text(self) -> str:
        """The text of the last user message (text parts joined), or "" when there is none."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""


def _list_of_dicts(body: dict[str, Any], key: str, *, required: bool) -> list[dict[str, Any]]:
    value = body.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InvalidChatRequest(f"'{key}' must be a list of objects")
    return value


def _optional_dict(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise InvalidChatRequest(f"'{key}' must be an object")
    return value


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


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


@dataclass(frozen=True)
class ReceivedRequest:
    """One HTTP request as received; `body` is the parsed JSON, None for GET or a body that is not JSON."""

    method: str
    path: str
    body: Any


@dataclass(frozen=True)
class EmbeddingRequest:
    """A typed view of an embeddings request body; `input` is always a list of strings."""

    model: str
    input: list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: object) -> EmbeddingRequest:
        """Validate a parsed JSON body; raises `InvalidEmbeddingRequest` saying what is wrong."""
        if not isinstance(body, dict):
            raise InvalidEmbeddingRequest(f"request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if not isinstance(model, str):
            raise InvalidEmbeddingRequest("'model' is required and must be a string")
        value = body.get("input")
        inputs = [value] if isinstance(value, str) else value
        if not isinstance(inputs, list) or not inputs or not all(isinstance(item, str) for item in inputs):
            raise InvalidEmbeddingRequest(
                "'input' must be a string or a non-empty list of strings (token arrays are not supported here)"
            )
        if any(item == "" for item in inputs):
            raise InvalidEmbeddingRequest("'input' cannot contain an empty string")
        encoding_format = body.get("encoding_format") or "float"
        if encoding_format not in ("float", "base64"):
            raise InvalidEmbeddingRequest(f"'encoding_format' must be 'float' or 'base64', got {encoding_format!r}")
        dimensions = body.get("dimensions")
        if dimensions is not None and (
            not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
        ):
            raise InvalidEmbeddingRequest("'dimensions' must be a positive integer")
        return cls(model, inputs, encoding_format, dimensions, body)


EmbeddingFaults = Callable[[EmbeddingRequest], "Reply | None"]
"""Decides whether an embeddings request fails: a `Reply` whose `status`, `error_body` or `raw_body`
is answered instead (as for chat), or None for the ordinary answer."""


def embed_text(text: str, dim: int) -> list[float]:
    """The scripted server's embedding of `text`: deterministic, unit length, similar for shared words."""
    words = _WORDS.findall(text.lower()) or [text]
    total = np.zeros(dim, dtype=np.float64)
    for word in words:
        seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        total += np.random.default_rng(seed).standard_normal(dim)
    norm = float(np.linalg.norm(total))
    unit = total / norm if norm > 0 else total
    return [float(x) for x in unit.astype(np.float32)]


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _render_prompt(request: ChatRequest) -> str:
    parts: list[object] = [request.tools] if request.tools else []
    parts.append(request.messages)
    if request.response_format is not None:
        parts.append(request.response_format)
    return "".join(json.dumps(part, ensure_ascii=False, separators=(",", ":")) for part in parts)


class _PrefixCache:
    """The last `capacity` prompts per model, in a token trie (a radix cache without the compression).

    A lookup walks the prompt once, so it costs the prompt's length, not the cache's size; past
    `capacity` prompts the trie is rebuilt from the newer half.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = max(1, capacity)
        self._recent: deque[tuple[str, list[str]]] = deque()
        self._roots: dict[str, dict[str, Any]] = {}

    def lookup_and_add(self, model: str, tokens: list[str]) -> int:
        cached = self._insert(model, tokens)
        self._recent.append((model, tokens))
        if len(self._recent) > self._capacity:
            while len(self._recent) > self._capacity // 2:
                self._recent.popleft()
            self._roots = {}
            for kept_model, kept in self._recent:
                self._insert(kept_model, kept)
        return cached

    def _insert(self, model: str, tokens: list[str]) -> int:
        node = self._roots.setdefault(model, {})
        cached = 0
        fresh = False
        for token in tokens:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                fresh = True
            elif not fresh:
                cached += 1
            node = child
        return cached


def _error_payload(message: str, type_: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _error(status: int, message: str, type_: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(_error_payload(message, type_, code), status_code=status)


def _sse(payload: object) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _split(text: str, parts: int) -> list[str]:
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


class _Completion:
    """One reply rendered as a completion, non-streamed or as SSE chunks."""

    def __init__(
        self,
        id_: str,
        request: ChatRequest,
        reply: Reply,
        calls: list[dict[str, Any]],
        usage: dict[str, Any],
        hidden_size: int | None = None,
    ):
        self.hidden_size = hidden_size
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
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.content}
        if self.reply.reasoning is not None:
            message["reasoning_content"] = self.reply.reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
        if self.hidden_size is not None and self.request.wants_hidden_states:
            choice["hidden_states"] = self.hidden_state(self.hidden_size)
        return {**self._envelope("chat.completion"), "choices": [choice], "usage": self.usage}

    def hidden_state(self, size: int) -> list[float]:
        """SGLang's non-streamed `hidden_states`: the last generated token's vector."""
        if self.reply.hidden_states is not None:
            return self.reply.hidden_states
        actions = [
            json.dumps(
                {"tool": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])},
                ensure_ascii=False,
            )
            for c in self.calls
        ]
        return embed_text("\n".join(actions) or self.reply.content or "", size)

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> str:
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
            head = {"index": index, "id": call["id"], "type": "function"}
            yield self._chunk({"tool_calls": [{**head, "function": {"name": function["name"], "arguments": ""}}]})
            for piece in _split(function["arguments"], _ARGUMENT_PIECES):
                yield self._chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield self._chunk({}, self.finish_reason)
        if self.request.include_usage:
            yield _sse({**self._envelope("chat.completion.chunk"), "choices": [], "usage": self.usage})
        yield "data: [DONE]\n\n"


class ScriptedModelServer:
    """An OpenAI-compatible HTTP model server answering by `policy`; see the module docstring."""

    def __init__(
        self,
        policy: Policy,
        *,
        models: Sequence[str] = ("scripted-model",),
        host: str = "127.0.0.1",
        cache_block: int = 16,
        embedding_dim: int = 64,
        embedding_faults: EmbeddingFaults | None = None,
        tokenizer: Callable[[str], int] | None = None,
        hidden_size: int | None = None,
    ):
        if cache_block < 1:
            raise ValueError(f"cache_block must be at least 1 token, got {cache_block}")
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be at least 1, got {embedding_dim}")
        if hidden_size is not None and hidden_size < 1:
            raise ValueError(f"hidden_size must be at least 1, got {hidden_size}")
        self.hidden_size = hidden_size
        self.embedding_dim = embedding_dim
        self.embedding_faults = embedding_faults
        self.embedding_requests: list[EmbeddingRequest] = []
        self.tokenizer = tokenizer
        self.models = tuple(models)
        self.cache_block = cache_block
        self.host = host
        self.requests: list[ReceivedRequest] = []
        self.chat_requests: list[ChatRequest] = []
        self._policy = policy
        self._cache = _PrefixCache(PREFIX_CACHE_PROMPTS)
        self._completion_ids = itertools.count(1)
        self._call_ids = itertools.count(1)
        self._port: int | None = None
        self._stack: AsyncExitStack | None = None
        self._closing: anyio.Event | None = None

    @property
    def policy(self) -> Policy:
        return self._policy

    def set_policy(self, policy: Policy) -> None:
        """Answer the requests from now on with `policy`."""
        self._policy = policy

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ScriptedModelServer is not running — use it as `async with ScriptedModelServer(...)`")
        return self._port

    @property
    def base_url(self) -> str:
        """For `AsyncOpenAI(base_url=...)`: `http://127.0.0.1:PORT/v1`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError("ScriptedModelServer is already running; leave its `async with` block first")
        self._closing = anyio.Event()
        stopped = anyio.Event()
        async with AsyncExitStack() as stack:
            sock = socket.socket(
                socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
            )
            stack.callback(sock.close)
            sock.bind((self.host, 0))
            sock.listen(128)
            sock.setblocking(False)
            self._port = sock.getsockname()[1]
            config = uvicorn.Config(
                self._app(),
                lifespan="off",
                # No logging configuration: uvicorn's would reconfigure the process's loggers.
                log_config=None,
                log_level=None,
                # uvicorn cancels its own stragglers first; `_stop` cancels the whole server past SHUTDOWN_TIMEOUT_S.
                timeout_graceful_shutdown=int(SHUTDOWN_TIMEOUT_S // 2),
            )
            server = uvicorn.Server(config)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.push_async_callback(self._stop, server, tg, stopped)
            tg.start_soon(self._serve, server, sock, stopped)
            # The socket already listens: a client connecting before uvicorn accepts waits in the backlog.
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        self._port = None
        if stack is None:
            return None
        return await stack.__aexit__(exc_type, exc, tb)

    async def _serve(self, server: uvicorn.Server, sock: socket.socket, stopped: anyio.Event) -> None:
        try:
            await server.serve(sockets=[sock])
        finally:
            stopped.set()

    async def _stop(self, server: uvicorn.Server, tg: anyio.abc.TaskGroup, stopped: anyio.Event) -> None:
        assert self._closing is not None  # set in __aenter__, which registered this callback
        self._closing.set()
        server.should_exit = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT_S):
            await stopped.wait()
        if not stopped.is_set():
            logger.warning("scripted model server did not stop within %.1f s; cancelling it", SHUTDOWN_TIMEOUT_S)
            server.force_exit = True
            tg.cancel_scope.cancel()

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(MODELS_PATH, self._models, methods=["GET"]),
                Route(CHAT_PATH, self._chat, methods=["POST"]),
                Route(EMBEDDINGS_PATH, self._embeddings, methods=["POST"]),
                Route("/{path:path}", self._unknown, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
            ]
        )

    async def _models(self, request: Request) -> Response:
        self.requests.append(ReceivedRequest(request.method, request.url.path, None))
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted-model-server"} for m in self.models]
        return JSONResponse({"object": "list", "data": data})

    async def _unknown(self, request: Request) -> Response:
        self.requests.append(ReceivedRequest(request.method, request.url.path, await _json_or_none(request)))
        return _error(
            404,
            f"no endpoint {request.method} {request.url.path}: the scripted model server serves GET {MODELS_PATH}, "
            f"POST {CHAT_PATH} and POST {EMBEDDINGS_PATH} — does the client's base_url end in /v1?",
            "invalid_request_error",
            "unknown_url",
        )

    async def _chat(self, request: Request) -> Response:
        """The one place where a request's failures become HTTP errors."""
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            self.requests.append(ReceivedRequest(request.method, request.url.path, None))
            return _error(400, f"request body is not valid JSON ({exc}) — send a JSON object", "invalid_request_error")
        self.requests.append(ReceivedRequest(request.method, request.url.path, body))
        try:
            chat = ChatRequest.from_body(body)
        except InvalidChatRequest as exc:
            return _error(400, str(exc), "invalid_request_error")
        self.chat_requests.append(chat)
        # Tokenized on the loop, not in a thread: prompts here are small, and cache order must follow arrival order.
        prompt_text = _render_prompt(chat)
        prompt_tokens = _tokens(prompt_text)
        cached = self._cache.lookup_and_add(chat.model, prompt_tokens)
        prompt_count = len(prompt_tokens)
        if self.tokenizer is not None:
            prompt_count = self.tokenizer(prompt_text)
            cached = min(self.tokenizer(_prefix(prompt_text, cached)), prompt_count)
        cached = cached // self.cache_block * self.cache_block

        policy = self._policy
        try:
            reply = await policy.reply(chat)
        except ScriptExhausted as exc:
            return _error(500, str(exc), "server_error", "script_exhausted")
        except Exception as exc:
            # A policy is test code: its bug must reach the test as a readable 500, not a bare disconnect.
            logger.exception("policy %r failed", policy)
            return _error(500, f"policy {policy!r} raised {type(exc).__name__}: {exc}", "server_error", "policy_error")

        if reply.delay_s > 0:
            assert self._closing is not None  # the app only runs between __aenter__ and __aexit__
            with anyio.move_on_after(reply.delay_s):
                await self._closing.wait()
            if self._closing.is_set():
                return _error(503, "scripted model server is shutting down", "server_error")

        if reply.raw_body is not None:
            media_type = "text/event-stream" if chat.stream else "application/json"
            return Response(reply.raw_body, status_code=reply.status, media_type=media_type)
        if reply.error_body is not None:
            return JSONResponse(reply.error_body, status_code=reply.status)
        if reply.status >= 400:
            return _error(reply.status, f"scripted HTTP {reply.status}", "server_error")

        calls = [
            {
                "id": call.id or f"call_{next(self._call_ids)}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in reply.tool_calls
        ]
        completion = _Completion(
            f"chatcmpl-scripted-{next(self._completion_ids)}",
            chat,
            reply,
            calls,
            _usage(prompt_count, cached, reply, calls, self.tokenizer),
            self.hidden_size,
        )
        if chat.stream:
            return StreamingResponse(completion.chunks(), status_code=reply.status, media_type="text/event-stream")
        return JSONResponse(completion.body(), status_code=reply.status)

    async def _embeddings(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            self.requests.append(ReceivedRequest(request.method, request.url.path, None))
            return _error(400, f"request body is not valid JSON ({exc}) — send a JSON object", "invalid_request_error")
        self.requests.append(ReceivedRequest(request.method, request.url.path, body))
        try:
            embed = EmbeddingRequest.from_body(body)
        except InvalidEmbeddingRequest as exc:
            return _error(400, str(exc), "invalid_request_error")
        self.embedding_requests.append(embed)
        fault = self.embedding_faults(embed) if self.embedding_faults is not None else None
        if fault is not None:
            if fault.raw_body is not None:
                return Response(fault.raw_body, status_code=fault.status, media_type="application/json")
            if fault.error_body is not None:
                return JSONResponse(fault.error_body, status_code=fault.status)
            if fault.status >= 400:
                return _error(fault.status, f"scripted HTTP {fault.status}", "server_error")
        dim = embed.dimensions or self.embedding_dim
        data = []
        for index, text in enumerate(embed.input):
            vector = embed_text(text, dim)
            encoded: list[float] | str = vector
            if embed.encoding_format == "base64":
                encoded = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(_tokens(text)) for text in embed.input)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": embed.model, "usage": usage})


def _prefix(text: str, tokens: int) -> str:
    """The text up to the end of its first `tokens` regex tokens."""
    if tokens <= 0:
        return ""
    end = 0
    for end_match in itertools.islice(_TOKEN.finditer(text), tokens):
        end = end_match.end()
    return text[:end]


def _usage(
    prompt: int,
    cached: int,
    reply: Reply,
    calls: list[dict[str, Any]],
    tokenizer: Callable[[str], int] | None = None,
) -> dict[str, Any]:
    count = tokenizer or (lambda text: len(_tokens(text)))
    reasoning = count(reply.reasoning or "")
    completion = reasoning + count(reply.content or "")
    completion += sum(count(call["function"]["arguments"]) for call in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


async def _json_or_none(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None
