"""The operator's `rules:` in servers.yaml: CEL expressions that decide, per call, which reviewer
it meets (or that it is refused, or that a read is a write). The approval console's per-session
"allow calls like this" rules are another thing: `review/rules.py`.

Each rule's `when` is CEL (the CEL C++ runtime, `cel-expr-python`), compiled and type-checked
when the config loads: a syntax or type error is a config error at the rule's line. At run time
each call is one evaluation over these variables, and nothing else:

    tool        the tool's public name (`fs__write_file`)
    server      its server's name
    args        the arguments its backend gets (`intent` already stripped), as JSON values
    annotations the tool's annotations as its backend listed them (`readOnlyHint`, ...)
    principal   `sub`, `client_id`, `scopes`, `groups` — empty text and lists when nobody is identified
    session     the client session's id

The first rule whose `when` is true decides; with none, the tool's own reviewer does, as without
rules. A rule's `effect: write` may make a read a write (it then meets the write barrier), and a
`deny:` makes any call a write that its rule refuses; nothing makes a write a read.

A read is checked against the rules up to the last that could make it a write (`effect: write`,
`deny:`) and no further: a later rule only chooses a reviewer, and a read meets none, so it is not
evaluated, and a read's audit line names a rule only where one of those decided it. With no such
rule a read evaluates nothing (the read path pays for `rules:` only where they can act on it).

A rule that cannot be evaluated for a call (a key the call lacks, a value of the wrong type, a
number CEL cannot hold, text that is not Unicode) fails closed, and so does every call whose
arguments hold NaN or an infinity (every comparison with NaN is false: `args.amount > 100` would
quietly not match) or text with a NUL character (the CEL runtime reads text up to its first NUL:
`args.path == "/srv/a"` would match `/srv/a` + NUL + `/../etc`). Failing closed means the
strictest outcome among the rules that could have matched: the failed rules, the first later rule
that matches, and — when none does — the tool's own reviewer. Strictest is `deny`, then a person
(`human`, `console`), `strong`, `strong_then_human`, `leash`, `allow`; any of them making the call
a write makes it one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp_spec_proxy.config.schema import ReviewMode
from mcp_spec_proxy.principal import Principal

if TYPE_CHECKING:
    from mcp_spec_proxy.config.schema import RuleConfig
    from mcp_spec_proxy.tools.catalog import CatalogTool


RULE_VARIABLES: tuple[str, ...] = ("tool", "server", "args", "annotations", "principal", "session")
"""What a rule of `rules:` reads (the module docstring says what each holds)."""
RULE_EXAMPLE = 'server == "bank" && args.amount > 100'

_TEXTS = frozenset({"tool", "server", "session"})  # the others are maps of JSON values
MAX_ANNOTATIONS = 65536
"""Tools whose annotations (as rules see them) are kept at once; past it they are made again."""
MAX_PRINCIPALS = 4096
"""Principals whose variables are kept at once; past it they are made again."""


@functools.cache
def _cel(variables: tuple[str, ...] = RULE_VARIABLES) -> tuple[Any, Any]:
    """The CEL module and the environment a rule over `variables` compiles in: loaded with the
    first rule, so a proxy without `rules:` (or `access:`, `calls/access.py`) never loads the CEL runtime."""
    from cel_expr_python import cel

    t = cel.Type
    declared = {name: t.STRING if name in _TEXTS else t.Map(t.STRING, t.DYN) for name in variables}
    return cel, cel.NewEnv(variables=declared)


STRICTNESS: tuple[ReviewMode, ...] = ("allow", "leash", "strong_then_human", "strong", "console", "human", "deny")
"""Review modes from the most lenient to the strictest: a rule that fails picks the last it could."""


class RuleError(ValueError):
    """A rule's `when` that does not compile: one line, where in the expression and what to change."""


def compile_rule(when: str, variables: tuple[str, ...] = RULE_VARIABLES, example: str = RULE_EXAMPLE) -> Any:
    """`when` compiled and type-checked over `variables` (a `cel.Expression`), or `RuleError`
    saying what is wrong; `example` is the condition its message offers."""
    cel, env = _cel(variables)
    try:
        expression = env.compile(when)
    except RuntimeError as exc:
        raise RuleError(_one_line(str(exc), variables, example)) from None
    returns = expression.return_type()
    if returns != cel.Type.BOOL and returns != cel.Type.DYN:
        what = f"`when` gives a {returns.name().lower()}, not true or false"
        raise RuleError(f"{what} — write a condition, e.g. {example}")
    return expression


