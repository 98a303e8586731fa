"""What a held overwrite would change: the file as it is, read through the gate's read door, and the diff.

A held call "overwrites" when its arguments name a `path` and either its whole new `content` or
`edits` (`oldText` → `newText`, the filesystem server's `write_file` and `edit_file`). The card then
shows the file's lines the call removes and adds. The file as it is now is read with the same
server's read tool (`read_text_file`, else `read_file`), through `Gate.read`: a read like any other,
forwarded at once and on the audit trail (author `console`), never a write — a rule of `rules:`
that makes that read a write, or denies it, means no diff. The read is the person's, not the
agent's: it joins no session's trajectory, and its text reaches only the page (escaped there).

Where the old content cannot be read (no such read tool, an error: a new file, say) the card shows
the new content with its lines numbered, and says why there is no diff. Edits are applied as
written (each `oldText` found exactly, once, in order); where one is not found as written (the
server itself matches more loosely) the card says so and shows no diff.
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Mapping
from typing import Any

from mcp_spec_proxy.calls.gate import Gate
from mcp_spec_proxy.errors import ShuttingDown
from mcp_spec_proxy.fronts.console.pages import shown
from mcp_spec_proxy.review.console import Pending
from mcp_spec_proxy.tools.catalog import Catalog, CatalogTool
from mcp_spec_proxy.tools.classification import HELD_REASONS
from mcp_spec_proxy.trajectory import Step

READ_TOOLS = ("read_text_file", "read_file")
"""The read tools, by their server's own names, that give a file's text for a `path`."""
MAX_CHARS = 1_000_000
"""Old or new content longer than this is not compared on the page."""
MAX_LINES = 2_000
"""Diff (or numbered) lines shown; the rest are counted, never dropped without saying so."""


def overwrite(arguments: Mapping[str, Any]) -> tuple[str, str | None, list[tuple[str, str]] | None] | None:
    """(path, new content, edits) when the arguments replace a file's content; None otherwise."""
    path = arguments.get("path")
    if not isinstance(path, str):
        return None
    content = arguments.get("content")
    if isinstance(content, str):
        return path, content, None
    edits = arguments.get("edits")
    if isinstance(edits, list) and edits:
        pairs = [(e.get("oldText"), e.get("newText")) for e in edits if isinstance(e, dict)]
        if len(pairs) == len(edits) and all(isinstance(a, str) and isinstance(b, str) for a, b in pairs):
            return path, None, [(str(a), str(b)) for a, b in pairs]
    return None


