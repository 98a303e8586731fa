"""The approval console in a real browser: Debian's Chromium driven by Playwright.

A client calls a write through the proxy; the page (opened before the call, so the card arrives
by server-sent events) shows it; the test clicks as a person would. The toy backend's ledger
says what ran, the client's result what the agent heard, the audit log who decided.
Chromium comes from the system (`apt-get install chromium`; scripts/test.sh installs it): the
Playwright browser download is not used.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.review.console import Decision
from tests.console_world import World, calling, console_world
from tests.harness import recorded, text_of

playwright = pytest.importorskip("playwright.async_api", reason="pip install playwright (the test extra)")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium: apt-get install chromium (scripts/test.sh does)"),
]
WAIT_MS = 20_000


@asynccontextmanager
async def browser_page(world: World) -> AsyncIterator[Any]:
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM)
        try:
            page = await browser.new_page()
            page.set_default_timeout(WAIT_MS)
            await page.goto(world.url)
            assert "token=" not in page.url  # the secret left the address bar for a cookie
            yield page
        finally:
            await browser.close()


def audit_of(world: World, event: str) -> list[dict[str, Any]]:
    return [line for line in read_audit(world.p.state.audit) if line["event"] == event]


def values(world: World) -> list[str]:
    return [json.loads(line)["value"] for line in recorded(world.ledger)]


async def test_a_person_approves_a_held_write_in_the_browser(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world, browser_page(world) as page:
        await page.get_by_text("Nothing is waiting").wait_for()
        await world.p.client.call_tool("toy__echo", {"text": "what is in the notes"})
        call = calling(world, "toy__record", {"value": "buy milk", "intent": "the user asked to note milk"})
        card = page.locator("article.call")
        await card.wait_for()
        assert "toy__record" in await card.inner_text()
        assert "buy milk" in await card.inner_text()
        assert "the user asked to note milk" in await card.locator("section.claim").inner_text()
        assert "toy__echo" in await card.locator("section.reads").inner_text()  # the read that led here
        assert await card.locator(".principal").count() == 0  # no `auth:`: nobody to name as who asked
        assert values(world) == []  # shown, not run
        await card.get_by_role("button", name="Approve: let it run").click()
        result = await call.wait()
        await card.locator(".status.ok").wait_for()
    assert not result.is_error
    assert values(world) == ["buy milk"]
    [verdict] = audit_of(world, "verdict")
    assert verdict["decided_by"] == "console" and verdict["reviewer"] == "console" and verdict["accepted"]
    assert [line["event"] for line in read_audit(world.p.state.audit) if line.get("call") == verdict["call"]] == [
        "held",
        "verdict",
        "forwarded",
    ]


async def test_a_person_denies_with_a_reason_the_agent_hears(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": "rm -rf notes", "intent": "tidy up"})
        card = page.locator("article.call")
        await card.wait_for()
        await card.locator("input[name=reason]").fill("never delete my notes; archive them instead")
        await card.get_by_role("button", name="Deny").click()
        result = await call.wait()
        await card.locator(".status.ok").wait_for()
    assert result.is_error
    assert "never delete my notes; archive them instead" in text_of(result)
    assert values(world) == []
    [verdict] = audit_of(world, "verdict")
    assert verdict["decided_by"] == "console" and not verdict["accepted"]


async def test_a_person_edits_the_arguments_and_the_backend_gets_the_edit(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": "meeting at 10", "intent": "note the meeting"})
        card = page.locator("article.call")
        await card.wait_for()
        await card.get_by_text("Change the arguments, then approve").click()
        # All of it as JSON, still there: a number where the schema wants text is refused.
        await card.get_by_text("Or edit all the arguments as JSON").click()
        editor = card.locator("textarea[name=arguments]")
        assert json.loads(await editor.input_value()) == {"value": "meeting at 10"}
        await editor.fill(json.dumps({"value": 11}))
        await card.get_by_role("button", name="Approve with this JSON").click()
        await card.locator(".status.error").wait_for()
        assert "edit was not applied" in await card.locator(".status").inner_text()
        await editor.fill("{value: 11")  # not JSON: said on the page, nothing sent
        await card.get_by_role("button", name="Approve with this JSON").click()
        await card.locator(".status.error", has_text="Not valid JSON").wait_for()
        assert values(world) == [] and len(world.queue.pending()) == 1
        # The form: one box per argument, text as text (no quotes, no escapes to get right).
        field = card.locator('label.field[data-kind="text"]', has_text="value")
        assert await field.locator("textarea").input_value() == "meeting at 10"
        await field.locator("textarea").fill('meeting at 11, "room 2"\nbring the notes')
        await card.get_by_role("button", name="Approve with these arguments").click()
        result = await call.wait()
    assert not result.is_error
    assert values(world) == ['meeting at 11, "room 2"\nbring the notes']
    [edited] = audit_of(world, "edited")
    [verdict] = audit_of(world, "verdict")
    assert edited["call"] == verdict["call"] and edited["by"] == "console"
    assert edited["original_digest"] != edited["edited_digest"]


async def test_a_long_value_is_folded_never_cut(tmp_path: Path) -> None:
    long = "line of text " * 400
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": long, "intent": "store it"})
        card = page.locator("article.call")
        await card.wait_for()
        fold = card.locator("table.arguments details.fold")
        assert f"{len(long)} characters" in await fold.locator("summary").inner_text()
        await fold.locator("summary").click()
        assert (await fold.locator("pre").inner_text()).strip() == long.strip()
        await card.get_by_role("button", name="Deny").click()
        await call.wait()


async def test_a_page_from_another_origin_cannot_approve(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": "x", "intent": "note x"})
        [item] = await world.held()
        # Another site's page in the same browser (the console's cookie is in it) posts a decision.
        async with serving_hostile_page() as hostile:
            await page.goto(hostile)
            status = await page.evaluate(
                """async ([url, digest]) => {
                    try {
                        const body = JSON.stringify({action: "approve", digest});
                        const r = await fetch(url, {method: "POST", credentials: "include", mode: "no-cors",
                            headers: {"Content-Type": "text/plain"}, body});
                        return r.type;
                    } catch (e) { return "failed: " + e; }
                }""",
                [f"{world.origin}/decide/{item.id}", item.digest],
            )
            assert status  # the request went out (opaque answer) or failed; either way:
        assert world.queue.get(item.id) is item  # still waiting: nothing approved it
        assert values(world) == []
        world.queue.decide(item.id, item.digest, Decision("deny", "test over"))
        await call.wait()
    assert values(world) == []


@asynccontextmanager
async def serving_hostile_page() -> AsyncIterator[str]:
    """A page on another origin (127.0.0.2 is loopback too, but another site)."""
    from starlette.responses import HTMLResponse

    from mcp_spec_proxy.fronts.asgi import serve_asgi

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await HTMLResponse("<h1>a page on another site</h1>")(scope, receive, send)

    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(app, "127.0.0.1", 0, task_status=task_status))
        yield f"http://localhost:{port}/"
        tg.cancel_scope.cancel()


async def test_a_person_allows_calls_like_this_for_the_session(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": "notes/monday.md", "intent": "save the notes"})
        card = page.locator("article.call")
        await card.wait_for()
        await card.get_by_text("Approve, and allow calls like this for the rest of this session").click()
        await card.locator("fieldset.term input[name=pattern]").fill("notes/*.md")
        await card.get_by_role("button", name="Approve and allow matching calls").click()
        assert not (await call.wait()).is_error
        later = await world.p.client.call_tool("toy__record", {"value": "notes/tuesday.md", "intent": "save"})
        assert not later.is_error  # no one was asked
        other = calling(world, "toy__record", {"value": "passwords.txt", "intent": "save"})
        await page.locator("article.call:not(.done)").wait_for()  # outside the rule: it waits on the page
        await page.locator("article.call:not(.done)").get_by_role("button", name="Deny").click()
        assert (await other.wait()).is_error
    assert values(world) == ["notes/monday.md", "notes/tuesday.md"]
    assert [line["decided_by"] for line in audit_of(world, "verdict")] == ["console", "console-rule", "console"]


async def test_an_exact_rule_on_invisible_characters_lets_no_other_path_run(tmp_path: Path) -> None:
    # The agent hides as many zero-width and direction characters in its first path as the
    # traversal it means to send later has characters. The person, seeing one harmless note,
    # allows "exactly this call" for the session without touching the pattern boxes; the later
    # traversal, a line-break variant and a look-alike of the same length must each wait here.
    traversal = "notes/../../../etc/cron.d/ev.md"
    hidden = "notes/" + ("\u200b\u202e" * 20)[: len(traversal) - len("notes/ev.md")] + "ev.md"
    assert len(hidden) == len(traversal)
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": hidden, "intent": "save the notes"})
        card = page.locator("article.call")
        await card.wait_for()
        await card.get_by_text("Approve, and allow calls like this for the rest of this session").click()
        term = card.locator("fieldset.term")
        assert "\\u200b\\u202e" in await term.inner_text()  # the exact value, its invisible characters as escapes
        await card.get_by_role("button", name="Approve and allow matching calls").click()
        assert not (await call.wait()).is_error
        # The page says what the rule admits (once the decision's answer is in: it reads "Sending…" before).
        await card.locator(".status", has_text="is exactly").wait_for()
        again = await world.p.client.call_tool("toy__record", {"value": hidden, "intent": "save"})
        assert not again.is_error  # the very value approved: no one was asked
        newline = "notes/" + "\n" * (len(traversal) - len("notes/ev.md")) + "ev.md"
        lookalike = hidden.replace("\u200b", "x").replace("\u202e", "y")
        for later in (traversal, newline, lookalike):
            other = calling(world, "toy__record", {"value": later, "intent": "save"})
            waiting = page.locator("article.call:not(.done)")
            await waiting.wait_for()  # outside the rule: it waits on the page
            await waiting.get_by_role("button", name="Deny").click()
            assert (await other.wait()).is_error
            await waiting.wait_for(state="detached")
            await page.reload()
    assert values(world) == [hidden, hidden]
    assert [line["decided_by"] for line in audit_of(world, "verdict")] == ["console", "console-rule"] + ["console"] * 3


async def test_the_history_page_gives_a_long_reason_room_to_be_read(tmp_path: Path) -> None:
    # A deny's reason as a person writes it, read in a window half a 1920-px screen wide: the console
    # beside the client whose call it was.
    reason = (
        "the list already says buy milk twice; the user asked for oat milk, not another copy of the same line,"
        " so ask them which one they meant before writing anything to todo.md"
    )
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "buy milk", "intent": "the user asked to note milk"})
        [item] = await world.held()
        world.queue.decide(item.id, item.digest, Decision("deny", reason=reason))
        assert (await call.wait()).is_error
        async with browser_page(world) as page:
            await page.set_viewport_size({"width": 960, "height": 800})
            await page.goto(world.origin + "/history")
            cell = page.locator("table.history tbody tr td.reason")
            assert reason in await cell.inner_text()
            box = await cell.bounding_box()
            line = await cell.evaluate("c => parseFloat(getComputedStyle(c.querySelector('.value')).lineHeight)")
    assert box is not None
    assert box["width"] >= 280, box  # it was 120 px at this width
    assert box["height"] / line <= 8, (box, line)  # 200 characters on a few lines: they took 21


async def test_a_decided_call_folds_below_the_call_still_waiting(tmp_path: Path) -> None:
    # The finding: after a few decisions the card still waiting sat below the decided ones, out of view.
    async with console_world(tmp_path) as world, browser_page(world) as page:
        first = calling(world, "toy__record", {"value": "alpha-note", "intent": "x"})
        decided = page.locator("article.call", has_text="alpha-note")
        await decided.get_by_role("button", name="Approve: let it run").click()
        assert not (await first.wait()).is_error
        await decided.locator(".status.ok").wait_for()
        second = calling(world, "toy__record", {"value": "beta-note", "intent": "x"})
        waiting = page.locator("article.call:not(.done)")
        await waiting.wait_for()
        assert "beta-note" in await waiting.inner_text()
        above, below = await waiting.bounding_box(), await decided.bounding_box()
        assert above is not None and below is not None
        assert above["y"] + above["height"] <= below["y"]  # what waits comes first
        assert await decided.locator("table.arguments").is_hidden()  # the decided one is folded ...
        assert "Approved" in await decided.locator(".status").inner_text()  # ... to its title and outcome
        await decided.locator("h2").click()
        assert await decided.locator("table.arguments").is_visible()  # and opens on a click
        await waiting.get_by_role("button", name="Deny").click()
        assert (await second.wait()).is_error
    assert values(world) == ["alpha-note"]


# Each visual line of an element's text, as the browser laid it out (a character's box starts a new line
# when it sits lower than the one before).
LINES_JS = """el => {
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    const lines = []; let top = null; let node;
    while ((node = walker.nextNode())) {
        for (let i = 0; i < node.data.length; i++) {
            const range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);
            const box = range.getBoundingClientRect();
            if (top === null || box.top > top + 2) { lines.push(""); top = box.top; }
            lines[lines.length - 1] += node.data[i];
        }
    }
    return lines;
}"""


async def test_the_history_page_wraps_tool_names_at_their_separators_never_mid_word(tmp_path: Path) -> None:
    async with console_world(tmp_path, server="notes_filesystem") as world:
        call = calling(world, "notes_filesystem__record", {"value": "x", "intent": "note it"})
        [item] = await world.held()
        world.queue.decide(item.id, item.digest, Decision("approve"))
        assert not (await call.wait()).is_error
        async with browser_page(world) as page:
            await page.set_viewport_size({"width": 420, "height": 800})  # a narrow window beside the client
            await page.goto(world.origin + "/history")
            tool = page.locator("table.history tbody tr td:nth-child(3) code")
            assert (await tool.inner_text()).replace("\n", "") == "notes_filesystem__record"
            lines: list[str] = await tool.evaluate(LINES_JS)
    assert len(lines) > 1, lines  # it had to wrap at this width: the test looks at where
    assert "".join(lines) == "notes_filesystem__record"
    for line in lines[:-1]:
        assert line.endswith(("__", "-", ".", "/", ":")), lines  # it broke as not / es_ / fil / esy …


async def test_the_session_rule_form_reads_at_a_glance_one_row_per_argument(tmp_path: Path) -> None:
    # The finding: the rule form was a paragraph of 150 words before the first choice. A person deciding
    # fast reads one line of what the rule does, then one row per argument with two labelled choices.
    async with console_world(tmp_path) as world, browser_page(world) as page:
        call = calling(world, "toy__record", {"value": "notes/monday.md", "intent": "save the notes"})
        card = page.locator("article.call")
        await card.wait_for()
        await card.get_by_text("Approve, and allow calls like this for the rest of this session").click()
        rule = card.locator("details.rule")
        assert len((await rule.inner_text()).split()) <= 80  # it was 153
        assert await rule.locator("details.help p").is_hidden()  # what a pattern matches: one click away
        [term] = await rule.locator("fieldset.term").all()
        exact = term.get_by_label("exactly")
        pattern = term.get_by_label("text matching the pattern")
        assert await exact.is_checked() and not await pattern.is_checked()  # the safe choice is the default
        await term.locator("input[name=pattern]").fill("notes/*.md")
        assert await pattern.is_checked()  # typing a pattern chooses it
        await rule.get_by_text("What a pattern can match").click()
        assert "there is no" in await rule.locator("details.help p").inner_text()
        await card.get_by_role("button", name="Approve and allow matching calls").click()
        assert not (await call.wait()).is_error
        later = await world.p.client.call_tool("toy__record", {"value": "notes/tuesday.md", "intent": "save"})
        assert not later.is_error  # the pattern chosen on the form is the rule in force
    assert values(world) == ["notes/monday.md", "notes/tuesday.md"]
