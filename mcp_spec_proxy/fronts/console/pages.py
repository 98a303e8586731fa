"""The approval console's HTML, rendered on the server: a held call's card, the pages around it.

Every value is escaped here; nothing a client, an agent or a backend wrote reaches the page as
markup. Nor does a character that shows nothing yet changes how the rest reads (a direction
override that turns `dm.exe` into `exe.md`, a zero-width space, a control character): it is
shown as its code point (`⟨U+202E⟩`), and kept exact where the person edits (`\u202e` in the
JSON). A long value is folded (`<details>`, its length stated), never cut without saying so.
The words are for someone who has never seen the proxy: what is asked, what each button does.
"""

from __future__ import annotations

import json
import re
import time
from html import escape
from typing import Any

from mcp_spec_proxy.review.console import Pending
from mcp_spec_proxy.review.rules import UNSEEN, Rule, config_rule, pattern_refusal_for, visible

FOLD_CHARS = 240
"""A value longer than this is shown folded: its start, and the whole on a click."""
RULE_WORDS = (
    "<code>*</code> matches any characters within one part of a path, <code>?</code> exactly one;"
    " neither matches <code>/</code>, <code>\\</code>, a line break or an invisible character, and"
    " there is no <code>**</code>. Every other character stands for itself. Whatever the pattern,"
    " a value with a <code>..</code> or <code>.</code> part, a control or invisible character, or"
    " percent-escapes or look-alike characters hiding one (<code>%2e%2e</code>), is never allowed"
    " by a pattern: such calls wait here each time. A pattern applies to text only."
)
"""What a rule's pattern admits, as `review/rules.py` promises it, in the page's words."""


DECIDED = (
    '<section id="decided" hidden><h2 class="decided">Decided on this page, newest first'
    ' <small>(click a title to see the call again)</small></h2><div class="list"></div></section>'
)
"""Where the script moves a call once it no longer waits: below every call that does, folded."""


def page(title: str, body: str, *, active: str) -> str:
    nav = "".join(
        f'<a href="{href}"{" aria-current=page" if key == active else ""}>{label}</a>'
        for key, href, label in (
            ("pending", "/", "Waiting for you"),
            ("history", "/history", "History"),
            ("leash", "/leash", "LEASH"),
        )
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{escape(title)} — mcp-spec-proxy</title><link rel="stylesheet" href="/console.css">'
        '<script src="/console.js" defer></script></head><body>'
        f'<header class="top"><strong>mcp-spec-proxy</strong> approval console<nav>{nav}</nav></header>'
        f"<main>{body}</main></body></html>"
    )


def pending_page(
    items: list[Pending],
    rules: list[Rule] | None = None,
    *,
    command: str = "",
    changes: dict[str, str] | None = None,
    logins: dict[str, str] | None = None,
) -> str:
    intro = (
        "<h1>Changes waiting for your approval</h1>"
        '<p class="lead">An AI agent connected through mcp-spec-proxy wants to use tools that may change'
        " something (write a file, commit, send a message). Each such call is <b>held here and has not run</b>"
        " until you decide. Read what it will do, then approve it, refuse it, or change it first.</p>"
    )
    cards = "".join(card(item, (changes or {}).get(item.id, "")) for item in items)
    empty = '<p id="empty" class="empty"' + (" hidden" if items else "") + ">Nothing is waiting. New calls appear"
    empty += " here by themselves; keep this page open.</p>"
    body = f'{intro}{lost_notice(command)}<div id="logins">{login_cards(logins or {})}</div>'
    body += f'{empty}<div id="pending">{cards}</div>{DECIDED}{rules_section(rules or [])}'
    return page("Waiting for you", body, active="pending")


def login_cards(logins: dict[str, str]) -> str:
    """A card for each remote server waiting for the person's login, with its authorization link (the
    authorization server's page, which sends the browser back to the proxy's loopback redirect). Only an
    http(s) link is a link: anything else a hostile server's metadata might name is shown as text."""
    cards = []
    for server, url in sorted(logins.items()):
        if url.startswith(("https://", "http://")):
            href = escape(url, quote=True)
            link = f'<a class="login-link" href="{href}" rel="noreferrer">Log in to {shown(server)}</a>'
        else:
            link = f"<code>{shown(url)}</code> (not an http(s) link: not opened from this page)"
        cards.append(
            f'<article class="login" data-server="{escape(server, quote=True)}"><h2>Log in to {shown(server)}</h2>'
            f"<p>The server <b>{shown(server)}</b> asks you to log in before its tools can be used. {link}"
            " opens its login page; once you are logged in its tools appear in your client by themselves.</p></article>"
        )
    return "".join(cards)


