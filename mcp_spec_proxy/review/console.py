"""The approval console's reviewer: a held write waits until a person decides on the proxy's own page.

`ConsoleReviewer` (`review: console`, or `review.fallback: console` behind `human`) puts the held
call on a `ConsoleQueue` and waits. The console front (`fronts/console/`) shows the queue and
hands each decision back through `ConsoleQueue.decide`, which is the only way in:

* a decision names the pending item by its unguessable id *and* the digest of the arguments the
  person was shown; it is taken once (a second decision finds nothing), and refused after
  `review.timeout` (the gate stops waiting then as well);
* an edit carries new arguments, validated against the tool's schema before they count; the
  verdict carries them, and the gate forwards and audits them;
* "allow calls like this for this session" adds a `Rule` (`review/rules.py`, which says exactly
  what one admits) bound to that session and to the tool as the person saw it (its definition's
  fingerprint): each argument either exactly the value held, compared as a value, or a text
  pattern whose `*` stays inside one path segment and which never admits a `..` segment, a
  control or invisible character. Later calls it matches — the same keys, each satisfying its
  term — are accepted as `console-rule`, never calls of other sessions, nor calls of the tool
  once its backend has changed its definition, nor a call the strong model rejected
  (`strong_then_human`): the person sees those.

When no console is being served (`--no-console`, or a command that serves none) the reviewer
refuses the call with a line that says so: a held write is never forwarded for want of a page.
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import anyio

from mcp_spec_proxy.errors import InvalidArguments, ProxyError
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.review import ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.kinds import ReviewerKind
from mcp_spec_proxy.review.rules import Rule, pattern_refusal, pattern_refusal_for, visible
from mcp_spec_proxy.tools.arguments import check_arguments
from mcp_spec_proxy.tools.catalog import INTENT_ARGUMENT, CatalogTool, digest
from mcp_spec_proxy.trajectory import Step

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

Action = Literal["approve", "deny", "edit", "rule"]
MAX_PENDING = 256
MAX_RULES = 256
REASON_CHARS = 2_000


class ConsoleRefused(ProxyError):
    """A decision the queue will not take: unknown or spent item, other arguments, invalid edit."""


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""
    arguments: dict[str, Any] | None = None  # `edit`: what the backend gets instead
    patterns: dict[str, str | None] | None = None  # `rule`: per argument key a pattern, or None for its exact value
    rule: Rule | None = None  # `rule`, once taken: the rule it made (its verdict names this one)


@dataclass
class Pending:
    """One held write on the console, as the page shows it."""

    call: str
    session: str
    tool: CatalogTool
    arguments: dict[str, Any]
    intent: str | None
    reads: tuple[Step, ...]  # the session's steps that led to it
    context: str  # what a model reviewer said before it came here (strong_then_human)
    leash: dict[str, Any] | None  # LEASH's score and nearest neighbours, when LEASH is on
    expires: float  # time.monotonic()
    principal: Principal | None = None  # who asks, where the front authenticated them: the card names them
    held_at: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    digest: str = ""
    decided: anyio.Event = field(default_factory=anyio.Event)
    decision: Decision | None = None
    taken: anyio.Event = field(default_factory=anyio.Event)  # its call took the decision, or was stopped first
    abandoned: bool = False  # its call stopped waiting (the replica stopping, its client gone) before it took one

    def __post_init__(self) -> None:
        self.digest = digest(self.arguments)

    def seconds_left(self) -> float:
        return max(0.0, self.expires - time.monotonic())


class ConsoleQueue:
    """The held writes waiting on the console, and the session rules its decisions made."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # The console's address while the front serves it — without its key: this text reaches the
        # client (and so the agent's model), and an agent holding the key could approve its own writes.
        self.url: str | None = None
        # The command that prints the link (with the key) for the person: the front that serves
        # the console sets it to one that works from any folder (the command's path, the state dir).
        self.link_command = "mcp-spec-proxy console-url"
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._rules: list[Rule] = []
        # The remote backends waiting for a person's login: server -> its authorization URL (the
        # authorization server's page; it never holds the console's key). The page shows each as a card.
        self.logins: dict[str, str] = {}
        self._changed: anyio.Event | None = None  # made on first wait: the queue may be built outside a loop
        self.version = 0

    # -- what the page reads -------------------------------------------------------------------

    def pending(self) -> list[Pending]:
        self._expire()
        return list(self._pending.values())

    def get(self, item_id: str) -> Pending | None:
        self._expire()
        return self._pending.get(item_id)

    def rules(self) -> list[Rule]:
        return list(self._rules)

    async def changed_since(self, version: int) -> int:
        """Wait until the queue differs from `version`; the new version."""
        while self.version == version:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()
        return self.version

    # -- the reviewer's side -------------------------------------------------------------------

    def rule_for(self, session: str, tool: CatalogTool, arguments: dict[str, Any]) -> Rule | None:
        """The rule that covers this call: same session, same tool definition, matching arguments."""
        for rule in self._rules:
            if rule.fingerprint == tool.fingerprint and rule.matches(session, tool.name, arguments):
                return rule
        return None

    def hold(self, item: Pending) -> None:
        self._expire()
        if len(self._pending) >= MAX_PENDING:
            raise ConsoleRefused(f"the approval console already holds {MAX_PENDING} calls; refused")
        self._pending[item.id] = item
        self._bump()

    def release(self, item: Pending) -> None:
        if self._pending.pop(item.id, None) is not None:
            self._bump()

    # -- the page's side -----------------------------------------------------------------------

    def decide(self, item_id: str, shown_digest: str, decision: Decision) -> Pending:
        """Settle one pending call, once; `ConsoleRefused` says why a decision does not count."""
        item = self.get(item_id)
        if item is None or item.decision is not None:
            raise ConsoleRefused("this call is no longer waiting: it was decided already, expired or abandoned")
        if not secrets.compare_digest(shown_digest, item.digest):
            raise ConsoleRefused("the arguments shown are not the arguments held; reload the page")
        if decision.action == "edit":
            decision = dataclasses.replace(decision, arguments=self._checked(item, decision.arguments))
        elif decision.action == "rule":
            rule = _checked_rule(item, decision.patterns)
            if len(self._rules) >= MAX_RULES:
                raise ConsoleRefused(f"this console already has {MAX_RULES} rules; approve or deny one by one")
            self._rules.append(rule)
            decision = dataclasses.replace(decision, patterns=dict(rule.patterns), rule=rule)
        decision = dataclasses.replace(decision, reason=decision.reason.strip()[:REASON_CHARS])
        item.decision = decision
        self._pending.pop(item.id, None)
        item.decided.set()
        self._bump()
        return item

    def _checked(self, item: Pending, arguments: dict[str, Any] | None) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ConsoleRefused("edited arguments must be a JSON object")
        try:
            check_arguments({}, backend_view(item.tool), arguments)
        except InvalidArguments as exc:
            raise ConsoleRefused(f"the edit was not applied: {exc}") from None
        return arguments

    # -- the logins' side ----------------------------------------------------------------------

    def login(self, server: str, authorization_url: str | None) -> None:
        """A backend's login waits for the person at `authorization_url` (None: it no longer waits)."""
        if authorization_url is None:
            self.logins.pop(server, None)
        else:
            self.logins[server] = authorization_url
        self._bump()

    def login_note(self, server: str) -> str | None:
        """The one line a client's call to a tool of `server` gets while its login waits: where to go,
        the console's address, never its key (an agent holding it could approve its own writes)."""
        if server not in self.logins:
            return None
        if not self.url:
            return (
                f"server {server!r} waits for a login: the proxy's log has the link, or run"
                f" `mcp-spec-proxy login {server}`; its tools appear once it is logged in"
            )
        return (
            f"server {server!r} waits for a login: open the proxy's approval console at {self.url} (its link, with"
            f" the key: run `{self.link_command}`) and follow 'Log in to {server}'; its tools appear once it is"
            " logged in"
        )

    def _bump(self) -> None:
        self.version += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def _expire(self) -> None:
        now = time.monotonic()
        for key in [key for key, item in self._pending.items() if item.expires <= now]:
            del self._pending[key]


