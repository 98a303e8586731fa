"""The approval console's session rules: what "allow calls like this" admits, and nothing more.

A `Rule` names, for each argument of the call the person approved, one of two things:

* **exactly this value** (`None` in `patterns`): the later call's value must equal the approved
  value as data — same JSON kind, same text, same numbers. It is never a glob built from how the
  value was displayed, so an invisible character in it stays that character, not a wildcard;
* **a pattern**, for a text value only (a number, list, object, boolean or null is allowed only
  exactly). `*` matches any run of characters within one segment of a path, `?` exactly one;
  neither matches `/` or `\\`, and a segment a wildcard is in is never empty (`*/*` is not
  `/etc`). There is no `**`: it is refused, so nobody takes it for "any depth". Every other
  character stands for itself (no `[...]` classes, no escapes).

Whatever its pattern says, a pattern admits no value that holds a control character (NUL, a line
break, a tab), a character that shows nothing or turns text around (`UNSEEN`: zero widths, bidi
overrides, lone surrogates), or a segment of only dots (`..`, `.`, `...`, with or without trailing
spaces), nor one whose percent-escapes or compatibility forms (`%2e%2e`, `%2f`, `%00`, a
full-width dot U+FF0E or solidus U+FF0F) turn into any of those or into a separator the pattern did not write;
nor text past `MAX_TEXT` characters. Such a call is asked about each time unless a rule holds its
value exactly. `visible` writes values and patterns as JSON text with every such character as an
escape (`\\u200b`): that is how a rule is shown on the page, in the audit and to the client.

A session rule lives as long as its session. `config_rule` writes it as a rule of servers.yaml's
`rules:` (CEL, `review: allow`) for the operator to keep: the same tool, the same argument keys,
each exact value compared as CEL data (a number by its value: 1 equals 1.0), and each pattern as
an anchored regular expression stricter than the pattern (a wildcard matches only ASCII letters,
digits, `_`, `-` and `.`, never first, never nothing; text no longer than `MAX_TEXT`), so the kept
rule admits no other call than the session rule does. A term it cannot write so (a pattern with
`%` or text past ASCII, a value CEL cannot hold) leaves the rule unwritten.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from mcp_spec_proxy.tools.catalog import canonical_json

_UNSEEN = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f"
    "\u2028-\u202e\u2060-\u206f\u3164\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e0fff"
)
UNSEEN = re.compile(f"[{_UNSEEN}]")
"""Characters that show nothing (or move other text) yet change what a value is: controls, bidi, zero widths."""
UNRULED = re.compile(f"[\t\n{_UNSEEN}\ud800-\udfff]")
"""What no pattern admits: `UNSEEN`, the line breaks and tabs a page shows as space, lone surrogates."""
SEPARATORS = re.compile(r"([/\\])")
MAX_TEXT = 4_096
"""The longest text a pattern admits (a path is shorter); longer values are allowed only exactly."""
MAX_PATTERN = 512
WILDCARDS = "*?"
DECODE_ROUNDS = 4  # `%252e` is `%2e` once decoded and `.` twice: decode until nothing changes, this often


@dataclass(frozen=True)
class Rule:
    """Calls of `tool` in `session` whose arguments have the same keys and each satisfies its term.

    `patterns[key]` is a pattern, or `None` for "exactly `exact[key]`". `fingerprint` is the tool's
    definition as the person saw it; the queue applies the rule to that definition only.
    """

    session: str
    tool: str
    fingerprint: str
    patterns: Mapping[str, str | None]
    exact: Mapping[str, Any] = field(default_factory=dict)

    def matches(self, session: str, tool: str, arguments: Mapping[str, Any]) -> bool:
        if session != self.session or tool != self.tool or set(arguments) != set(self.patterns):
            return False
        return all(self._admits(key, pattern, arguments[key]) for key, pattern in self.patterns.items())

    def _admits(self, key: str, pattern: str | None, value: Any) -> bool:
        if pattern is None:
            return same_value(value, self.exact.get(key, _MISSING))
        return isinstance(value, str) and admits(pattern, value)

    def describe(self) -> str:
        terms = [
            f"{visible(key)} is exactly {visible(self.exact[key])}"
            if pattern is None
            else f"{visible(key)} matches the pattern {visible(pattern)}"
            for key, pattern in self.patterns.items()
        ]
        return f"{self.tool} where {' and '.join(terms) or 'there are no arguments'} (session {visible(self.session)})"


_MISSING = object()


def same_value(value: Any, approved: Any) -> bool:
    """The same JSON value: kind and text (1 is not 1.0 nor true, key order aside)."""
    if approved is _MISSING or _kind(value) != _kind(approved):
        return False
    return canonical_json(value) == canonical_json(approved)


def admits(pattern: str, value: str) -> bool:
    """Whether `pattern` admits `value`, as the module docstring says."""
    if pattern_refusal(pattern) is not None or text_refusal(value) is not None:
        return False
    # The backend may read the value decoded or normalised: the pattern must hold for each form.
    return all(_matches(p, v) for p, v in zip(_forms(pattern), _forms(value), strict=True))


def pattern_refusal(pattern: str) -> str | None:
    """Why `pattern` is not a pattern (a line for the person), or None."""
    if len(pattern) > MAX_PATTERN:
        return f"a pattern is at most {MAX_PATTERN} characters"
    if "**" in pattern:
        return "there is no ** here: * matches within one segment of a path; write one * per segment (notes/*/*.md)"
    if UNRULED.search(pattern):
        return "a pattern cannot hold an invisible or control character; allow such a value exactly"
    if _dot_segment(pattern):
        return "a pattern cannot have a . or .. segment: no rule admits such a path; allow it exactly"
    return None


def text_refusal(value: str) -> str | None:
    """Why no pattern admits `value` (a line for the person), or None."""
    if len(value) > MAX_TEXT:
        return f"it is longer than {MAX_TEXT} characters"
    forms = _forms(value)
    if unquote(forms[1], errors="surrogateescape") != forms[1]:
        return f"its percent-escapes are nested more than {DECODE_ROUNDS} deep"
    for form in forms:
        if UNRULED.search(form):
            return (
                "it holds a line break, a control or invisible character (shown as a \\u escape),"
                " or a percent-escape that is not text"
            )
        if _dot_segment(form):
            return "it has a . or .. segment (or one hidden in percent-escapes or look-alike characters)"
    return None


def pattern_refusal_for(value: Any) -> str | None:
    """Why the person can allow `value` only exactly (a line for the page), or None."""
    if not isinstance(value, str):
        return f"it is a {_kind(value)}, not text: patterns apply to text"
    why = text_refusal(value)
    return None if why is None else f"{why}: patterns never admit such values"


def visible(value: Any) -> str:
    """`value` as JSON text, each character `UNRULED` names written as its `\\u` escape."""
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else canonical_json(value)
    return UNRULED.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if 0xD800 <= ord(char) <= 0xDFFF:  # a lone surrogate: one code unit, and no UTF-16 of its own
        return f"\\u{ord(char):04x}"
    data = char.encode("utf-16-be")  # one code unit, or a surrogate pair past U+FFFF
    return "".join(f"\\u{int.from_bytes(data[i : i + 2], 'big'):04x}" for i in range(0, len(data), 2))


def _forms(text: str) -> tuple[str, str, str]:
    """`text` as written, percent-decoded until it settles, and that in NFKC (a full-width dot is `.`).

    A percent-escape that is not UTF-8 (`%ff`, the overlong `%c0%ae` for `.`) decodes to a lone
    surrogate, which `UNRULED` names: no pattern admits it.
    """
    decoded = text
    for _ in range(DECODE_ROUNDS):
        again = unquote(decoded, errors="surrogateescape")
        if again == decoded:
            break
        decoded = again
    return text, decoded, unicodedata.normalize("NFKC", decoded)


def _dot_segment(text: str) -> bool:
    return any(part and not part.strip(". ") and "." in part for part in SEPARATORS.split(text)[::2])


def _matches(pattern: str, value: str) -> bool:
    """Segment by segment: the same separators in the same places, each segment matching its own."""
    wanted, given = SEPARATORS.split(pattern), SEPARATORS.split(value)
    if len(wanted) != len(given) or wanted[1::2] != given[1::2]:
        return False
    return all(_segment(p, v) for p, v in zip(wanted[::2], given[::2], strict=True))


def _segment(pattern: str, text: str) -> bool:
    """`*` and `?` within one segment, by the usual two-pointer walk (no regex, no backtracking blow-up)."""
    if not text and any(char in WILDCARDS for char in pattern):
        return False
    p = t = 0
    star, mark = -1, 0
    while t < len(text):
        if p < len(pattern) and pattern[p] == "*":
            star, mark = p, t
            p += 1
        elif p < len(pattern) and pattern[p] in ("?", text[t]):
            p += 1
            t += 1
        elif star >= 0:
            mark += 1
            p, t = star + 1, mark
        else:
            return False
    return pattern[p:].strip("*") == ""


_PLAIN = re.compile(r"[A-Za-z0-9_./\\ :@+=,~*?-]*")
"""What a pattern's own characters may be for `config_rule` (ASCII that needs no decoding)."""
_WILD = {"*": "[A-Za-z0-9_-][A-Za-z0-9_.-]*", "?": "[A-Za-z0-9_-]"}
_RE2_SPECIAL = frozenset(".+*?()|[]{}^$\\")


