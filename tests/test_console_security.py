"""The approval console from outside, with raw HTTP: who may decide, and what a decision can do.

The toy backend's ledger is the ground truth for what ran; the audit log for who decided.
Browser tests of the same page are in test_console.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.fronts.console.pages import card
from mcp_spec_proxy.review import ReviewRequest
from mcp_spec_proxy.review.console import ConsoleQueue, ConsoleReviewer, Decision
from mcp_spec_proxy.review.policy import HumanReviewer
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.console_world import World, another_session, calling, console_world
from tests.harness import ERAS, proxied, recorded, text_of, toy

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def opened(world: World) -> AsyncIterator[httpx.AsyncClient]:
    """A client that opened the console's link: it holds the secret cookie."""
    async with httpx.AsyncClient(base_url=world.origin, follow_redirects=False) as client:
        answer = await client.get(f"/?token={world.secret}")
        assert answer.status_code == 303 and answer.headers["location"] == "/"
        cookie = answer.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        yield client


async def decide(client: httpx.AsyncClient, world: World, item: Any, body: dict[str, Any], **headers: str) -> Any:
    sent = {"origin": world.origin, "content-type": "application/json", **headers}
    return await client.post(f"/decide/{item.id}", content=json.dumps({"digest": item.digest, **body}), headers=sent)


def verdicts(world: World) -> list[dict[str, Any]]:
    return [line for line in read_audit(world.p.state.audit) if line["event"] == "verdict"]


async def test_a_decision_from_another_origin_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "x", "intent": "note x"})
        [item] = await world.held()
        async with opened(world) as client:
            for origin in ("http://evil.example", "null", f"{world.origin}.evil.example", "http://127.0.0.1:1"):
                answer = await decide(client, world, item, {"action": "approve"}, origin=origin)
                assert answer.status_code == 403, origin
            no_origin = await client.post(
                f"/decide/{item.id}",
                content=json.dumps({"digest": item.digest, "action": "approve"}),
                headers={"content-type": "application/json"},
            )
            assert no_origin.status_code == 403
            form = await decide(client, world, item, {"action": "approve"}, **{"content-type": "text/plain"})
            assert form.status_code == 415
            assert world.queue.get(item.id) is item  # still waiting: none of those decided anything
            assert await decide(client, world, item, {"action": "deny", "reason": "no"}) is not None
        result = await call.wait()
    assert result.is_error and recorded(world.ledger) == []


async def test_without_the_secret_the_console_shows_and_decides_nothing(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "x", "intent": "note x"})
        [item] = await world.held()
        async with httpx.AsyncClient(base_url=world.origin) as stranger:
            for path in ("/", "/events", f"/pending/{item.id}", "/history", f"/call/{item.call}", "/leash"):
                answer = await stranger.get(path)
                assert answer.status_code == 403, path
                assert "toy__record" not in answer.text and item.id not in answer.text
            assert (await stranger.get("/?token=wrong")).status_code == 403
            forged = {"cookie": "mcp_spec_proxy_console_1=" + world.secret}  # another port's cookie name
            assert (await stranger.get("/", headers=forged)).status_code == 403
            answer = await decide(stranger, world, item, {"action": "approve"})
            assert answer.status_code == 403
            rebound = await stranger.get(f"/?token={world.secret}", headers={"host": "evil.example"})
            assert rebound.status_code == 421  # DNS rebinding: a foreign name for the loopback address
        assert world.queue.get(item.id) is item
        async with opened(world) as client:
            await decide(client, world, item, {"action": "deny", "reason": "test over"})
        await call.wait()
    assert recorded(world.ledger) == []


@pytest.mark.parametrize("era", ERAS)
async def test_a_replayed_approval_spends_once(tmp_path: Path, era: str) -> None:
    async with console_world(tmp_path, mode=era) as world:
        call = calling(world, "toy__record", {"value": "once", "intent": "note it"})
        [item] = await world.held()
        async with opened(world) as client:
            first = await decide(client, world, item, {"action": "approve"})
            second = await decide(client, world, item, {"action": "approve"})
            result = await call.wait()
            again = await decide(client, world, item, {"action": "approve"})
        assert first.status_code == 200
        assert second.status_code == 409 and again.status_code == 409
        assert not result.is_error
    assert [json.loads(line)["value"] for line in recorded(world.ledger)] == ["once"]
    assert [v["decided_by"] for v in verdicts(world)] == ["console"]