class ConsoleReviewer:
    """`review: console`: the person at the approval console decides."""

    by = ReviewerKind.CONSOLE.chain

    def __init__(self, queue: ConsoleQueue, leash: Leash | None = None) -> None:
        self.queue = queue
        self._leash = leash

    def waiting_note(self) -> str | None:
        url = self.queue.url
        if not url:
            return None
        return (
            f"a person can approve or deny it on the proxy's approval console at {url} (open it with the link"
            f" that holds its key: run `{self.queue.link_command}`, or see the proxy's log)"
        )

    async def review(self, request: ReviewRequest, user: UserChannel, context: str = "") -> Verdict:
        held = len(request.segment)
        tool = request.tool
        # A rule stands for the person on calls like the one they approved, not on a call a model
        # reviewer rejected before sending it here: that one they see.
        rule = self.queue.rule_for(request.session, tool, request.arguments) if tool and not context else None
        if rule is not None:
            return Verdict(True, f"allowed by a session rule set on the approval console: {rule.describe()}", held,
                           by=ReviewerKind.CONSOLE_RULE.chain)  # fmt: skip
        if tool is None or self.queue.url is None:
            reason = (
                "review.fallback is console, but no approval console is being served (the proxy was started"
                " with --http and no --console, or with --no-console, or this command serves none) — start the"
                " proxy with its console (with --http: add --console 127.0.0.1:PORT), or set review.fallback: deny"
            )
            return Verdict(False, reason, held - 1, by=ReviewerKind.CONSOLE_UNAVAILABLE.chain)
        score = None
        if self._leash is not None:
            score = (await self._leash.step_score(request.segment.held)).as_json()
        item = Pending(
            request.call,
            request.session,
            tool,
            dict(request.arguments),
            request.intent,
            request.segment.steps[:-1],
            context,
            score,
            time.monotonic() + self.queue.timeout,
            request.principal,
        )
        try:
            self.queue.hold(item)
        except ConsoleRefused as exc:  # a flood of held calls: the rest are refused, not queued
            return Verdict(False, str(exc), held - 1, by=ReviewerKind.CONSOLE_UNAVAILABLE.chain)
        try:
            await item.decided.wait()
        except anyio.get_cancelled_exc_class():
            item.abandoned = True  # a decision that came meanwhile never reached the call
            raise
        finally:
            self.queue.release(item)
            item.taken.set()
        decision = item.decision
        assert decision is not None
        evidence = {"leash": score} if score else None
        if decision.action == "deny":
            why = decision.reason or "no reason given"
            return Verdict(False, f"denied on the approval console: {why}", held - 1, by=self.by,
                           evidence=evidence)  # fmt: skip
        how = {"approve": "approved", "edit": "approved with edited arguments", "rule": "approved, with a rule"}
        reason = f"{how[decision.action]} on the approval console" + (f": {decision.reason}" if decision.reason else "")
        if decision.rule is not None:  # its own rule: another decision may have added one since
            reason += f" ({decision.rule.describe()})"
        return Verdict(True, reason, held, by=self.by, evidence=evidence, arguments=decision.arguments)