def lost_notice(command: str) -> str:
    """What the page says when it loses the proxy (the script shows one of its two texts): a tab kept
    open across a restart of the client, which restarts the proxy, must not go on saying nothing waits.
    The command prints the new run's link; it holds no key."""
    run = f"run <code class=command>{escape(command)}</code> and open the link it prints"
    return (
        '<div id="lost" class="lost" role="alert" hidden>'
        '<p data-why="stopped" hidden><b>This page has lost the proxy.</b> It stopped, or your AI client (Claude'
        " Desktop, say) restarted it. What this page shows is out of date: calls still waiting on the old run"
        " when it stopped were not run."
        f" A new run holds its calls on its own console, with a new key: {run}. This page checks every few"
        " seconds and follows by itself once you have opened that link.</p>"
        '<p data-why="replaced" hidden><b>A new run of the proxy serves the console here now</b>, with a new key:'
        f" this page's key was the old run's, and its calls are not shown here. To see them, {run} (in this tab,"
        " or another: this page then follows).</p></div>"
    )


def card(item: Pending, changes: str = "") -> str:
    """One held call; `changes` is what it would change in a file, where it overwrites one (`overwrite.py`)."""
    tool = item.tool
    title = tool.definition.title or tool.original
    description = tool.definition.description or ""
    held = time.strftime("%H:%M:%S", time.localtime(item.held_at))
    parts = [
        f'<article class="call" id="call-{escape(item.id)}" data-id="{escape(item.id)}"'
        f' data-digest="{escape(item.digest)}" data-left="{item.seconds_left():.0f}">',
        f"<h2>The agent wants to run <code>{shown(tool.name)}</code></h2>",
        f'<p class="meta">Tool “{shown(title)}” of the server <b>{shown(tool.server)}</b>, held at {held}'
        f" in session <code>{shown(item.session)}</code>{asked_by(item)}. If nobody decides within"
        f' <span class="left">{item.seconds_left():.0f}</span> seconds it is refused.</p>',
    ]
    if description:
        parts.append(f'<p class="tool-description">What the tool says it does: {folded(description)}</p>')
    parts.append("<h3>What it will do</h3>" + arguments_table(item.arguments) + changes)
    if item.intent:
        parts.append(
            '<section class="claim"><h3>Why, according to the agent</h3>'
            f"<blockquote>{folded(item.intent)}</blockquote>"
            '<p class="note">This is the agent\'s own claim. Nothing has checked it.</p></section>'
        )
    parts.append(reads_section(item))
    if item.context:
        parts.append(
            '<section class="model"><h3>What the reviewing model said</h3>'
            f"<p>{folded(item.context)}</p><p class=note>It sent this call to you to decide.</p></section>"
        )
    if item.leash:
        parts.append(leash_section(item.leash))
    parts.append(decision_form(item))
    parts.append("</article>")
    return "".join(parts)


def asked_by(item: Pending) -> str:
    """Who asked, where the front authenticated them (`auth:`): the token's subject and client."""
    principal = item.principal
    if principal is None:
        return ""
    client = f" (client <code>{shown(principal.client_id)}</code>)" if principal.client_id else ""
    return f', <span class="principal">asked by <b>{shown(principal.sub)}</b>{client}</span>'


def arguments_table(arguments: dict[str, Any]) -> str:
    if not arguments:
        return '<p class="note">No arguments.</p>'
    rows = "".join(
        f"<tr><th scope=row>{folded(key)}</th><td>{folded(_text(value))}</td></tr>"  # a key may be long too
        for key, value in arguments.items()
    )
    return f'<table class="arguments"><tbody>{rows}</tbody></table>'