def config_rule(rule: Rule) -> str | None:
    """`rule` as a rule of servers.yaml's `rules:` (YAML text), or None where a term has no faithful CEL."""
    terms = [f"tool == {_cel_text(rule.tool)}", f"args.size() == {len(rule.patterns)}"]
    for key, pattern in rule.patterns.items():
        at = f"args[{_cel_text(key)}]"
        if pattern is None:
            literal = _cel_value(rule.exact.get(key))
            if literal is None:
                return None
            terms.append(f"{at} == {literal}")
        elif _PLAIN.fullmatch(pattern):
            regex = "".join(_WILD.get(char) or _regex_char(char) for char in pattern)
            terms.append(f"{at}.size() <= {MAX_TEXT} && {at}.matches({_cel_text('^' + regex + '$')})")
        else:
            return None
    import yaml  # the operator's file format; loaded only when a page shows a rule

    kept = {"name": f"console: {rule.tool}"[:80], "when": " && ".join(terms), "review": "allow"}
    return str(yaml.safe_dump({"rules": [kept]}, allow_unicode=False, sort_keys=False, width=1_000_000))


def _regex_char(char: str) -> str:
    """One character of a pattern as RE2 reads it literally."""
    return "[ ]" if char == " " else "\\" + char if char in _RE2_SPECIAL else char