def backend_view(tool: CatalogTool) -> CatalogTool:
    """`tool` with the schema its backend declared: the proxy's own `intent` argument taken out."""
    if not tool.wants_intent:
        return tool
    schema = dict(tool.input_schema)
    schema["properties"] = {k: v for k, v in (schema.get("properties") or {}).items() if k != INTENT_ARGUMENT}
    schema["required"] = [k for k in schema.get("required") or [] if k != INTENT_ARGUMENT]
    return dataclasses.replace(tool, definition=tool.definition.model_copy(update={"input_schema": schema}))


def _checked_rule(item: Pending, patterns: dict[str, str | None] | None) -> Rule:
    """The rule `patterns` make for calls like `item`, or `ConsoleRefused` saying why none."""
    if not isinstance(patterns, dict) or set(patterns) != set(item.arguments):
        raise ConsoleRefused("a rule needs one term for every argument of the call, and no other")
    for key, pattern in patterns.items():
        if pattern is None:  # exactly the value held: always possible
            continue
        if not isinstance(pattern, str):
            raise ConsoleRefused(f"the term for {visible(key)} must be a pattern (text) or null (exactly this value)")
        why = pattern_refusal_for(item.arguments[key])
        if why is not None:
            raise ConsoleRefused(f"{visible(key)} can be allowed only exactly: {why}")
        why = pattern_refusal(pattern)
        if why is not None:
            raise ConsoleRefused(f"the pattern for {visible(key)} is refused: {why}")
    # A copy: the rule keeps the value the person saw, whatever later holds a reference to the call's.
    exact = {key: copy.deepcopy(value) for key, value in item.arguments.items() if patterns[key] is None}
    rule = Rule(item.session, item.tool.name, item.tool.fingerprint, dict(patterns), exact)
    if not rule.matches(item.session, item.tool.name, item.arguments):
        raise ConsoleRefused("those patterns do not match the call they would approve; widen them")
    return rule


__all__ = [
    "ConsoleQueue",
    "ConsoleRefused",
    "ConsoleReviewer",
    "Decision",
    "Pending",
    "Rule",
    "backend_view",
]
