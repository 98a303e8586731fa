"""BERT's uncased WordPiece tokenizer, read from a model's `tokenizer.json`, in plain Python.

What `BertTokenizer` (and the `tokenizers` package's `BertNormalizer`, `BertPreTokenizer` and
`WordPiece`) do for an uncased model: drop control characters and turn whitespace into spaces, put
spaces around CJK ideographs, lower-case, strip accents, split at whitespace and punctuation, then
split each word greedily into the longest pieces of the vocabulary (`##` before a piece that
continues a word; a word that cannot be split is `[UNK]`). `[CLS]` and `[SEP]` enclose the ids.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

MAX_WORD_CHARS = 100
"""A longer word is `[UNK]` whole, as in BERT."""


def _is_cjk(code: int) -> bool:
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0x20000 <= code <= 0x2A6DF
        or 0x2A700 <= code <= 0x2B73F
        or 0x2B740 <= code <= 0x2B81F
        or 0x2B820 <= code <= 0x2CEAF
        or 0xF900 <= code <= 0xFAFF
        or 0x2F800 <= code <= 0x2FA1F
    )


def _is_punctuation(char: str) -> bool:
    code = ord(char)
    if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96 or 123 <= code <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _normalised(text: str) -> str:
    out = []
    for char in text:
        code = ord(char)
        if code == 0 or code == 0xFFFD:
            continue
        if char in " \t\n\r" or unicodedata.category(char) == "Zs":
            out.append(" ")
        elif unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs"):  # control, format, private use, surrogate
            continue
        elif _is_cjk(code):
            out.append(f" {char} ")
        else:
            out.append(char)
    lowered = "".join(char.lower() for char in "".join(out))  # one character at a time: no final sigma
    folded = unicodedata.normalize("NFD", lowered)
    return "".join(char for char in folded if unicodedata.category(char) != "Mn")


def _words(text: str) -> list[str]:
    words: list[str] = []
    for chunk in _normalised(text).split():
        current = ""
        for char in chunk:
            if _is_punctuation(char):
                if current:
                    words.append(current)
                words.append(char)
                current = ""
            else:
                current += char
        if current:
            words.append(current)
    return words


class WordPiece:
    """Token ids of texts under one vocabulary (uncased BERT)."""

    def __init__(self, vocab: dict[str, int], max_tokens: int) -> None:
        self.vocab = vocab
        self.max_tokens = max_tokens
        self.unknown, self.first, self.last = vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"]

    @classmethod
    def load(cls, path: Path, max_tokens: int) -> WordPiece:
        """The vocabulary of a `tokenizer.json` whose model is WordPiece."""
        model = json.loads(path.read_text())["model"]
        if model.get("type") != "WordPiece":
            raise ValueError(f"{path.name}: a {model.get('type')} tokenizer, not WordPiece")
        return cls(model["vocab"], max_tokens)

    def ids(self, text: str) -> list[int]:
        """`[CLS]`, the text's pieces, `[SEP]`: at most `max_tokens` ids in all."""
        room = self.max_tokens - 2
        pieces: list[int] = []
        for word in _words(text):
            pieces += self._pieces(word)
            if len(pieces) >= room:
                break
        return [self.first, *pieces[:room], self.last]

    def _pieces(self, word: str) -> list[int]:
        if len(word) > MAX_WORD_CHARS:
            return [self.unknown]
        found, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    found.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unknown]
            start = end
        return found
