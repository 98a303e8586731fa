"""Session rules on the approval console, attacked by the agent they are meant to restrain.

The agent chooses the first call the person sees and every later one: it hides invisible and
direction characters in the first, then tries traversals, line breaks, separators, encoded dots
and look-alikes against the rule the person set. The toy backend's ledger says what ran; each
later call either waited for the person (who denies it here) or ran without asking.
What a rule admits is promised in `review/rules.py`; the browser test of the same attack is in
test_console.py.
"""

from __future__ import annotations

import json
from html import unescape
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_spec_proxy.review.rules import admits
from tests.console_world import World, calling, console_world
from tests.harness import text_of
from tests.test_console_attacks import audit_of, decide, opened, parsed, settle, values

pytestmark = pytest.mark.anyio

TRAVERSAL = "notes/../../../etc/cron.d/ev.md"
HIDDEN = "notes/" + ("\u200b\u202e\u2066" * 10)[: len(TRAVERSAL) - len("notes/ev.md")] + "ev.md"


async def asked(world: World, value: Any, **more: Any) -> str:
    """How a call of `toy__record` with `value` ended: `asked` (the person, who denies it here), `ran`
    without asking, or `refused` without asking (its arguments, say)."""
    call = calling(world, "toy__record", {"value": value, **more, "intent": "note"})
    waiting: list[Any] = []
    async with anyio.create_task_group() as tg:

        async def held() -> None:
            waiting.extend(await world.held())
            tg.cancel_scope.cancel()

        async def done() -> None:
            await call.done.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(held)
        tg.start_soon(done)
    if not waiting:
        return "refused" if (await call.wait()).is_error else "ran"
    [item] = waiting
    await settle(world, item, call)
    return "asked"


async def ruled(world: World, value: Any, patterns: dict[str, str | None], **more: Any) -> str:
    """The first call, approved on the page with a rule made of `patterns`; the page's answer."""
    call = calling(world, "toy__record", {"value": value, **more, "intent": "note"})
    [item] = await world.held()
    async with opened(world) as client:
        answer = await decide(client, world, item, {"action": "rule", "patterns": patterns})
    assert answer.status_code == 200, answer.text
    assert not (await call.wait()).is_error
    message: str = answer.json()["message"]
    return message


async def test_an_exact_rule_admits_the_value_held_and_nothing_built_from_how_it_looked(tmp_path: Path) -> None:
    # Before, each invisible character became `?` in the "exact" pattern: one per character of
    # the traversal the agent meant to send next.
    assert len(HIDDEN) == len(TRAVERSAL)
    hostile: list[dict[str, Any]] = [
        {"value": TRAVERSAL, "n": 1},
        {"value": "notes/" + "\n" * (len(TRAVERSAL) - len("notes/ev.md")) + "ev.md", "n": 1},
        {"value": HIDDEN.replace("\u200b", "x"), "n": 1},
        {"value": HIDDEN.replace("\u202e", "/"), "n": 1},
        {"value": HIDDEN[:-1] + "d\u0000", "n": 1},
        # The same value in another kind: 1 is neither true, 1.0, "1" nor [1].
        *({"value": HIDDEN, "n": n} for n in (True, 1.0, "1", [1])),
    ]
    async with console_world(tmp_path) as world:
        message = await ruled(world, HIDDEN, {"value": None, "n": None}, n=1)
        assert "is exactly" in message and "\\u200b\\u202e\\u2066" in message  # shown as escapes, never obeyed
        assert not any(char in message for char in "\u200b\u202e\u2066")
        ends = [await asked(world, **arguments) for arguments in hostile]
        assert await asked(world, HIDDEN, n=1) == "ran"  # the very value approved: it runs without asking
    assert ends == ["asked"] * len(hostile)
    assert values(world) == [HIDDEN, HIDDEN]
    assert [v["decided_by"] for v in audit_of(world, "verdict")][-1] == "console-rule"


async def test_a_path_pattern_admits_one_segment_of_plain_text_and_no_traversal(tmp_path: Path) -> None:
    # `notes/*` as a person means it: a file directly in notes/, never out of it, never through
    # a separator, a line break, an encoded or look-alike dot, or a character that shows nothing.
    hostile = [
        TRAVERSAL,
        "notes/..",
        "notes/.",
        "notes/. .",
        "notes/...",
        "notes/",
        "notes/a/b.md",
        "notes/..\\..\\etc\\cron.d\\ev.md",
        "notes/ev.md\n* * * * * root sh /tmp/x",
        "notes/ev\x00.md",
        "notes/ev\t.md",
        "notes/ev\u202edm.exe",
        "notes/ev\u200b.md",
        "notes/%2e%2e",
        "notes/%252e%252e",
        "notes/%c0%ae%c0%ae",
        "notes/..%2fetc%2fpasswd",
        "notes/\uff0e\uff0e",
        "notes/x\uff0fy",
        "notes/" + "a" * 5000,
    ]
    async with console_world(tmp_path) as world:
        message = await ruled(world, "notes/a.md", {"value": "notes/*"})
        assert 'matches the pattern "notes/*"' in message
        ends = [await asked(world, value) for value in hostile]
        assert await asked(world, "notes/b.md") == "ran"
        assert await asked(world, "notes/..b.md") == "ran"  # dots inside a name are a name
    assert dict(zip(hostile, ends, strict=True)) == dict.fromkeys(hostile, "asked")
    assert values(world) == ["notes/a.md", "notes/b.md", "notes/..b.md"]