async def test_a_decision_is_bound_to_the_arguments_it_was_shown(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world, another_session(world) as other:
        first = calling(world, "toy__record", {"value": "a", "intent": "note a"})
        [item_a] = await world.held()
        second = calling(world, "toy__record", {"value": "b", "intent": "note b"}, client=other)
        items = await world.held(2)
        item_b = next(item for item in items if item is not item_a)
        async with opened(world) as client:
            # a's id with b's digest: approving what was not shown
            swapped = await client.post(
                f"/decide/{item_a.id}",
                content=json.dumps({"digest": item_b.digest, "action": "approve"}),
                headers={"origin": world.origin, "content-type": "application/json"},
            )
            assert swapped.status_code == 409
            assert (await decide(client, world, item_b, {"action": "approve"})).status_code == 200
            assert (await decide(client, world, item_a, {"action": "deny", "reason": "not a"})).status_code == 200
        assert not (await second.wait()).is_error
        assert "not a" in text_of(await first.wait())
    assert [json.loads(line)["value"] for line in recorded(world.ledger)] == ["b"]


async def test_an_edit_that_breaks_the_schema_is_refused_and_the_call_still_waits(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "x", "intent": "note x"})
        [item] = await world.held()
        async with opened(world) as client:
            for bad in ({"value": 5}, {}, [1], "value=y"):
                answer = await decide(client, world, item, {"action": "edit", "arguments": bad})
                assert answer.status_code == 409, bad
            assert world.queue.get(item.id) is item
            good = await decide(client, world, item, {"action": "edit", "arguments": {"value": "y"}})
            assert good.status_code == 200
        assert not (await call.wait()).is_error
    assert [json.loads(line)["value"] for line in recorded(world.ledger)] == ["y"]
    audit = read_audit(world.p.state.audit)
    [edited] = [line for line in audit if line["event"] == "edited"]
    assert edited["original_digest"] != edited["edited_digest"]


async def test_an_edited_and_approved_call_is_labelled_for_leash_as_it_ran_not_as_it_was_sent(tmp_path: Path) -> None:
    # A person rewrites a harmful call and approves the rewrite: what LEASH learns succeeded is the
    # rewrite. Were it the call as sent, the bank would pass the next copy of the harmful one.
    leash = {"encoder": "hashing", "dim": 64, "bank_dir": str(tmp_path / "banks"), "min_neighbours": 1}
    async with console_world(tmp_path, leash=leash) as world:
        assert world.p.proxy.leash is not None
        labelled: list[list[dict[str, Any]]] = []
        label = world.p.proxy.leash.label_verdict

        async def spy(steps: Sequence[Step], accepted_steps: int, **kwargs: Any) -> None:
            labelled.append([dict(step.arguments) for step in steps])
            await label(steps, accepted_steps, **kwargs)

        world.p.proxy.leash.label_verdict = spy  # type: ignore[method-assign]  # the spy keeps the signature checked
        call = calling(world, "toy__record", {"value": "rm -rf notes", "intent": "clean up"})
        [item] = await world.held()
        async with opened(world) as client:
            edited = await decide(client, world, item, {"action": "edit", "arguments": {"value": "notes/old.md"}})
            assert edited.status_code == 200
        assert not (await call.wait()).is_error
    assert [json.loads(line)["value"] for line in recorded(world.ledger)] == ["notes/old.md"]
    assert labelled and labelled[-1][-1]["value"] == "notes/old.md"
    assert all(step.get("value") != "rm -rf notes" for steps in labelled for step in steps)


async def test_a_session_rule_approves_matching_calls_of_that_session_only(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        call = calling(world, "toy__record", {"value": "notes/a.md", "intent": "note"})
        [item] = await world.held()
        async with opened(world) as client:
            too_narrow = await decide(client, world, item, {"action": "rule", "patterns": {"value": "other/*"}})
            assert too_narrow.status_code == 409
            extra_key = {"value": "notes/*.md", "other": "*"}
            assert (await decide(client, world, item, {"action": "rule", "patterns": extra_key})).status_code == 409
            ruled = await decide(client, world, item, {"action": "rule", "patterns": {"value": "notes/*.md"}})
            assert ruled.status_code == 200
        await call.wait()
        matched = await world.p.client.call_tool("toy__record", {"value": "notes/b.md", "intent": "note"})
        assert not matched.is_error
        outside = calling(world, "toy__record", {"value": "secrets.txt", "intent": "note"})
        [waiting] = await world.held()  # not matched: it waits on the console
        assert waiting.arguments == {"value": "secrets.txt"}
        rules = world.queue.rules()
        assert [rule.session for rule in rules] == [item.session]
        assert not rules[0].matches("another-session", "toy__record", {"value": "notes/b.md"})
        async with opened(world) as client:
            await decide(client, world, waiting, {"action": "deny", "reason": "no"})
        await outside.wait()
    assert [json.loads(line)["value"] for line in recorded(world.ledger)] == ["notes/a.md", "notes/b.md"]
    assert [v["decided_by"] for v in verdicts(world)] == ["console", "console-rule", "console"]


async def test_the_waiting_client_hears_where_the_console_is_but_never_its_key(tmp_path: Path) -> None:
    # The client's text reaches the agent's model; with the key an agent that can send HTTP requests
    # (a shell tool outside the proxy) could approve its own writes.
    async with console_world(tmp_path, {"timeout": 0.5}) as world:
        call = calling(world, "toy__record", {"value": "x", "intent": "note x"}, progress=True)
        result = await call.wait()
    address = world.url.split("?", 1)[0]
    assert result.is_error and recorded(world.ledger) == []
    assert address in text_of(result) and "timed out" in text_of(result) and "console-url" in text_of(result)
    assert call.progress and all(address in message for message in call.progress)
    assert world.secret not in text_of(result) and not any(world.secret in message for message in call.progress)


async def test_without_a_console_a_console_review_refuses_with_a_clear_line(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "human", "fallback": "console"}}
    async with proxied(config, tmp_path / "state", twins=True) as p:  # nothing serves the console
        result = await p.client.call_tool("toy__record", {"value": "x", "intent": "note x"})
    assert result.is_error and recorded(ledger) == []
    assert "no approval console is being served" in text_of(result)


