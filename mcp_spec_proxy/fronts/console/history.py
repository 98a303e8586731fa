"""The console's view of the audit trail: the calls table, one call's story, LEASH's record.

The audit trail is read as the store wrote it (`Store.read_audit`: files or Postgres), never
changed. Lines of one call share its id, so a call's story is its lines in order: held →
verdict → (edited) → forwarded or blocked.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from html import escape
from typing import Any

from mcp_spec_proxy.fronts.console.pages import folded, page

ROWS_SHOWN = 500
BINS = 10
FILTERS = ("session", "principal", "tool", "verdict", "reviewer")
SEPARATORS = re.compile(r"(__+|[\-./:→+]+)")
"""Where a name (a tool, a session, a reviewer chain) may wrap: after the namespace's `__` and these,
never inside a word, nor at a single `_` (`write_file` stays whole)."""


@dataclass
class CallRow:
    call: str
    time: float
    session: str
    tool: str
    author: str
    kind: str  # read | write
    reviewer: str = ""
    verdict: str = "waiting"  # accepted | refused | waiting | read
    outcome: str = ""
    reason: str = ""
    edited: bool = False
    principal: str = ""  # who asked (`principal.sub`), under `auth:`; empty where nobody is identified
    lines: list[dict[str, Any]] = field(default_factory=list)


def calls(lines: list[dict[str, Any]]) -> list[CallRow]:
    """One row per held call (its lines joined by call id) and per read, oldest first."""
    rows: dict[str, CallRow] = {}
    order: list[CallRow] = []
    for number, line in enumerate(lines):
        event = line.get("event")
        if event == "read":
            read = _row(f"read-{number}", line, "read")
            read.verdict, read.outcome = "read", "forwarded"
            read.lines.append(line)
            order.append(read)
            continue
        call = line.get("call")
        if not isinstance(call, str):
            continue
        row = rows.get(call)
        if row is None:
            if event != "held":
                continue
            row = rows[call] = _row(call, line, "write")
            order.append(row)
        row.lines.append(line)
        if event == "verdict":
            row.verdict = "accepted" if line.get("accepted") else "refused"
            row.reviewer = str(line.get("decided_by") or row.reviewer)
            row.reason = str(line.get("reason", ""))
        elif event == "edited":
            row.edited = True
        elif event in ("forwarded", "unsent", "blocked", "abandoned", "forward-interrupted", "awaiting-input"):
            row.outcome = event
    return order


def _row(call: str, line: dict[str, Any], kind: str) -> CallRow:
    session, tool, author = (str(line.get(key, "")) for key in ("session", "tool", "author"))
    named = line.get("principal")
    who = str(named.get("sub") or "") if isinstance(named, dict) else ""
    return CallRow(
        call, _time(line), session, tool, author, kind, reviewer=str(line.get("reviewer", "")), principal=who
    )


def matching(rows: list[CallRow], filters: dict[str, str]) -> list[CallRow]:
    def keep(row: CallRow) -> bool:
        return (
            filters.get("session", "") in row.session
            and filters.get("principal", "") in row.principal
            and filters.get("tool", "") in row.tool
            and (not filters.get("verdict") or row.verdict == filters["verdict"])
            and filters.get("reviewer", "") in row.reviewer
        )

    return [row for row in rows if keep(row)]


def history_page(rows: list[CallRow], filters: dict[str, str]) -> str:
    shown = list(reversed(matching(rows, filters)))[:ROWS_SHOWN]
    inputs = "".join(
        f'<label>{name} <input name="{name}" value="{escape(filters.get(name, ""))}"></label>'
        for name in ("session", "principal", "tool", "reviewer")
    )
    options = "".join(
        f'<option value="{v}"{" selected" if filters.get("verdict") == v else ""}>{v or "any"}</option>'
        for v in ("", "accepted", "refused", "waiting", "read")
    )
    form = (
        f'<form class="filters" method="get" action="/history">{inputs}'
        f'<label>verdict <select name="verdict">{options}</select></label><button>Filter</button></form>'
    )
    named = any(row.principal for row in shown)  # who asked: a column only where some call names one (`auth:`)
    body = "".join(
        f'<tr class="{row.verdict}"><td>{_when(row.time)}</td><td><code class=id>{breakable(row.session)}</code></td>'
        + (f'<td class="principal">{escape(row.principal)}</td>' if named else "")
        + f"<td><code>{breakable(row.tool)}</code></td><td>{escape(row.author)}</td><td>{breakable(row.reviewer)}</td>"
        f'<td class="verdict">{escape(row.verdict)}{" (edited)" if row.edited else ""}</td>'
        f"<td>{escape(row.outcome)}</td>"
        f'<td class="reason">{folded(row.reason) if row.reason else ""}</td>'
        f"<td>{_story_link(row)}</td></tr>"
        for row in shown
    )
    table = (
        '<table class="history"><thead><tr><th>time</th><th>session</th>'
        + ("<th>asked by</th>" if named else "")
        + "<th>tool</th><th>author</th><th>reviewer</th><th>verdict</th><th>outcome</th><th>reason</th><th></th>"
        f"</tr></thead><tbody>{body or '<tr><td colspan=10>No calls match.</td></tr>'}</tbody></table>"
    )
    lead = (
        "<h1>History</h1><p class=lead>Every call the agent made through the proxy, newest first: reads ran at"
        " once; changes waited for a verdict. Open a call to see its whole story.</p>"
    )
    return page("History", lead + form + table, active="history")


def story_page(call: str, lines: list[dict[str, Any]]) -> str:
    mine = [line for line in lines if line.get("call") == call]
    if not mine:
        return page("Call", f"<h1>No call {escape(call)} in the audit log</h1>", active="history")
    items = "".join(
        f"<li><h3>{escape(str(line.get('event')))} <small>{_clock(_time(line))}</small></h3>{_fields(line)}</li>"
        for line in mine
    )
    head = mine[0]
    title = f"<h1>The story of call <code>{escape(call)}</code>: <code>{escape(str(head.get('tool')))}</code></h1>"
    return page("Call", f'{title}<ol class="story">{items}</ol>', active="history")


def leash_page(stats: dict[str, dict[str, Any]] | None, lines: list[dict[str, Any]]) -> str:
    if stats is None:
        body = "<p class=lead>LEASH is not configured for this proxy (no <code>leash:</code> section).</p>"
        return page("LEASH", "<h1>LEASH</h1>" + body, active="leash")
    tables = "".join(
        f"<h2>{escape(name)} bank</h2><table class=stats><tbody>"
        + "".join(
            f"<tr><th scope=row>{escape(k)}</th><td>{escape(json.dumps(v, default=str))}</td></tr>"
            for k, v in bank.items()
        )
        + "</tbody></table>"
        for name, bank in stats.items()
    )
    lead = (
        "<h1>LEASH</h1><p class=lead>LEASH compares each held step with past steps that were accepted or refused."
        " The plot shows, for the verdicts of this audit log that carried a LEASH score, the share refused at each"
        " score: a useful score rises from left to right.</p>"
    )
    return page("LEASH", lead + plot(scored(lines)) + tables, active="leash")


def scored(lines: list[dict[str, Any]]) -> list[tuple[float, bool]]:
    """(LEASH score, refused) of every verdict in the audit whose evidence carries a score."""
    found = []
    for line in lines:
        if line.get("event") != "verdict" or not isinstance(line.get("evidence"), dict):
            continue
        evidence = line["evidence"]
        score = evidence.get("score", (evidence.get("leash") or {}).get("score"))
        if isinstance(score, int | float):
            found.append((float(score), not line.get("accepted")))
    return found


def plot(points: list[tuple[float, bool]]) -> str:
    """An SVG bar chart: the share of refused verdicts in each score bin, with its count."""
    if not points:
        return "<p class=note>No verdict in the audit log carries a LEASH score yet.</p>"
    width, height, pad = 520, 220, 30
    bar = (width - 2 * pad) / BINS
    bars = []
    for b in range(BINS):
        inside = [refused for score, refused in points if min(int(score * BINS), BINS - 1) == b]
        if not inside:
            continue
        share = sum(inside) / len(inside)
        h = share * (height - 2 * pad)
        x, y = pad + b * bar, height - pad - h
        bars.append(
            f'<rect x="{x + 2:.1f}" y="{y:.1f}" width="{bar - 4:.1f}" height="{h:.1f}" class="bar">'
            f"<title>score {b / BINS:.1f} to {(b + 1) / BINS:.1f}: {sum(inside)} of {len(inside)} refused"
            "</title></rect>"
            f'<text x="{x + bar / 2:.1f}" y="{height - pad - h - 4:.1f}" text-anchor="middle">n={len(inside)}</text>'
        )
    axis = (
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" class="axis"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" class="axis"/>'
        f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle">LEASH failure score (0 → 1)</text>'
        f'<text x="4" y="{pad - 8}">share refused (0 → 1)</text>'
    )
    label = 'role="img" aria-label="share refused by LEASH score"'
    return f'<svg class="plot" viewBox="0 0 {width} {height}" {label}>{axis}{"".join(bars)}</svg>'


def breakable(name: str) -> str:
    """`name` escaped, with a line-break opportunity after each separator (`fs__write_file` may wrap
    as `fs__` / `write_file`, never as `wri` / `te`): the cell's CSS breaks nowhere else."""
    return SEPARATORS.sub(r"\1<wbr>", escape(name))


def _fields(line: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><th scope=row>{escape(key)}</th><td>{folded(_text(value))}</td></tr>"
        for key, value in line.items()
        if key not in ("event", "ts", "time")
    )
    return f"<table class=fields><tbody>{rows}</tbody></table>"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _story_link(row: CallRow) -> str:
    return "" if row.kind == "read" else f'<a href="/call/{escape(row.call)}">story</a>'


def _time(line: dict[str, Any]) -> float:
    value = line.get("ts", line.get("time", 0))
    return float(value) if isinstance(value, int | float) else 0.0


def _clock(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else ""


def _when(ts: float) -> str:
    """The time cell: the date and the time each whole (a date broken at its hyphens reads as nonsense)."""
    return "".join(f'<span class="nowrap">{part}</span> ' for part in _clock(ts).split(" ")).strip()