async def test_patterns_that_would_admit_more_than_they_say_are_refused_with_a_line(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "notes/a.md", "n": 5, "intent": "note"})
        [item] = await world.held()
        refused = {
            "**": {"value": "notes/**", "n": None},
            "invisible": {"value": "notes/\u200b*", "n": None},
            "dot segment": {"value": "notes/../*", "n": None},
            "not text": {"value": "notes/*", "n": "*"},
            "no term": {"value": "notes/*"},
            "neither": {"value": "notes/*", "n": 5},
        }
        async with opened(world) as client:
            answers = {name: await decide(client, world, item, {"action": "rule", "patterns": patterns})
                       for name, patterns in refused.items()}  # fmt: skip
        assert world.queue.get(item.id) is item and world.queue.rules() == []  # still waiting, no rule made
        await settle(world, item, call)
    for name, answer in answers.items():
        assert answer.status_code == 409, name
        error = answer.json()["error"]
        assert "\n" not in error and "Traceback" not in answer.text, name
    assert "no ** here" in answers["**"].json()["error"]
    assert "only exactly" in answers["not text"].json()["error"]
    assert values(world) == []


async def test_the_page_offers_no_pattern_where_none_could_admit_the_value_and_says_why(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        arguments = {"value": "notes/../x", "hidden": "a\u200bb", "n": 7, "plain": "notes/a.md"}
        call = calling(world, "toy__record", {**arguments, "intent": "note"})
        [item] = await world.held()
        async with opened(world) as client:
            card = (await client.get(f"/pending/{item.id}")).text
            rule = {"action": "rule", "patterns": {**dict.fromkeys(arguments), "plain": "notes/*"}}
            ruled = await decide(client, world, item, rule)
            assert ruled.status_code == 200, ruled.text
            await call.wait()
            index = (await client.get("/")).text
    markup = parsed(card)
    terms = [json.loads(attrs["data-key"] or "") for tag, attrs in markup.tags if tag == "fieldset"]
    assert terms == list(arguments)
    boxes = [tag for tag, attrs in markup.tags if tag == "input" and attrs.get("name") == "pattern"]
    assert len(boxes) == 1  # only "plain" can take a pattern
    assert card.count("Only this exact value can be allowed") == 3
    assert "\u200b" not in card and "\u200b" not in index
    # The rule in force, on the page, written as exactly what it admits.
    shown = unescape(index)
    assert '"hidden" is exactly "a\\u200bb"' in shown and '"plain" matches the pattern "notes/*"' in shown


def test_pattern_matching_stays_within_a_segment_and_refuses_hidden_traversal() -> None:
    table = {
        ("notes/*", "notes/a.md"): True,
        ("notes/*.md", "notes/.md"): True,
        ("report*.md", "report.md"): True,
        ("a?c", "abc"): True,
        ("https://example.com/*", "https://example.com/page"): True,
        ("notes/a%20*", "notes/a%20b"): True,
        ("*/*", "/etc"): False,  # a wildcard's segment is never empty
        ("*", ""): False,
        ("a?c", "a/c"): False,
        ("a?c", "a\\c"): False,
        ("notes/*", "notes\\a"): False,  # the separators must be the ones the pattern wrote
        ("notes/*", "notes/\ud800"): False,
        ("*a*a*a*a*a*a*a*b", "a" * 4096): False,  # and quickly: no backtracking blow-up
    }
    assert {case: admits(*case) for case in table} == table


async def test_a_huge_integer_in_a_decision_or_an_edit_is_refused_with_one_line_and_the_call_stays_decidable(
    tmp_path: Path,
) -> None:
    # Python reads no integer past 4,300 digits from text: that was a 500 with a traceback. The
    # largest integer the wire admits must still show on the page, edit and run, every digit kept.
    largest = int("7" * 4300)
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "x", "n": largest, "intent": "note"})
        [item] = await world.held()
        huge = "1" * 5000
        async with opened(world) as client:
            headers = {"origin": world.origin, "content-type": "application/json"}
            bodies = {
                "reason": f'{{"digest": "{item.digest}", "action": "deny", "reason": {huge}}}',
                "arguments": f'{{"digest": "{item.digest}", "action": "edit", "arguments": {{"n": {huge}}}}}',
                "patterns": f'{{"digest": "{item.digest}", "action": "rule", "patterns": {{"value": {huge}}}}}',
            }
            answers = {
                name: await client.post(f"/decide/{item.id}", content=body, headers=headers)
                for name, body in bodies.items()
            }
            edit_text = json.dumps({"value": "x", "n": 0})[:-1] + f', "m": {huge}}}'
            answers["edit text"] = await decide(client, world, item, {"action": "edit", "arguments": edit_text})
            card = await client.get(f"/pending/{item.id}")
            assert world.queue.get(item.id) is item  # nothing was decided by any of them
            edit = json.dumps({"value": "y"})[:-1] + f', "n": {"9" * 4300}}}'
            edited = await decide(client, world, item, {"action": "edit", "arguments": edit})
        result = await call.wait()
    for name, answer in answers.items():
        assert answer.status_code in (400, 409), (name, answer.status_code)
        error = answer.json()["error"]
        assert "\n" not in error and "Traceback" not in answer.text and "4300 digits" in error, name
        assert "set_int_max_str_digits" not in error, name  # a setting of Python, not something a person can change
    assert card.status_code == 200 and str(largest)[:200] in card.text
    assert edited.status_code == 200 and not result.is_error, text_of(result)
    assert values(world) == ["y"]
    assert audit_of(world, "edited") and json.loads(world.ledger.read_text())["n"] == int("9" * 4300)