def _cel_text(text: str) -> str:
    """A CEL string literal of `text`: printable ASCII as itself, every other character escaped."""
    out = []
    for char in text:
        point = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= point < 0x7F:
            out.append(char)
        else:
            out.append(f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}")
    return '"' + "".join(out) + '"'


def _cel_value(value: Any) -> str | None:
    """A CEL literal equal to JSON `value` as the rule's `args` hold it, or None (NaN, a lone surrogate)."""
    if isinstance(value, bool) or value is None:
        return "null" if value is None else str(value).lower()
    if isinstance(value, int):
        return str(value) if -(2**63) <= value < 2**63 else None  # CEL's int is 64 bits
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, str):
        return None if any(0xD800 <= ord(char) <= 0xDFFF for char in value) else _cel_text(value)
    if isinstance(value, list | tuple):
        items = [_cel_value(item) for item in value]
        return None if None in items else f"[{', '.join(item for item in items if item is not None)}]"
    if isinstance(value, dict):
        pairs = [(_cel_text(str(k)), _cel_value(v)) for k, v in value.items()]
        return None if any(v is None for _, v in pairs) else "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"
    return None


def _kind(value: Any) -> str:
    """A value's JSON kind: string, number, boolean, null, array or object."""
    if isinstance(value, bool) or value is None:
        return "boolean" if value is not None else "null"
    kinds = ((str, "string"), (int | float, "number"), (list | tuple, "array"), (dict, "object"))
    return next((name for cls, name in kinds if isinstance(value, cls)), type(value).__name__)


__all__ = [
    "UNSEEN",
    "Rule",
    "admits",
    "config_rule",
    "pattern_refusal",
    "pattern_refusal_for",
    "same_value",
    "text_refusal",
    "visible",
]