def reads_section(item: Pending) -> str:
    if not item.reads:
        return (
            '<section class="reads"><h3>What it looked at first</h3>'
            '<p class="note">No earlier steps in this session since the last change.</p></section>'
        )
    rows = []
    for step in item.reads:
        observation = step.observation if step.observation is not None else "(no result recorded)"
        rows.append(
            f"<li><code>{shown(step.tool)}</code> {folded(json.dumps(step.arguments, ensure_ascii=False))}"
            f'<div class="observation">{"error: " if step.is_error else ""}result: {folded(observation)}</div></li>'
        )
    return (
        '<section class="reads"><h3>What it looked at first (the steps that led here)</h3>'
        f"<ol>{''.join(rows)}</ol></section>"
    )


def leash_section(leash: dict[str, Any]) -> str:
    score = leash.get("score")
    shown = "not enough similar past steps to judge" if score is None else f"{float(score):.2f}"
    neighbours = "".join(
        f"<li>{escape(str(n.get('label')))} — similarity {float(n.get('similarity') or 0):.2f}"
        f" ({escape(str(n.get('source')))})</li>"
        for n in leash.get("neighbours") or []
    )
    return (
        '<section class="leash"><h3>How similar steps went before (LEASH)</h3>'
        f"<p>Failure score: <b>{escape(shown)}</b> (0 = similar past steps were accepted, 1 = refused).</p>"
        f"{'<ul>' + neighbours + '</ul>' if neighbours else ''}</section>"
    )


def decision_form(item: Pending) -> str:
    # In JSON an unseen character can be written as its escape: the edit box shows it and stays exact.
    edit = UNSEEN.sub(_json_escape, json.dumps(item.arguments, ensure_ascii=False, indent=2))
    return (
        '<form class="decide">'
        '<div class="buttons"><button type="button" class="approve" data-action="approve">Approve: let it run</button>'
        '<button type="button" class="deny" data-action="deny">Deny</button></div>'
        '<label class="reason">Reason for denying (the agent is told it): <input name="reason"'
        ' placeholder="e.g. not that file; ask me first"></label>'
        '<details class="edit"><summary>Change the arguments, then approve</summary>'
        '<p class="note">Change any value below, then approve. The call is checked against the tool\'s schema'
        " before anything runs, and the change is written to the audit log.</p>"
        f'{argument_fields(item.arguments)}<button type="button" data-action="edit">Approve with these arguments'
        '</button><details class="json"><summary>Or edit all the arguments as JSON</summary>'
        f'<textarea name="arguments" rows="{min(20, edit.count(chr(10)) + 2)}">\n{escape(edit)}</textarea>'
        '<button type="button" data-action="edit-json">Approve with this JSON</button></details></details>'
        '<details class="rule"><summary>Approve, and allow calls like this for the rest of this session</summary>'
        f'<p class="rule-lead">Later calls of <code>{shown(item.tool.name)}</code> in this session run without'
        " asking when <b>every</b> argument is allowed below. This session only, and only while the tool's"
        " server describes the tool as it does now.</p>"
        f"{rule_terms(item.arguments, item.id)}"
        f'<details class="help"><summary>What a pattern can match</summary><p class="note">{RULE_WORDS}</p></details>'
        '<button type="button" data-action="rule">Approve and allow matching calls</button></details>'
        '<p class="status" role="status"></p></form>'
    )


