"""LEASH's decisions follow the banks: routing, step escalation, the shadow observer, `review: leash`,
and the labels that verdicts and outcome reports add. Fixed encoder (hashing), real proxy, real
filesystem server, scripted models."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import LeashConfig
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.leash.storage import Label
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from mcp_spec_proxy.trajectory import Step
from tests import backends
from tests.harness import proxied, segment_length, stdio, text_of, verdict

pytestmark = pytest.mark.anyio


def leash_config(tmp_path: Path, **thresholds: Any) -> dict[str, Any]:
    return {
        "encoder": "hashing",
        "dim": 512,
        "bank_dir": str(tmp_path / "banks"),
        "k": 5,
        "min_neighbours": 3,
        **thresholds,
    }


async def seed_steps(tmp_path: Path, steps: list[Step], label: Label, **thresholds: Any) -> None:
    leash = Leash.open(LeashConfig.model_validate(leash_config(tmp_path, **thresholds)))
    await leash.label_steps(steps, [label] * len(steps), source="import")


async def seed_tasks(tmp_path: Path, tasks: list[str], success: bool) -> None:
    leash = Leash.open(LeashConfig.model_validate(leash_config(tmp_path)))
    for task in tasks:
        await leash.label_task(task, success, source="import")


def world(root: Path, server: ScriptedModelServer, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    endpoint = {"base_url": server.base_url, "max_retries": 0}
    return {
        "servers": {"fs": stdio(backends.filesystem(root))},
        "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
        "leash": leash_config(tmp_path, **extra.pop("leash", {})),
        **extra,
    }


def files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    root.mkdir(exist_ok=True)
    (root / "notes.txt").write_text("buy milk\n")
    (root / "secret.txt").write_text("do not read\n")
    return root


async def test_a_task_whose_neighbours_failed_is_routed_to_the_strong_model(tmp_path: Path) -> None:
    root = files(tmp_path)
    await seed_tasks(tmp_path, ["Summarise the quarterly tax filing in notes"] * 4, success=False)
    seen: list[str] = []

    def answer(request: ChatRequest) -> Reply | str:
        seen.append(request.model)
        return "Done by whoever leads."

    async with (
        ScriptedModelServer(Respond(answer)) as server,
        proxied(world(root, server, tmp_path), tmp_path / "state") as p,
    ):
        assert p.proxy.engine is not None
        routed = await p.proxy.engine.run("Summarise the quarterly tax filing in notes", "spec+leash")
        seen_routed = list(seen)
        seen.clear()
        weak_led = await p.proxy.engine.run("What time is it in Lima?", "spec+leash")
    assert routed.answer == weak_led.answer == "Done by whoever leads."
    assert seen_routed == ["strong-model"]  # strong-led: the weak model never drafted
    assert seen == ["weak-model"]


async def test_a_drafted_read_like_past_rejected_steps_ends_the_draft_for_verification(tmp_path: Path) -> None:
    root = files(tmp_path)
    risky = Step("fs__read_text_file", {"path": str(root / "secret.txt")}, "read")
    await seed_steps(tmp_path, [risky] * 4, "failure")
    drafts: Iterator[Reply | str] = iter(
        [Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": str(root / "secret.txt")})]), "ok"]
    )
    segments: list[int] = []

    def answer(request: ChatRequest) -> Reply | str:
        if request.model == "weak-model":
            return next(drafts)
        if request.json_schema is not None:
            segments.append(segment_length(request))
            return verdict(0, "that file is not the user's")
        return Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": str(root / "notes.txt")})])

    async with (
        ScriptedModelServer(Respond(answer)) as server,
        proxied(world(root, server, tmp_path), tmp_path / "state") as p,
    ):
        assert p.proxy.engine is not None
        result = await p.proxy.engine.run("What is on my list?", "spec+leash")
        assert p.proxy.leash is not None
        failures = p.proxy.leash.steps.stats()["failures"]
    assert segments == [1]  # the flagged read was held alone and verified before it ran
    assert [s.arguments["path"] for s in result.steps] == [str(root / "notes.txt")]  # the repair ran instead
    assert failures == 5  # the verdict labelled the rejected read a failure, for free


async def test_an_unreviewed_write_that_looks_like_past_failures_is_reviewed_after_all(tmp_path: Path) -> None:
    root = files(tmp_path)
    target = str(root / "notes.txt")
    await seed_steps(tmp_path, [Step("fs__write_file", {"path": target, "content": ""}, "write")] * 4, "failure")
    asked: list[str] = []

    def answer(request: ChatRequest) -> str:
        asked.append(request.model)
        return verdict(segment_length(request) - 1, "that would wipe the notes")

    async with ScriptedModelServer(Respond(answer)) as server:
        cfg = world(root, server, tmp_path, review={"default": "allow"})
        async with proxied(cfg, tmp_path / "state") as p:
            flagged = await p.client.call_tool("fs__write_file", {"path": target, "content": "", "intent": "x"})
            other = await p.client.call_tool("fs__create_directory", {"path": str(root / "new"), "intent": "x"})
    assert flagged.is_error and "that would wipe the notes" in text_of(flagged)
    assert (root / "notes.txt").read_text() == "buy milk\n"
    assert not other.is_error and (root / "new").is_dir()
    assert asked == ["strong-model"]  # only the flagged write cost a model call
    events = read_audit(tmp_path / "state" / "audit.jsonl")
    escalated = [e for e in events if e["event"] == "leash-escalated"]
    assert len(escalated) == 1 and escalated[0]["score"] >= 0.6 and escalated[0]["neighbours"]


async def test_a_strong_led_step_that_looks_like_past_failures_is_reviewed_and_audited_as_escalated(
    tmp_path: Path,
) -> None:
    """The engine's shadow observer: a strong-led write (which `strong` would let stand unreviewed,
    the strong model wrote it) that looks like past failures goes to the reviewer after all, and the
    gate audits that as `leash-escalated` on the call's own id, as it does at the MCP front."""
    root = files(tmp_path)
    target = str(root / "notes.txt")
    task = "Tidy up the quarterly notes file"
    await seed_tasks(tmp_path, [task] * 4, success=False)
    await seed_steps(tmp_path, [Step("fs__write_file", {"path": target, "content": ""}, "write")] * 4, "failure")
    turns = iter([Reply(tool_calls=[ToolCall("fs__write_file", {"path": target, "content": ""})])])
    instead = {"tool": "fs__read_text_file", "arguments": {"path": target}}

    def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:
            return verdict(0, "that would wipe the notes", instead)
        return next(turns, "I left the notes as they are.")

    async with ScriptedModelServer(Respond(answer)) as server:
        cfg = world(root, server, tmp_path, review={"default": "strong"})
        async with proxied(cfg, tmp_path / "state") as p:
            assert p.proxy.engine is not None
            result = await p.proxy.engine.run(task, "spec+leash")
    assert result.answer == "I left the notes as they are."
    assert (root / "notes.txt").read_text() == "buy milk\n"  # the ledger: the flagged write never ran
    events = read_audit(tmp_path / "state" / "audit.jsonl")
    held = [e for e in events if e["event"] == "held" and e["tool"] == "fs__write_file"]
    escalated = [e for e in events if e["event"] == "leash-escalated"]
    assert len(held) == 1 and held[0]["author"] == "strong" and held[0]["reviewer"] == "strong"
    assert [(e["call"], e["to"]) for e in escalated] == [(held[0]["call"], "strong")]