def activation(data: Mapping[str, Any], variables: tuple[str, ...] = RULE_VARIABLES) -> Any:
    """One evaluation's values (a `cel.Activation`): CEL converts a value when a rule first reads it."""
    return _cel(variables)[1].Activation(data=dict(data))


def _one_line(message: str, variables: tuple[str, ...], example: str) -> str:
    """The CEL checker's first error as one line: `column N: what` — the fix."""
    text = message.removeprefix("INVALID_ARGUMENT: ").splitlines()[0]
    text = text.removeprefix("ERROR: <input>:")
    line, _, rest = text.partition(":")
    column, _, what = rest.partition(":")
    if line.isdigit() and column.isdigit():
        text = f"column {column}: {what.strip()}" if line == "1" else f"line {line}, column {column}: {what.strip()}"
    names = ", ".join(variables[:-1]) + f" and {variables[-1]}"
    hint = f"the variables are {names}" if "undeclared reference" in text else f"write CEL, e.g. {example}"
    return f"`when` is not valid CEL: {text} — {hint}"


@dataclass(frozen=True)
class Decision:
    """What the rules decided for one call.

    `rule` names the rule that decided (its `name:`, else its number from 1), None when none
    matched; `review` the reviewer it chose (None: the tool's own); `deny` its refusal; `write`
    whether the call is a write by a rule; `failed` why the rules failed closed, if they did."""

    rule: int | str | None = None
    review: ReviewMode | None = None
    deny: str | None = None
    write: bool = False
    failed: str | None = None

    def audit(self) -> dict[str, Any]:
        """The fields the call's audit lines carry: the rule that decided it, and why it failed closed."""
        fields: dict[str, Any] = {} if self.rule is None else {"rule": self.rule}
        if self.failed is not None:
            fields["rule_failed"] = self.failed
        return fields


NO_RULE = Decision()


@dataclass(frozen=True)
class _Rule:
    label: int | str
    expression: Any  # cel.Expression
    review: ReviewMode | None
    deny: str | None
    write: bool


class Rules:
    """The config's `rules:`, compiled once; `decide` evaluates them for one call."""

    def __init__(self, rules: Sequence[RuleConfig], default: ReviewMode) -> None:
        self._default = default
        self._rules = tuple(
            _Rule(
                rule.name or number,
                compile_rule(rule.when),
                rule.review,
                rule.deny,
                rule.effect == "write" or rule.deny is not None,
            )
            for number, rule in enumerate(rules, 1)
        )
        # Whether some rule may make a read a write (`effect: write`, `deny:`): then no read is
        # known to be one before its arguments are read.
        self.make_writes = any(rule.write for rule in self._rules)
        # A read is evaluated against the rules before this index only: none after it can make it a write.
        self._read_stop = max((n + 1 for n, rule in enumerate(self._rules) if rule.write), default=0)
        self._annotations: dict[int, tuple[Any, dict[str, Any]]] = {}  # by definition: each tool's, made once
        self._principals: dict[Principal, dict[str, Any]] = {}  # each principal's variables, made once

    def __bool__(self) -> bool:
        return bool(self._rules)

    def decide(
        self, tool: CatalogTool, arguments: Mapping[str, Any], principal: object | None, session: str
    ) -> Decision:
        """The first rule that matches this call decides; see the module docstring for failures."""
        stop = self._read_stop if tool.effect == "read" else len(self._rules)
        if not stop:
            return NO_RULE  # no rule can act on this call (a read, and no rule makes a write)
        variables = {
            "tool": tool.name,
            "server": tool.server,
            "session": session,
            "args": dict(arguments),
            "annotations": self._annotations_of(tool),
            "principal": self._principal_of(principal),
        }
        why = _unfaithful(arguments) or _unfaithful(session)
        if why is not None:
            return self._closed(tool, list(self._rules), None, why)
        # One activation for every rule: CEL converts a value when a rule first reads it, once per call.
        values = activation(variables)
        failed: list[_Rule] = []
        first_error = ""
        for number, rule in enumerate(self._rules):
            if number == stop and not failed:
                break  # a read, past the last rule that could make it a write: it stays a read
            matched, error = evaluate(rule.expression, values)
            if error is not None:
                failed.append(rule)
                first_error = first_error or f"rule {rule.label}: {error}"
            elif matched and not failed:
                return Decision(rule.label, rule.review, _denied(rule), rule.write)
            elif matched:
                return self._closed(tool, failed, rule, first_error)
        if failed:
            return self._closed(tool, failed, None, first_error)
        return NO_RULE

    def _annotations_of(self, tool: CatalogTool) -> dict[str, Any]:
        """The tool's annotations as rules see them, made once per definition (a listing's new
        definition is a new object, made again)."""
        kept = self._annotations.get(id(tool.definition))
        if kept is not None and kept[0] is tool.definition:
            return kept[1]
        if len(self._annotations) >= MAX_ANNOTATIONS:
            self._annotations.clear()
        made = _annotations(tool)
        self._annotations[id(tool.definition)] = (tool.definition, made)
        return made

    def _principal_of(self, principal: object | None) -> dict[str, Any]:
        """`principal_variables`, made once per `Principal` (a value: the same principal, the same variables)."""
        if not isinstance(principal, Principal):
            return principal_variables(principal)
        made = self._principals.get(principal)
        if made is None:
            if len(self._principals) >= MAX_PRINCIPALS:
                self._principals.clear()
            made = self._principals[principal] = principal_variables(principal)
        return made

    def _closed(self, tool: CatalogTool, could: list[_Rule], matched: _Rule | None, why: str) -> Decision:
        """The strictest outcome among rules that could have decided (and the tool's own reviewer
        when no later rule matched)."""
        candidates = [*could, *([matched] if matched is not None else [])]
        write = any(rule.write for rule in candidates)
        label = could[0].label
        denying = next((rule for rule in candidates if rule.deny is not None), None)
        if denying is not None:
            return Decision(label, None, f"{why}; failing closed, {_denied(denying)}", True, why)
        modes = [rule.review or tool.review or self._default for rule in candidates]
        if matched is None:
            modes.append(tool.review or self._default)
        review = max(modes, key=STRICTNESS.index)
        return Decision(label, review, None, write, why)


