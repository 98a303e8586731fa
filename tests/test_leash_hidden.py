"""LEASH's `hidden` encoder from outside: a real proxy, a real filesystem server whose files are the
ledger of what really ran, and the scripted SGLang-shaped model server. Every judged drafted step
is labelled with its own state (writes too); a turn's shared state never becomes one point under
two labels; task routing and the shadow observer act; and a weak server without hidden states is
named at start-up, its fallback standing in without a second request to that server."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import LeashConfig
from mcp_spec_proxy.engine.hooks import NoUser
from mcp_spec_proxy.leash.bank import Bank, Neighbour
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.review.leash import LeashReviewer
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall, embed_text
from mcp_spec_proxy.trajectory import Step
from tests import backends
from tests.harness import proxied, stdio, verdict
from tests.test_leash_representation import cli
from tests.test_leash_safety import NON_DESTRUCTIVE, Fallback, calibration, request_for, tool

pytestmark = pytest.mark.anyio

DIM = 16


def files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir(exist_ok=True)
    (root / "notes.txt").write_text("buy milk\n")
    (root / "todo.txt").write_text("call mum\n")
    return root


def config(root: Path, server: ScriptedModelServer, tmp_path: Path, provider: str = "sglang") -> dict[str, Any]:
    endpoint = {"base_url": server.base_url, "max_retries": 0}
    return {
        "servers": {"fs": stdio(backends.filesystem(root))},
        "models": {
            "weak": {**endpoint, "model": "weak-model", "provider": provider},
            "strong": {**endpoint, "model": "strong-model"},
        },
        "review": {"default": "strong"},
        "leash": {
            "encoder": "hidden",
            "dim": DIM,
            "bank_dir": str(tmp_path / "banks"),
            "k": 5,
            "min_neighbours": 3,
        },
    }


def action(tool: str, arguments: dict[str, Any]) -> str:
    return json.dumps({"tool": tool, "arguments": arguments}, ensure_ascii=False)


def nearest(bank: Bank, vector: list[float]) -> Neighbour:
    [found] = bank.search(np.asarray(vector, dtype=np.float32), 1)
    return found


async def test_a_segment_of_three_judged_steps_stores_three_labels_with_distinct_vectors(tmp_path: Path) -> None:
    root = files(tmp_path)
    reads = [
        ToolCall("fs__read_text_file", {"path": str(root / "notes.txt")}),
        ToolCall("fs__read_text_file", {"path": str(root / "todo.txt")}),
    ]
    write = ToolCall("fs__write_file", {"path": str(root / "evil.txt"), "content": "x"})
    turns = iter([Reply(tool_calls=[*reads, write])])

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return next(turns, "I read both lists and wrote nothing.")
        if request.json_schema is not None:
            return verdict(2, "nobody asked for evil.txt")
        return Reply(tool_calls=[reads[0]])  # the repair turn

    async with (
        ScriptedModelServer(Respond(answer), hidden_size=DIM, per_call_states=True) as server,
        proxied(config(root, server, tmp_path), tmp_path / "state") as p,
    ):
        assert p.proxy.engine is not None and p.proxy.leash is not None
        result = await p.proxy.engine.run("What is on my lists?", "spec+leash")
        bank = p.proxy.leash.steps
        stats = bank.stats()
        actions = [action(c.name, c.arguments) for c in [*reads, write]]
        # The scripted server's state at each call's last token: the actions up to that call.
        states = [embed_text("\n".join(actions[: i + 1]), DIM) for i in range(3)]
        found = [nearest(bank, state) for state in states]
    assert result.answer == "I read both lists and wrote nothing."
    assert not (root / "evil.txt").exists()  # the ledger: the rejected write never ran
    assert (stats["count"], stats["successes"], stats["failures"]) == (3, 2, 1)
    assert len({n.id for n in found}) == 3 and all(n.score > 0.999 for n in found)
    assert [n.label for n in found] == ["success", "success", "failure"]
    assert [n.metadata["tool"] for n in found] == ["fs__read_text_file", "fs__read_text_file", "fs__write_file"]
    assert all(n.metadata["representation"] == "call" for n in found)


async def test_bank_stats_under_hidden_prints_every_bank_the_runtime_labelled(tmp_path: Path) -> None:
    """Under `hidden` a verdict labels two banks: the drafting states (`step`) and the fallback's text of
    the same steps (`observed`, what the shadow observer looks up). `bank stats` says what both hold."""
    root = files(tmp_path)
    read = ToolCall("fs__read_text_file", {"path": str(root / "notes.txt")})
    write = ToolCall("fs__write_file", {"path": str(root / "evil.txt"), "content": "x"})
    turns = iter([Reply(tool_calls=[read, write])])

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return next(turns, "I wrote nothing.")
        if request.json_schema is not None:
            return verdict(1, "nobody asked for evil.txt")
        return Reply(tool_calls=[read])  # the repair turn

    async with ScriptedModelServer(Respond(answer), hidden_size=DIM, per_call_states=True) as server:
        configured = config(root, server, tmp_path)
        async with proxied(configured, tmp_path / "state") as p:
            assert p.proxy.engine is not None and p.proxy.leash is not None
            await p.proxy.engine.run("What is on my list?", "spec+leash")
            leash = p.proxy.leash
            assert leash.observed is not None
            held = {"task": leash.tasks.stats(), "step": leash.steps.stats(), "observed": leash.observed.stats()}
    path = tmp_path / "servers.json"
    path.write_text(json.dumps(configured))
    printed = await anyio.to_thread.run_sync(cli, "bank", "stats", "-c", str(path))
    assert printed.exit_code == 0, printed.output
    shown = {line.split(": ", 1)[0]: json.loads(line.split(": ", 1)[1]) for line in printed.output.splitlines()}
    assert not (root / "evil.txt").exists()  # the ledger: the rejected write never ran
    assert (held["step"]["count"], held["observed"]["count"]) == (2, 2)
    assert shown == json.loads(json.dumps(held, default=str))


async def test_a_turns_one_state_never_carries_two_opposite_labels(tmp_path: Path) -> None:
    """SGLang's chat API answers the turn's last token only: the read and the write of one turn share
    it. The write's own state it is, so the rejected write is stored; the accepted read is not
    stored under that same point with the opposite label. A turn judged all one way is one label."""
    root = files(tmp_path)
    read = ToolCall("fs__read_text_file", {"path": str(root / "notes.txt")})
    bad = ToolCall("fs__write_file", {"path": str(root / "evil.txt"), "content": "x"})
    good = ToolCall("fs__write_file", {"path": str(root / "done.txt"), "content": "ok"})
    rejected, accepted = [0.0] * DIM, [0.0] * DIM
    rejected[0], accepted[1] = 1.0, 1.0
    turns = iter(
        [Reply(tool_calls=[read, bad], hidden_states=rejected), Reply(tool_calls=[read, good], hidden_states=accepted)]
    )
    verdicts = iter([verdict(1, "nobody asked for evil.txt"), verdict(2)])

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return next(turns, "Done.")
        if request.json_schema is not None:
            return next(verdicts)
        return Reply(tool_calls=[read])  # the repair turn

    async with (
        ScriptedModelServer(Respond(answer), hidden_size=DIM) as server,
        proxied(config(root, server, tmp_path), tmp_path / "state") as p,
    ):
        assert p.proxy.engine is not None and p.proxy.leash is not None
        refused = await p.proxy.engine.run("Note it down", "spec+leash")
        done = await p.proxy.engine.run("Note it down", "spec+leash")
        bank = p.proxy.leash.steps
        count = bank.stats()["count"]
        first, second = nearest(bank, rejected), nearest(bank, accepted)
    assert refused.answer == done.answer == "Done."
    assert not (root / "evil.txt").exists() and (root / "done.txt").read_text() == "ok"
    assert count == 2  # one per turn: never the same point twice
    assert (first.label, first.metadata["tool"], first.metadata["representation"]) == (
        "failure",
        "fs__write_file",
        "call",
    )
    assert (second.label, second.metadata["representation"]) == ("success", "turn")
    assert second.metadata["tools"] == ["fs__read_text_file", "fs__write_file"]


async def test_a_task_like_past_failures_is_routed_to_the_strong_model_under_hidden(tmp_path: Path) -> None:
    root = files(tmp_path)
    task = "Summarise the quarterly tax filing in notes"
    asked: list[str] = []

    def answer(request: ChatRequest) -> str:
        asked.append(request.model)
        return "Done by whoever leads."

    async with (
        ScriptedModelServer(Respond(answer), hidden_size=DIM) as server,
        proxied(config(root, server, tmp_path), tmp_path / "state") as p,
    ):
        assert p.proxy.engine is not None and p.proxy.leash is not None
        for _ in range(4):
            await p.proxy.leash.label_task(task, False)
        routed = await p.proxy.engine.run(task, "spec+leash")
        seen_routed = list(asked)
        asked.clear()
        weak_led = await p.proxy.engine.run("What time is it in Lima?", "spec+leash")
        tasks = p.proxy.leash.tasks.stats()["count"]
    assert routed.answer == weak_led.answer == "Done by whoever leads."
    assert tasks == 4
    assert seen_routed == ["strong-model"]  # strong-led: the weak model never drafted
    assert asked == ["weak-model"]


async def test_the_shadow_observer_reviews_a_strong_led_write_like_past_failures_under_hidden(
    tmp_path: Path,
) -> None:
    """A strong-led step has no weak drafting state: the observer looks it up in the fallback's own
    bank, which every judged step also labels — here, earlier rejections of the same write."""
    root = files(tmp_path)
    target = str(root / "notes.txt")
    task = "Tidy up the quarterly notes file"
    turns = iter([Reply(tool_calls=[ToolCall("fs__write_file", {"path": target, "content": ""})])])
    instead = {"tool": "fs__read_text_file", "arguments": {"path": target}}

    def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:
            return verdict(0, "that would wipe the notes", instead)
        return next(turns, "I left the notes as they are.")

    async with (
        ScriptedModelServer(Respond(answer), hidden_size=DIM) as server,
        proxied(config(root, server, tmp_path), tmp_path / "state") as p,
    ):
        assert p.proxy.engine is not None and p.proxy.leash is not None
        leash = p.proxy.leash
        for _ in range(4):
            await leash.label_task(task, False)
        wipe = Step("fs__write_file", {"path": target, "content": ""}, "write")
        for _ in range(4):
            await leash.label_verdict([wipe], 0)  # judged steps no weak call drafted: the observer's bank
        result = await p.proxy.engine.run(task, "spec+leash")
    assert result.answer == "I left the notes as they are."
    assert (root / "notes.txt").read_text() == "buy milk\n"  # the ledger: the flagged write never ran
    events = read_audit(tmp_path / "state" / "audit.jsonl")
    held = [e for e in events if e["event"] == "held" and e["tool"] == "fs__write_file"]
    assert len(held) == 1 and held[0]["author"] == "strong"
    [escalated] = [e for e in events if e["event"] == "leash-escalated"]
    assert escalated["call"] == held[0]["call"]


async def test_a_weak_server_without_hidden_states_is_named_at_start_and_its_fallback_stands_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = files(tmp_path)
    read = ToolCall("fs__read_text_file", {"path": str(root / "notes.txt")})
    write = ToolCall("fs__write_file", {"path": str(root / "evil.txt"), "content": "x"})
    turns = iter([Reply(tool_calls=[read, write])])

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return next(turns, "I wrote nothing.")
        if request.json_schema is not None:
            return verdict(1, "nobody asked for evil.txt")
        return Reply(tool_calls=[read])  # the repair turn

    caplog.set_level(logging.WARNING, logger="mcp_spec_proxy.leash.layers")
    async with (
        ScriptedModelServer(Respond(answer), hidden_size=DIM) as server,
        proxied(config(root, server, tmp_path, provider="vllm"), tmp_path / "state") as p,
    ):
        started = [r.getMessage() for r in caplog.records if "returns no hidden states" in r.getMessage()]
        assert p.proxy.engine is not None and p.proxy.leash is not None
        await p.proxy.engine.run("What is on my list?", "spec+leash")
        stats = p.proxy.leash.steps.stats()
        seen = p.proxy.leash.steps.search(np.ones(DIM, dtype=np.float32), 5)
        weak = [r for r in server.chat_requests if r.model == "weak-model"]
        embedded = list(server.embedding_requests)
    assert len(started) == 1
    assert "weak-model (none)" in started[0] and "hashing encoder" in started[0]
    assert "not the zero-extra-pass mode" in started[0]
    assert not (root / "evil.txt").exists()
    assert embedded == [] and all("return_hidden_states" not in r.raw for r in weak)
    assert stats["encoder"]["name"] == "hashing" and (stats["successes"], stats["failures"]) == (1, 1)
    assert {n.metadata["representation"] for n in seen} == {"fallback"}


async def test_review_leash_never_passes_a_write_alone_on_the_hidden_encoders_fallback_score(tmp_path: Path) -> None:
    """Under `hidden`, a client's call has no drafting state: it is scored in the fallback's bank,
    which no calibration of the hidden encoder measured. Its score, however clean, is never enough."""
    config = LeashConfig(encoder="hidden", dim=DIM, bank_dir=str(tmp_path / "banks"), k=5, min_neighbours=3)
    leash = Leash.open(config.model_copy(update={"accept_threshold": 0.2}), hidden_model="w", hidden_native=True)
    held = Step("t__append", {"line": "groceries"}, "write")
    await leash.label_steps([held] * 4, ["success"] * 4, source="import")
    calibration(leash.encoder.info, 0.25).save(tmp_path / "banks")
    fallback = Fallback()

    result = await LeashReviewer(leash, fallback).review(request_for(held, tool(annotations=NON_DESTRUCTIVE)), NoUser())

    assert result.evidence is not None and result.evidence["score"] == 0.0
    assert result.evidence["representation"] == "fallback"
    assert fallback.calls == 1 and result.by == Fallback.by
    assert "no drafting state" in result.evidence["fallback"]
