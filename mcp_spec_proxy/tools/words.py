"""The words of tool search: how a tool and a request become terms, and how terms score.

`toolsearch.ToolIndex` ranks by words with these pieces; each was kept because it ranked the
right tool higher on the dev split of `bench/retrieval.py`, at 1,000 and 5,000 tools alike or at
one and no worse at the other (docs/BENCHMARKS.md, "Tool search at catalog scale", lists what
each adds and what was tried and left out):

* `words` — identifiers split at `_`, `-`, `.` and camelCase, lower case, plurals and `-ing`
  folded, common English words dropped. A fuller stemmer (`-ed`, a final `-e`) was measured and
  ranked worse: `staged` and a pipeline `stage` became one word.
* `Bm25F` — BM25 over a tool's fields, each normalised by its own length, so a real tool's long
  description does not drown the words of its name the way one bag of words does; argument
  names and descriptions count half (`FIELD_WEIGHTS`), since an argument says what a tool takes,
  not what it does. A word counts at most `TF_CAP` times in a field, so a description stuffed
  with common words does not rank first for everything (tests/test_search_attacks.py); without
  the cap the dev split ranked two requests better at 1,000 tools and one worse at 5,000.
* `expand` — each word of the request brings the other words of its group in `SYNONYMS` at
  `SYNONYM_WEIGHT`: the common verbs and nouns of tool APIs (the CRUD verbs and their usual
  names, folder/directory), general API vocabulary kept small on purpose. A literal word still
  outranks its synonym.
* `cue` — whether the request asks to look (a question; `list`, `show`, …) or to change
  (`delete`, `create`, `rename`, …); a tool of the other effect keeps `OFF_CUE` of its score: a
  nudge, never a filter.

`Bm25` is plain Okapi BM25 over one bag of terms (the benchmark's mcpproxy-go-style baseline).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from mcp_spec_proxy.trajectory import Effect

if TYPE_CHECKING:  # numpy loads with the first index (search mode), not with the words a prompt needs
    import numpy as np

# Tuned on bench/retrieval.py: tool texts differ in length far more than the words that matter,
# so length counts for less than in prose search (k1 0.6-1.5 and b 0.2-0.75 tried).
BM25_K1 = 0.9
BM25_B = 0.5
"""For the one-bag `Bm25`."""
BM25F_B = 0.3
"""Each field's length normalisation in `Bm25F`."""
FIELD_WEIGHTS: Mapping[str, float] = {"name": 1.0, "description": 1.0, "server": 1.0, "arguments": 0.5}
"""A tool's fields and how much a word found in each counts (its name's field holds its title)."""
TF_CAP = 2
"""The most times a word counts in one field: a description that repeats every common word
forty times matches no better than one that says each twice."""
SYNONYM_WEIGHT = 0.7
"""What a synonym of a request's word counts, against 1 for the word itself."""
OFF_CUE = 0.8
"""The share of its score a tool keeps when its effect is not the one the request's verb asks for."""

SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("create", "make", "add", "new", "insert"),
    ("get", "fetch", "read", "retrieve", "load", "open"),
    ("show", "display", "view", "print"),
    ("list", "enumerate"),
    ("update", "edit", "modify", "change", "set"),
    ("delete", "remove", "erase", "drop", "destroy"),
    ("find", "search", "locate", "lookup", "query"),
    ("move", "rename", "relocate"),
    ("write", "save", "store", "put"),
    ("run", "execute", "exec", "invoke"),
    ("copy", "duplicate", "clone"),
    ("send", "post", "submit"),
    ("folder", "directory", "dir"),
)
"""Groups of words that tool APIs use for one thing: the CRUD verbs and their kin, and a folder."""
QUESTIONS = frozenset(
    ["what", "which", "who", "whom", "whose", "where", "when", "how", "is", "are", "does", "do", "did"]
)
"""A request that opens with one of these asks to look."""
READ_CUES = frozenset(
    ["show", "list", "get", "find", "look", "read", "display", "search", "view", "see", "check", "fetch", "count"]
)
WRITE_CUES = frozenset(
    [
        "delete",
        "remove",
        "create",
        "make",
        "add",
        "write",
        "save",
        "update",
        "edit",
        "change",
        "modify",
        "move",
        "rename",
        "insert",
        "set",
        "put",
        "drop",
        "append",
        "erase",
        "store",
        "toggle",
        "turn",
        "enable",
        "disable",
        "reset",
        "send",
        "switch",
    ]
)
"""Otherwise the request's first word in one of these says whether it asks to look or to change."""

_TOKEN = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "get",
        "give",
        "has",
        "have",
        "how",
        "i",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "please",
        "tell",
        "that",
        "the",
        "their",
        "them",
        "then",
        "there",
        "these",
        "this",
        "to",
        "up",
        "us",
        "was",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "will",
        "with",
        "you",
        "your",
    ]
)
# `get` is a stop word in requests ("get me the log") but it is also the head of many tool names;
# a name keeps all its words (`keep_stop`), so `get_current_time` still matches "current time".
# `show` is not one: it has synonyms (display, view), and "Shows the commit logs" means it.


