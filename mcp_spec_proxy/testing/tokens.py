"""The scripted model server's arithmetic: approximate token counts, the simulated prefix cache,
usage, and deterministic embeddings.

Tokens are a deterministic regex (`\\w+|[^\\w\\s]`), not any real tokenizer's: good for comparing
prompts with each other, not for absolute numbers. `PrefixCache` reports the longest common token
prefix with recent prompts of the same model; `embed_text` gives equal vectors for equal texts and
similar ones for texts sharing words.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mcp_spec_proxy.testing.replies import Reply
from mcp_spec_proxy.testing.requests import ChatRequest
from mcp_spec_proxy.wire_types import ToolCall, Usage

_TOKEN = re.compile(r"\w+|[^\w\s]")
_WORDS = re.compile(r"\w+")


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


def tokenize(text: str) -> list[str]:
    """The approximate tokens of `text` (the regex above)."""
    return _TOKEN.findall(text)


def render_prompt(request: ChatRequest) -> str:
    """The prompt text that is counted and cached: the JSON of tools, then messages, then response_format."""
    parts: list[object] = [request.tools] if request.tools else []
    parts.append(request.messages)
    if request.response_format is not None:
        parts.append(request.response_format)
    return "".join(json.dumps(part, ensure_ascii=False, separators=(",", ":")) for part in parts)


class PrefixCache:
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


def text_prefix(text: str, tokens: int) -> str:
    """The text up to the end of its first `tokens` regex tokens."""
    if tokens <= 0:
        return ""
    end = 0
    for end_match in itertools.islice(_TOKEN.finditer(text), tokens):
        end = end_match.end()
    return text[:end]


def completion_usage(
    prompt: int,
    cached: int,
    reply: Reply,
    calls: Sequence[ToolCall],
    tokenizer: Callable[[str], int] | None = None,
) -> Usage:
    """The `usage` object of a completion, counted with `tokenizer` when given, else `tokenize`."""
    count = tokenizer or (lambda text: len(tokenize(text)))
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