def argument_fields(arguments: dict[str, Any]) -> str:
    """One box per top-level argument: text as text, anything else (and text holding an unseen
    character, written there as its `\\u` escape) as JSON. The script joins them into one JSON object,
    each JSON box as typed (the proxy parses it: every digit of a long integer kept)."""
    if not arguments:
        return '<p class="note">This call has no arguments.</p>'
    rows = []
    for key, value in arguments.items():
        text = isinstance(value, str) and not UNSEEN.search(value)
        shown_value = value if text else UNSEEN.sub(_json_escape, json.dumps(value, ensure_ascii=False, indent=2))
        kind = "text" if text else "JSON: a number, true or false, null, a list, an object, or text in quotes"
        lines = min(12, max(2, shown_value.count("\n") + 1, len(shown_value) // 80 + 1))
        rows.append(
            f'<label class="field" data-key="{escape(json.dumps(key))}" data-kind="{"text" if text else "json"}">'
            f'<span class="name">{shown(key)}</span> <span class="kind">{kind}</span>'
            f'<textarea name="field" rows="{lines}">\n{escape(shown_value)}</textarea></label>'
        )
    return f'<div class="fields">{"".join(rows)}</div>'


def rule_terms(arguments: dict[str, Any], item: str = "") -> str:
    """Per argument, one row: allow exactly this value (the default), or text matching a pattern where
    a pattern can admit it (the choice of two labelled radio buttons; typing a pattern picks it).

    Each key travels as ASCII JSON in `data-key`: exact, and no invisible character reaches the page.
    """
    if not arguments:
        return '<p class="note">No arguments: the rule allows calls with no arguments.</p>'
    rows = []
    for number, (key, value) in enumerate(arguments.items()):
        head = f'<fieldset class="term" data-key="{escape(json.dumps(key))}"><legend>{shown(key)}</legend>'
        exact = folded(visible(value))
        why = pattern_refusal_for(value)
        if why is not None:  # only the exact value: the page says why, and offers no pattern box
            rows.append(
                f'{head}<p class="choice">Allowed: exactly {exact}</p>'
                f'<p class="note">Only this exact value can be allowed: {escape(why)}.</p></fieldset>'
            )
            continue
        name = escape(f"mode-{item}-{number}")
        rows.append(
            f'{head}<label class="choice"><input type="radio" name="{name}" value="exact" checked>'
            f" exactly {exact}</label>"
            f'<label class="choice"><input type="radio" name="{name}" value="pattern"> text matching the pattern'
            f' <input name="pattern" value="{escape(value)}" aria-label="pattern for {escape(key)}"></label>'
            "</fieldset>"
        )
    return f'<div class="terms">{"".join(rows)}</div>'


def rules_section(rules: list[Rule]) -> str:
    """The session rules in force, each written as exactly what it admits."""
    if not rules:
        return ""
    listed = "".join(f"<li><code>{shown(rule.describe())}</code>{kept(rule)}</li>" for rule in rules)
    return (
        '<section class="rules"><h2>Rules in force</h2><p class="note">Calls these match run without'
        f" asking, in their session only. {RULE_WORDS}</p><ul>{listed}</ul></section>"
    )


def kept(rule: Rule) -> str:
    """The rule as servers.yaml's `rules:` would keep it (`config_rule`), for the operator to add."""
    text = config_rule(rule)
    if text is None:
        return (
            '<p class="note">Not offered for servers.yaml: a value or pattern of it has no exact CEL form'
            " (a pattern with % or letters past ASCII, a number past 64 bits); write that rule by hand.</p>"
        )
    return (
        '<details class="keep"><summary>Save as a rule for servers.yaml</summary>'
        '<p class="note">Add this under <code>rules:</code> in servers.yaml and restart the proxy: then these'
        " calls run without asking in every session and for everyone (add a <code>principal</code> term to"
        " narrow it). Its patterns are stricter than this session's: a wildcard matches only letters, digits,"
        f" <code>_</code>, <code>-</code> and <code>.</code> (never first).</p><pre>{escape(text)}</pre></details>"
    )


def folded(text: str) -> str:
    """`text` escaped; past FOLD_CHARS its start shows and the rest opens on a click, its length said."""
    if len(text) <= FOLD_CHARS:
        return f'<span class="value">{shown(text)}</span>'
    return (
        f'<details class="fold"><summary><span class="value">{shown(text[:FOLD_CHARS])}</span>… '
        f"<em>({len(text)} characters: show all)</em></summary>"
        f'<pre class="value">{shown(text)}</pre></details>'
    )


def shown(text: str) -> str:
    """`text` escaped, each unseen character (`UNSEEN`) shown as its code point."""
    return UNSEEN.sub(_mark, escape(text))


def _mark(match: re.Match[str]) -> str:
    return f'<span class="unseen" title="an invisible character">⟨U+{ord(match[0]):04X}⟩</span>'


def _json_escape(match: re.Match[str]) -> str:
    data = match[0].encode("utf-16-be")  # one code unit, or a surrogate pair past U+FFFF
    return "".join(f"\\u{int.from_bytes(data[i : i + 2], 'big'):04x}" for i in range(0, len(data), 2))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)