def fold(word: str) -> str:
    """A word's indexed form: lower case, plural and `-ing` folded (`files` → `file`, `listing` → `list`)."""
    w = word.lower()
    if len(w) > 5 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith(("sses", "ches", "shes", "xes")):
        return w[:-2]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def words(text: str, *, keep_stop: bool = False) -> list[str]:
    """The folded words of `text`: identifiers split at `_`, `-`, `.` and camelCase; stop words
    dropped unless `keep_stop`."""
    out = [fold(token) for token in _TOKEN.findall(text)]
    return out if keep_stop else [w for w in out if w not in _STOP]


_GROUPS: dict[str, frozenset[str]] = {
    fold(word): frozenset(fold(other) for other in group) for group in SYNONYMS for word in group
}


def expand(terms: Iterable[str]) -> dict[str, float]:
    """A request's terms, weight 1, and their synonyms, weight `SYNONYM_WEIGHT`."""
    query = dict.fromkeys(terms, 1.0)
    for term in list(query):
        for other in _GROUPS.get(term, ()):
            query.setdefault(other, SYNONYM_WEIGHT)
    return query


def cue(text: str) -> Effect | None:
    """`read` for a question; otherwise `read` or `write` by the first word that is a cue for
    either (`READ_CUES`, `WRITE_CUES`); None without one."""
    tokens = [token.lower() for token in _TOKEN.findall(text)]
    if tokens and tokens[0] in QUESTIONS:
        return "read"
    for word in tokens:
        if word in READ_CUES:
            return "read"
        if word in WRITE_CUES:
            return "write"
    return None


def _idf(n: int, df: int) -> float:
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


class Bm25:
    """Okapi BM25 over documents of terms; `scores(query)` gives one score per document."""

    def __init__(self, documents: Sequence[Sequence[str]], k1: float = BM25_K1, b: float = BM25_B) -> None:
        import numpy as np

        self._n = len(documents)
        lengths = np.array([len(d) for d in documents], dtype=np.float64)
        average = float(lengths.mean()) if self._n else 0.0
        self._postings: dict[str, list[tuple[int, int]]] = {}
        for index, terms in enumerate(documents):
            for term, count in Counter(terms).items():
                self._postings.setdefault(term, []).append((index, count))
        # Per document, the length part of BM25's denominator, computed once.
        self._norm = k1 * (1 - b + b * lengths / average) if average else np.full(self._n, k1)
        self._k1 = k1

    def scores(self, query: Iterable[str]) -> np.ndarray:
        import numpy as np

        out = np.zeros(self._n, dtype=np.float64)
        for term in set(query):
            postings = self._postings.get(term)
            if not postings:
                continue
            idf = _idf(self._n, len(postings))
            rows = np.fromiter((row for row, _ in postings), dtype=np.int64, count=len(postings))
            tf = np.fromiter((count for _, count in postings), dtype=np.float64, count=len(postings))
            out[rows] += idf * tf * (self._k1 + 1) / (tf + self._norm[rows])
        return out


class Bm25F:
    """BM25F over documents of fields (`FIELD_WEIGHTS`' names → terms): a term's frequency is the
    sum over fields of weight * min(count, TF_CAP) / (1 - b + b * field length / its mean),
    saturated once by k1; `scores(query)` takes terms with weights (`expand`) and gives one score per document."""

    def __init__(
        self,
        documents: Sequence[Mapping[str, Sequence[str]]],
        weights: Mapping[str, float] = FIELD_WEIGHTS,
        k1: float = BM25_K1,
        b: float = BM25F_B,
    ) -> None:
        self._n, self._k1 = len(documents), k1
        import numpy as np

        postings: dict[str, dict[int, float]] = {}
        for field, weight in weights.items():
            lengths = np.array([len(d.get(field, ())) for d in documents], dtype=np.float64)
            average = float(lengths.mean()) if self._n else 0.0
            norm = 1 - b + b * lengths / average if average else np.ones(self._n)
            for index, document in enumerate(documents):
                for term, count in Counter(document.get(field, ())).items():
                    row = postings.setdefault(term, {})
                    row[index] = row.get(index, 0.0) + weight * min(count, TF_CAP) / norm[index]
        self._postings = {
            term: (np.fromiter(row, dtype=np.int64, count=len(row)), np.fromiter(row.values(), dtype=np.float64))
            for term, row in postings.items()
        }

    def scores(self, query: Mapping[str, float]) -> np.ndarray:
        import numpy as np

        out = np.zeros(self._n, dtype=np.float64)
        for term, weight in query.items():
            posting = self._postings.get(term)
            if posting is None:
                continue
            rows, tf = posting
            out[rows] += weight * _idf(self._n, len(rows)) * tf * (self._k1 + 1) / (tf + self._k1)
        return out
