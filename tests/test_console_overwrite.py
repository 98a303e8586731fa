"""A held overwrite on the console shows what it changes: the real filesystem server, Debian's Chromium.

The agent asks to overwrite (`write_file`) or edit (`edit_file`) a file; the card shows the file's
lines the call removes and adds, the old content read through the gate's read door (a `read` on the
audit trail, by the console) — and nothing is written before the person approves. A file that cannot
be read (a new one) shows the new content with its lines numbered. The file on disk is the ground truth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_spec_proxy.calls.audit import read_audit
from tests import backends
from tests.console_world import calling, console_world
from tests.test_console import CHROMIUM, browser_page

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium: apt-get install chromium (scripts/test.sh does)"),
]


def filesystem(root: Path) -> dict[str, Any]:
    command = backends.filesystem(root)
    return {"command": command.command, "args": command.args, "env": command.env}


async def test_an_overwrite_shows_the_lines_it_removes_and_adds_and_writes_nothing_before_approval(
    tmp_path: Path,
) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    todo = root / "todo.md"
    todo.write_text("buy milk\nbuy bread\ncall <b>mum</b>\n")
    async with console_world(tmp_path, servers={"fs": filesystem(root)}) as world, browser_page(world) as page:
        new = "buy oat milk\nbuy bread\ncall <b>mum</b>\n"
        call = calling(world, "fs__write_file", {"path": str(todo), "content": new, "intent": "oat milk"})
        card = page.locator("article.call")
        await card.wait_for()
        section = card.locator("section.overwrite")
        assert "What changes in" in await section.inner_text()
        assert [await line.inner_text() for line in await section.locator("pre.diff .del").all()] == ["-buy milk"]
        assert [await line.inner_text() for line in await section.locator("pre.diff .add").all()] == ["+buy oat milk"]
        assert "call <b>mum</b>" in await section.locator("pre.diff").inner_text()  # the file's text, as text
        assert await section.locator("pre.diff b").count() == 0  # never as markup
        assert todo.read_text() == "buy milk\nbuy bread\ncall <b>mum</b>\n"  # shown, not written
        [read] = [line for line in read_audit(world.p.state.audit) if line["event"] == "read"]
        assert read["tool"] == "fs__read_text_file" and read["author"] == "console"
        await card.get_by_role("button", name="Approve: let it run").click()
        assert not (await call.wait()).is_error
    assert todo.read_text() == new


async def test_an_edit_shows_its_diff_and_a_new_file_its_numbered_lines(tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    todo = root / "todo.md"
    todo.write_text("buy milk\nbuy bread\n")
    async with console_world(tmp_path, servers={"fs": filesystem(root)}) as world, browser_page(world) as page:
        edits = [{"oldText": "buy bread", "newText": "buy rye bread"}]
        call = calling(world, "fs__edit_file", {"path": str(todo), "edits": edits, "intent": "rye"})
        card = page.locator("article.call:not(.done)")
        await card.wait_for()
        diff = card.locator("section.overwrite pre.diff")
        assert [await line.inner_text() for line in await diff.locator(".del").all()] == ["-buy bread"]
        assert [await line.inner_text() for line in await diff.locator(".add").all()] == ["+buy rye bread"]
        await card.get_by_role("button", name="Deny").click()
        assert (await call.wait()).is_error
        await card.wait_for(state="detached")  # moved to the decided list
        fresh = root / "new.md"
        call = calling(world, "fs__write_file", {"path": str(fresh), "content": "one\ntwo\n", "intent": "new"})
        card = page.locator("article.call:not(.done)")
        await card.wait_for()
        section = card.locator("section.overwrite")
        assert "There is no old content to compare" in await section.inner_text()
        numbered = await section.locator("pre.numbered").inner_text()
        assert numbered.split("\n")[:2] == ["1 one", "2 two"]
        await card.get_by_role("button", name="Deny").click()
        assert (await call.wait()).is_error
    assert todo.read_text() == "buy milk\nbuy bread\n" and not fresh.exists()
