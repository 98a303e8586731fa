"""What each principal may see: the config's `access:`.

Each rule's `when` is CEL over three variables, compiled and type-checked when the config loads
(by `calls/rules.py`, which compiles and evaluates every CEL expression of the config: one CEL, one
place), so a rule that does not compile is a config error at its line:

    principal   `sub`, `client_id`, `scopes`, `groups` — empty text and lists when nobody is identified
    server      the server's name; `mcp-spec-proxy` for the proxy's own tools (`config/identity.OWN_SERVER`)
    tool        the tool's public name (`bank__transfer`); empty text for the server's prompts and resources

The first rule whose `when` is true decides: `hide: true` hides, `hide: false` shows; with none,
everything is seen. A rule that cannot be evaluated (a key the principal lacks, a wrong type)
hides: access fails closed. So `server == "bank"` hides a server whole (its tools, its prompts, its
resources); a rule that names a `tool` hides that tool alone.

A hidden tool is unknown to that principal wherever the catalog answers: a front puts the view of
the principal a request comes from around the request (`viewing`), and the catalog answers its
tools, lookups, prompts and resources through it (`shown`), as it answers through the client's
era (`backends/era.py`). tools/list, tools/call (the same "unknown tool" as a tool that does not
exist; nothing runs), search mode's meta-tools, `delegate`'s tools, the tools a reviewer's prompt
lists and a replacement's lookup all see the same view. Where no client asks (the operator's
commands, the catalog's own bookkeeping of listings) every tool is seen.

The proxy's own tools (`delegate`, `report_outcome`, search mode's meta-tools) ask `shown` with the
server `mcp-spec-proxy` (`fronts/own_tools.py`, `fronts/catalog_search.py`): listed and run as
the catalog's tools are.

Without `auth:` no front identifies anyone: every client is the empty principal (empty `sub`,
no groups, no scopes), so a rule that hides what a group lacks hides it from every client.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcp_spec_proxy.calls.rules import activation, compile_rule, evaluate, principal_variables

if TYPE_CHECKING:
    from mcp_spec_proxy.config.identity import AccessRule
    from mcp_spec_proxy.principal import Principal

logger = logging.getLogger(__name__)

ACCESS_VARIABLES: tuple[str, ...] = ("principal", "server", "tool")
ACCESS_EXAMPLE = 'server == "bank" && !("finance" in principal.groups)'
MAX_VIEWS = 1024
"""Principals whose decisions are kept at once; the oldest is dropped (and decided again when it returns)."""
MAX_DECISIONS = 16384
"""Decisions one view keeps (one per server and tool name); past it they are decided again."""

VIEW: ContextVar[View | None] = ContextVar("mcp_spec_proxy_view", default=None)
"""The view of the principal the current request comes from; None where no client asks."""


def compile_access(when: str) -> Any:
    """An access rule's `when`, compiled over its three variables (`rules.RuleError` if it does not)."""
    return compile_rule(when, ACCESS_VARIABLES, ACCESS_EXAMPLE)


@dataclass(frozen=True)
class _Rule:
    label: int | str
    expression: Any  # cel.Expression
    hide: bool


class View:
    """What one principal sees: each server and tool decided once, when first asked."""

    def __init__(self, rules: tuple[_Rule, ...], principal: object | None) -> None:
        self._rules = rules
        self._principal = principal_variables(principal)  # a `Principal`, or `explain`'s mapping
        self._who = self._principal["sub"] or "(nobody identified)"
        self._decided: dict[tuple[str, str], bool] = {}

    def shows(self, server: str, tool: str = "") -> bool:
        """Whether this principal sees `tool` of `server` (`tool` empty: its prompts and resources)."""
        key = (server, tool)
        seen = self._decided.get(key)
        if seen is None:
            if len(self._decided) >= MAX_DECISIONS:
                self._decided.clear()
            seen = self._decided[key] = self._decide(server, tool)
        return seen

    def _decide(self, server: str, tool: str) -> bool:
        values = activation({"principal": self._principal, "server": server, "tool": tool}, ACCESS_VARIABLES)
        for rule in self._rules:
            matched, error = evaluate(rule.expression, values)
            if error is not None:
                what = f"tool {tool!r}" if tool else f"server {server!r}"
                logger.warning(
                    "access rule %s cannot be evaluated for %s and %s (%s); hidden", rule.label, self._who, what, error
                )
                return False
            if matched:
                return not rule.hide
        return True


class Access:
    """The config's `access:`, compiled once; `view` gives a principal's view."""

    def __init__(self, rules: Sequence[AccessRule]) -> None:
        self._rules = tuple(
            _Rule(rule.name or number, compile_access(rule.when), rule.hide) for number, rule in enumerate(rules, 1)
        )
        self._views: dict[Principal | None, View] = {}

    def __bool__(self) -> bool:
        return bool(self._rules)

    def sees(self, principal: object | None, server: str, tool: str = "") -> bool:
        """One question outside any request (`explain`): whether `principal` (a `Principal` or a
        mapping of its fields) sees `tool` of `server`."""
        return View(self._rules, principal).shows(server, tool)

    def view(self, principal: Principal | None) -> View | None:
        """`principal`'s view (None: no rules, everything is seen). Views are kept, a bounded number."""
        if not self._rules:
            return None
        view = self._views.pop(principal, None)
        if view is None:
            if len(self._views) >= MAX_VIEWS:
                del self._views[next(iter(self._views))]
            view = View(self._rules, principal)
        self._views[principal] = view  # last in: the most recently used
        return view


@contextmanager
def viewing(view: View | None) -> Iterator[None]:
    """Around one request of a client whose principal's view is `view`."""
    token = VIEW.set(view)
    try:
        yield
    finally:
        VIEW.reset(token)


def shown(server: str, tool: str = "") -> bool:
    """Whether the client asking now sees `tool` of `server` (everything, where no client asks)."""
    view = VIEW.get()
    return view is None or view.shows(server, tool)


__all__ = ["ACCESS_VARIABLES", "VIEW", "Access", "View", "compile_access", "shown", "viewing"]