async def test_human_review_falls_back_to_the_console_for_a_client_that_cannot_ask(tmp_path: Path) -> None:
    async with console_world(tmp_path, {"default": "human", "fallback": "console"}) as world:
        call = calling(world, "toy__record", {"value": "x", "intent": "note x"})
        [item] = await world.held()
        async with opened(world) as client:
            page = await client.get("/")
            assert "toy__record" in page.text and "note x" in page.text
            assert "access-control-allow-origin" not in page.headers
            assert page.headers["x-frame-options"] == "DENY"
            await decide(client, world, item, {"action": "approve"})
            assert not (await call.wait()).is_error
            history = await client.get("/history?reviewer=console")
            story = await client.get(f"/call/{item.call}")
    assert [v["decided_by"] for v in verdicts(world)] == ["human→console"]
    assert "toy__<wbr>record" in history.text  # a name wraps at its separators only
    assert "held" in story.text and "verdict" in story.text


async def test_console_verdicts_label_leash_steps_and_the_card_shows_the_score(tmp_path: Path) -> None:
    leash = {"encoder": "hashing", "dim": 64, "bank_dir": str(tmp_path / "banks"), "min_neighbours": 1}
    async with console_world(tmp_path, leash=leash) as world:
        assert world.p.proxy.leash is not None
        steps = world.p.proxy.leash.steps
        before = steps.stats()["count"]
        first = calling(world, "toy__record", {"value": "a", "intent": "note a"})
        [item] = await world.held()
        async with opened(world) as client:
            await decide(client, world, item, {"action": "deny", "reason": "not that"})
            await first.wait()
            assert steps.stats()["failures"] == 1 and steps.stats()["count"] == before + 1
            second = calling(world, "toy__record", {"value": "a", "intent": "note a"})
            [again] = await world.held()
            assert again.leash is not None and again.leash["score"] == 1.0  # its one neighbour was refused
            card = (await client.get(f"/pending/{again.id}")).text
            assert "LEASH" in card and "1.00" in card
            await decide(client, world, again, {"action": "approve"})
            await second.wait()
            plot = (await client.get("/leash")).text
        assert steps.stats()["successes"] == 1
    # The first verdict had no neighbours to score it; the second, scored 1.0, was accepted.
    assert (
        "<svg" in plot and "score 1.0 to 1.0: 0 of 1 refused" not in plot and "score 0.9 to 1.0: 0 of 1 refused" in plot
    )


async def test_the_console_shows_what_the_strong_model_said_before_it_sent_the_call_here() -> None:
    class CannotAsk:
        async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
            return None

    queue = ConsoleQueue(60)
    queue.url = "http://127.0.0.1:1/?token=t"
    human = HumanReviewer(ConsoleReviewer(queue))
    schema = {"type": "object", "properties": {"value": {"type": "string"}}}
    definition = types.Tool(name="toy__record", input_schema=schema)
    tool = CatalogTool("toy__record", "toy", "record", definition, "write", "default", "unannotated", None, None,
                       "f", False)  # fmt: skip
    segment = Segment((Step(tool.name, {"value": "x"}, "write"),))
    request = ReviewRequest("s1", tool, {"value": "x"}, "note x", segment, History(), call="c1")
    async with anyio.create_task_group() as tg:
        verdicts_seen: list[Any] = []

        ruled = anyio.Event()

        async def plain() -> None:
            verdicts_seen.append(await human.review(request, CannotAsk()))
            ruled.set()

        tg.start_soon(plain)  # first a call the person approves with a rule covering any value
        with anyio.fail_after(10):
            while not queue.pending():
                await queue.changed_since(queue.version)
        [first] = queue.pending()
        queue.decide(first.id, first.digest, Decision("rule", patterns={"value": "*"}))
        with anyio.fail_after(10):
            await ruled.wait()

        async def review() -> None:
            why = "the strong reviewer rejected it: the user never asked for x"
            verdicts_seen.append(await human.review(request, CannotAsk(), context=why))

        tg.start_soon(review)
        with anyio.fail_after(10):
            while not queue.pending():
                await queue.changed_since(queue.version)
        [item] = queue.pending()
        assert "the user never asked for x" in item.context and item.call == "c1"
        assert "What the reviewing model said" in card(item)
        queue.decide(item.id, item.digest, Decision("approve"))
    by_rule, verdict = verdicts_seen
    assert by_rule.accepted and by_rule.reviewer == "human→console"
    # The rule covered the call, but the strong model had rejected it: the person decided it.
    assert verdict.accepted and verdict.reviewer == "human→console"