def _denied(rule: _Rule) -> str | None:
    return None if rule.deny is None else f"denied by rule {rule.label}: {rule.deny}"


def evaluate(expression: Any, values: Any) -> tuple[bool, str | None]:
    """Whether the rule matched, or why it could not say (a CEL error value, or data CEL refused)."""
    try:
        value = expression.eval(values)
    except (RuntimeError, ValueError, TypeError) as exc:  # data CEL cannot take (a lone surrogate, ...)
        return False, f"its arguments cannot be evaluated ({type(exc).__name__}: {str(exc)[:200]})"
    result = value.value()
    if isinstance(result, bool):  # the common case first: a true or false needs no look at its type
        return result, None
    if value.type() == _cel()[0].Type.ERROR:
        return False, str(result)[:300]
    if not isinstance(result, bool):
        return False, f"`when` gave {str(result)[:100]!r}, not true or false"
    return result, None


def _unfaithful(value: Any) -> str | None:
    """Why no rule compares `value` faithfully (NaN or an infinity, text or a key with a NUL), or None:
    walked with a stack, so depth costs no recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return "its arguments hold NaN or an infinity, which no rule compares faithfully"
        if isinstance(item, str) and "\x00" in item:
            return "its arguments hold text with a NUL character, which the rules' CEL runtime cuts short"
        if isinstance(item, Mapping):
            pending.extend(item.values())
            pending.extend(item.keys())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


def _annotations(tool: CatalogTool) -> dict[str, Any]:
    annotations = tool.definition.annotations
    return {} if annotations is None else annotations.model_dump(mode="json", by_alias=True, exclude_none=True)


def principal_variables(principal: object | None) -> dict[str, Any]:
    """`principal` as rules see it: a mapping or an object with `sub`, `client_id`, `scopes`,
    `groups`; whatever is absent is empty text or an empty list."""

    mapping = principal if isinstance(principal, Mapping) else None  # one look at its kind, not one per field

    def field(name: str) -> Any:
        return mapping.get(name) if mapping is not None else getattr(principal, name, None)

    def text(name: str) -> str:
        value = field(name)
        return value if isinstance(value, str) else ""

    def texts(name: str) -> list[str]:
        value = field(name)
        if isinstance(value, str):
            return value.split()  # OAuth's `scope` is one space-separated string
        if not isinstance(value, list | tuple | set | frozenset):
            return []
        return [item for item in value if isinstance(item, str)]

    return {"sub": text("sub"), "client_id": text("client_id"), "scopes": texts("scopes"), "groups": texts("groups")}


__all__ = [
    "NO_RULE",
    "RULE_VARIABLES",
    "STRICTNESS",
    "Decision",
    "RuleError",
    "Rules",
    "activation",
    "compile_rule",
    "evaluate",
    "principal_variables",
]