class OldContent:
    """The card's "what changes" section for held overwrites, each read once per held call."""

    def __init__(self, gate: Gate, catalog: Catalog) -> None:
        self._gate = gate
        self._catalog = catalog
        self._made: dict[str, str] = {}

    async def section(self, item: Pending) -> str:
        """The section's HTML ("" when the call overwrites nothing), read on first use and kept while it waits."""
        if item.id not in self._made:
            self._made[item.id] = await self._section(item)
        return self._made[item.id]

    def forget(self, waiting: set[str]) -> None:
        """Drop what was made for calls no longer waiting."""
        for key in [key for key in self._made if key not in waiting]:
            del self._made[key]

    async def _section(self, item: Pending) -> str:
        found = overwrite(item.arguments)
        if found is None:
            return ""
        path, content, edits = found
        reader = self._reader(item.tool)
        before, why = (None, "its server offers no read tool this page knows (read_text_file, read_file)")
        if reader is not None:
            before, why = await self._read(item, reader, path)
        head = f"<h3>What changes in <code>{shown(path)}</code></h3>"
        after = content
        if edits is not None:
            if before is None:
                return _section(head, f"The file could not be read, so the edits are not applied here: {shown(why)}.")
            after, missing = _applied(before, edits)
            if after is None:
                return _section(
                    head,
                    f"Edit {missing} names text the file does not hold as written (its server may match it more"
                    " loosely): compare the edits above with the file yourself.",
                )
        assert after is not None
        if before is None:
            return _section(
                head, f"There is no old content to compare: {shown(why)}. The new content:", _numbered(after)
            )
        if len(before) > MAX_CHARS or len(after) > MAX_CHARS:
            return _section(head, f"The file is too long to compare here (over {MAX_CHARS:,} characters).")
        if before == after:
            return _section(head, "The call writes what the file already holds: nothing in it changes.")
        assert reader is not None
        note = (
            f"The file as it is now (read at {time.strftime('%H:%M:%S')} with <code>{shown(reader.name)}</code>, a"
            " read on the audit trail) against what it holds after this call."
        )
        return _section(head, note, _diff(before, after))

    def _reader(self, tool: CatalogTool) -> CatalogTool | None:
        tools = {t.original: t for t in self._catalog.tools() if t.server == tool.server}
        for name in READ_TOOLS:
            found = tools.get(name)
            if found is not None and found.effect == "read" and found.reason not in HELD_REASONS:
                return found
        return None

    async def _read(self, item: Pending, reader: CatalogTool, path: str) -> tuple[str | None, str]:
        arguments = {"path": path}
        tool, decision = self._gate.policy.decide(reader, arguments, None, item.session)
        if tool.effect != "read" or decision.deny is not None:
            return None, f"a rule of `rules:` does not let {reader.name} run as a read here"
        step = Step(tool.name, arguments, "read")
        try:
            ran = await self._gate.read(item.session, tool, arguments, step, "console", rule=decision)
        except ShuttingDown:
            return None, "the proxy is shutting down"
        result = ran.result
        text = "".join(
            str(block.get("text", ""))
            for block in result.get("content") or []
            if isinstance(block, dict) and block.get("type") == "text"
        )
        if ran.error is not None or result.get("isError"):
            first = (text.strip().splitlines() or ["no reason given"])[0][:300]
            return None, f"{reader.name} could not read it ({first}); if it does not exist, this call creates it"
        return text, ""


def _applied(text: str, edits: list[tuple[str, str]]) -> tuple[str | None, int]:
    """`text` with each edit made in turn, or (None, the number of the first edit not found as written)."""
    text = text.replace("\r\n", "\n")
    for number, (old, new) in enumerate(edits, 1):
        old = old.replace("\r\n", "\n")
        if not old or old not in text:
            return None, number
        text = text.replace(old, new.replace("\r\n", "\n"), 1)
    return text, 0


def _diff(before: str, after: str) -> str:
    """The unified diff, a block per line (so no line break of its own: the page's text has one per line)."""
    lines = list(difflib.unified_diff(before.splitlines(), after.splitlines(), "now", "after", lineterm="", n=3))[2:]
    removed = sum(1 for line in lines if line.startswith("-"))
    added = sum(1 for line in lines if line.startswith("+"))
    kinds = {"-": "del", "+": "add", "@": "hunk"}
    rows = "".join(
        f'<span class="{kinds.get(line[:1], "same")}">{shown(line) or " "}</span>' for line in lines[:MAX_LINES]
    )
    left = len(lines) - MAX_LINES
    more = f'<p class="note">… and {left} more lines of the diff.</p>' if left > 0 else ""
    counts = (
        f'<p class="counts"><span class="del">{removed} line{"" if removed == 1 else "s"} removed</span>,'
        f' <span class="add">{added} added</span></p>'
    )
    return f'{counts}<pre class="diff">{rows}</pre>{more}'


def _numbered(text: str) -> str:
    lines = text.splitlines() or [""]
    width = len(str(min(len(lines), MAX_LINES)))
    rows = "".join(
        f'<span class="number">{number:>{width}}</span> {shown(line)}\n'
        for number, line in enumerate(lines[:MAX_LINES], 1)
    )
    more = f'<p class="note">… and {len(lines) - MAX_LINES} more lines.</p>' if len(lines) > MAX_LINES else ""
    return f'<pre class="numbered">{rows}</pre>{more}'


def _section(head: str, note: str, body: str = "") -> str:
    return f'<section class="overwrite">{head}<p class="note">{note}</p>{body}</section>'


__all__ = ["READ_TOOLS", "OldContent", "overwrite"]