async def test_outcome_reports_label_tasks_through_the_mcp_tool(tmp_path: Path) -> None:
    root = files(tmp_path)
    drafts: Iterator[Reply | str] = iter(
        [Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": str(root / "notes.txt")})]), "Milk."]
    )

    def answer(request: ChatRequest) -> Reply | str:
        return next(drafts) if request.model == "weak-model" else verdict(0)

    async with (
        ScriptedModelServer(Respond(answer)) as server,
        proxied(world(root, server, tmp_path, leash={"client_outcomes": True}), tmp_path / "state") as p,
    ):
        listed = [tool.name for tool in (await p.client.list_tools()).tools]
        run = await p.client.call_tool("delegate", {"task": "What do I need?", "mode": "spec+leash"})
        task_id = text_of(run).rsplit("task id ", 1)[1].strip()
        reported = await p.client.call_tool("report_outcome", {"task_id": task_id, "success": False})
        unknown = await p.client.call_tool("report_outcome", {"task_id": "nope", "success": True})
        assert p.proxy.leash is not None
        stats = p.proxy.leash.tasks.stats()
    assert "report_outcome" in listed
    assert not reported.is_error and f"run {task_id} failed" in text_of(reported)
    assert unknown.is_error
    assert stats["count"] == 1 and stats["failures"] == 1


async def test_report_outcome_is_closed_to_clients_unless_configured(tmp_path: Path) -> None:
    root = files(tmp_path)
    async with (
        ScriptedModelServer(Respond(lambda r: "unused")) as server,
        proxied(world(root, server, tmp_path), tmp_path / "state") as p,
    ):
        listed = [tool.name for tool in (await p.client.list_tools()).tools]
        with pytest.raises(MCPError, match="unknown tool 'report_outcome'"):
            await p.client.call_tool("report_outcome", {"success": True})
        assert p.proxy.leash is not None
        stats = p.proxy.leash.tasks.stats()
    assert "report_outcome" not in listed  # the agent under review must not label its own work
    assert stats["count"] == 0


async def test_strong_verdicts_at_the_front_label_their_segment(tmp_path: Path) -> None:
    root = files(tmp_path)

    async with ScriptedModelServer(Respond(lambda r: verdict(1, "read ok, write wrong"))) as server:
        cfg = world(root, server, tmp_path, review={"default": "strong"})
        async with proxied(cfg, tmp_path / "state") as p:
            await p.client.call_tool("fs__read_text_file", {"path": str(root / "notes.txt")})
            await p.client.call_tool("fs__write_file", {"path": str(root / "x"), "content": "", "intent": "x"})
            assert p.proxy.leash is not None
            stats = p.proxy.leash.steps.stats()
    assert (stats["count"], stats["successes"], stats["failures"]) == (2, 1, 1)


async def test_cli_bank_import_stats_and_calibrate(tmp_path: Path) -> None:
    from tests.harness import PROXY_COMMAND

    examples = tmp_path / "examples.jsonl"
    lines: list[dict[str, Any]] = [{"kind": "task", "text": "book a flight", "label": "failure"}]
    lines += [
        {"kind": "step", "tool": "fs__write_file", "arguments": {"path": f"/a/{i}"}, "label": "failure"}
        for i in range(6)
    ]
    lines += [
        {"kind": "step", "tool": "fs__read_text_file", "arguments": {"path": f"/b/{i}"}, "label": "success"}
        for i in range(6)
    ]
    examples.write_text("\n".join(json.dumps(line) for line in lines))
    config = tmp_path / "servers.yaml"
    config.write_text(json.dumps({"servers": {}, "leash": leash_config(tmp_path)}))
    base = [PROXY_COMMAND]
    with anyio.fail_after(60):
        imported = await anyio.run_process([*base, "bank", "import", str(examples), "-c", str(config)], check=False)
        stats = await anyio.run_process([*base, "bank", "stats", "-c", str(config)], check=False)
        calibrated = await anyio.run_process(
            [*base, "bank", "calibrate", str(examples), "--target-precision", "0.9", "-c", str(config)], check=False
        )
    assert imported.returncode == 0, imported.stderr.decode()
    assert "imported 1 tasks and 12 steps" in imported.stdout.decode()
    step_stats = json.loads(stats.stdout.decode().splitlines()[1].split(": ", 1)[1])
    assert (step_stats["count"], step_stats["failures"]) == (12, 6)
    assert calibrated.returncode == 0, calibrated.stderr.decode()
    assert "threshold  escalation  precision  recall" in calibrated.stdout.decode()
    assert "precision 100.0%, recall 100.0%" in calibrated.stdout.decode()
