"""`ScriptedModelServer`: the scripted model's HTTP server (Starlette on uvicorn, 127.0.0.1, port 0).

It records every request, asks its `Policy` for a reply, and answers in the OpenAI wire format;
`_chat` is the one place where a request's failures become HTTP errors. The package docstring
(`mcp_spec_proxy.testing`) states what it promises.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import socket
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mcp_spec_proxy.testing.completion import Completion, error_response
from mcp_spec_proxy.testing.errors import InvalidChatRequest, InvalidEmbeddingRequest, ScriptExhausted
from mcp_spec_proxy.testing.replies import EmbeddingFaults, Policy
from mcp_spec_proxy.testing.requests import ChatRequest, EmbeddingRequest, ReceivedRequest
from mcp_spec_proxy.testing.tokens import (
    PrefixCache,
    completion_usage,
    embed_text,
    render_prompt,
    text_prefix,
    tokenize,
)
from mcp_spec_proxy.wire_types import ToolCall

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 5.0
PREFIX_CACHE_PROMPTS = 256
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
EMBEDDINGS_PATH = "/v1/embeddings"


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
        per_call_states: bool = False,
    ):
        if cache_block < 1:
            raise ValueError(f"cache_block must be at least 1 token, got {cache_block}")
        if embedding_dim < 1:
            raise ValueError(f"embedding_dim must be at least 1, got {embedding_dim}")
        if hidden_size is not None and hidden_size < 1:
            raise ValueError(f"hidden_size must be at least 1, got {hidden_size}")
        self.hidden_size = hidden_size
        self.per_call_states = per_call_states
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
        self._cache = PrefixCache(PREFIX_CACHE_PROMPTS)
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
        return error_response(
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
            return error_response(
                400, f"request body is not valid JSON ({exc}) — send a JSON object", "invalid_request_error"
            )
        self.requests.append(ReceivedRequest(request.method, request.url.path, body))
        try:
            chat = ChatRequest.from_body(body)
        except InvalidChatRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        self.chat_requests.append(chat)
        # Tokenized on the loop, not in a thread: prompts here are small, and cache order must follow arrival order.
        prompt_text = render_prompt(chat)
        prompt_tokens = tokenize(prompt_text)
        cached = self._cache.lookup_and_add(chat.model, prompt_tokens)
        prompt_count = len(prompt_tokens)
        if self.tokenizer is not None:
            prompt_count = self.tokenizer(prompt_text)
            cached = min(self.tokenizer(text_prefix(prompt_text, cached)), prompt_count)
        cached = cached // self.cache_block * self.cache_block

        policy = self._policy
        try:
            reply = await policy.reply(chat)
        except ScriptExhausted as exc:
            return error_response(500, str(exc), "server_error", "script_exhausted")
        except Exception as exc:
            # A policy is test code: its bug must reach the test as a readable 500, not a bare disconnect.
            logger.exception("policy %r failed", policy)
            return error_response(
                500, f"policy {policy!r} raised {type(exc).__name__}: {exc}", "server_error", "policy_error"
            )

        if reply.delay_s > 0:
            assert self._closing is not None  # the app only runs between __aenter__ and __aexit__
            with anyio.move_on_after(reply.delay_s):
                await self._closing.wait()
            if self._closing.is_set():
                return error_response(503, "scripted model server is shutting down", "server_error")

        if reply.raw_body is not None:
            media_type = "text/event-stream" if chat.stream else "application/json"
            return Response(reply.raw_body, status_code=reply.status, media_type=media_type)
        if reply.error_body is not None:
            return JSONResponse(reply.error_body, status_code=reply.status)
        if reply.status >= 400:
            return error_response(reply.status, f"scripted HTTP {reply.status}", "server_error")

        calls: list[ToolCall] = [
            {
                "id": call.id or f"call_{next(self._call_ids)}",
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
            }
            for call in reply.tool_calls
        ]
        completion = Completion(
            f"chatcmpl-scripted-{next(self._completion_ids)}",
            chat,
            reply,
            calls,
            completion_usage(prompt_count, cached, reply, calls, self.tokenizer),
            self.hidden_size,
            self.per_call_states,
        )
        if chat.stream:
            return StreamingResponse(completion.chunks(), status_code=reply.status, media_type="text/event-stream")
        return JSONResponse(completion.body(), status_code=reply.status)

    async def _embeddings(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            self.requests.append(ReceivedRequest(request.method, request.url.path, None))
            return error_response(
                400, f"request body is not valid JSON ({exc}) — send a JSON object", "invalid_request_error"
            )
        self.requests.append(ReceivedRequest(request.method, request.url.path, body))
        try:
            embed = EmbeddingRequest.from_body(body)
        except InvalidEmbeddingRequest as exc:
            return error_response(400, str(exc), "invalid_request_error")
        self.embedding_requests.append(embed)
        fault = self.embedding_faults(embed) if self.embedding_faults is not None else None
        if fault is not None:
            if fault.raw_body is not None:
                return Response(fault.raw_body, status_code=fault.status, media_type="application/json")
            if fault.error_body is not None:
                return JSONResponse(fault.error_body, status_code=fault.status)
            if fault.status >= 400:
                return error_response(fault.status, f"scripted HTTP {fault.status}", "server_error")
        dim = embed.dimensions or self.embedding_dim
        data = []
        for index, text in enumerate(embed.input):
            vector = embed_text(text, dim)
            encoded: list[float] | str = vector
            if embed.encoding_format == "base64":
                encoded = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(len(tokenize(text)) for text in embed.input)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse({"object": "list", "data": data, "model": embed.model, "usage": usage})


async def _json_or_none(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None
