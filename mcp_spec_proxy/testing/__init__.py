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
`hidden_size` the field is ignored, as servers without hidden states do. With `per_call_states`
it answers the state at each call's last token instead (one vector per call, `embed_text` of the
actions up to that call), as a server that can tell a turn's calls apart would.

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
  `server.PREFIX_CACHE_PROMPTS` prompts sent to the same model, rounded down to whole blocks of
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
  503), stops uvicorn, and waits at most `server.SHUTDOWN_TIMEOUT_S` before cancelling it.

Beware when pointing `openai.AsyncOpenAI` at it: the client retries 408/409/429/5xx and timeouts
(`max_retries=2` by default), so a scripted error consumes as many replies as attempts are made;
tests that script errors should pass `max_retries=0`.
"""

from mcp_spec_proxy.testing.errors import (
    InvalidChatRequest,
    InvalidEmbeddingRequest,
    ScriptedModelError,
    ScriptExhausted,
)
from mcp_spec_proxy.testing.replies import EmbeddingFaults, Policy, Reply, Respond, Scripted, ToolCall
from mcp_spec_proxy.testing.requests import ChatRequest, EmbeddingRequest, ReceivedRequest
from mcp_spec_proxy.testing.server import (
    CHAT_PATH,
    EMBEDDINGS_PATH,
    MODELS_PATH,
    PREFIX_CACHE_PROMPTS,
    SHUTDOWN_TIMEOUT_S,
    ScriptedModelServer,
)
from mcp_spec_proxy.testing.tokens import embed_text

__all__ = [
    "CHAT_PATH",
    "EMBEDDINGS_PATH",
    "MODELS_PATH",
    "PREFIX_CACHE_PROMPTS",
    "SHUTDOWN_TIMEOUT_S",
    "ChatRequest",
    "EmbeddingFaults",
    "EmbeddingRequest",
    "InvalidChatRequest",
    "InvalidEmbeddingRequest",
    "Policy",
    "ReceivedRequest",
    "Reply",
    "Respond",
    "ScriptExhausted",
    "Scripted",
    "ScriptedModelError",
    "ScriptedModelServer",
    "ToolCall",
    "embed_text",
]
