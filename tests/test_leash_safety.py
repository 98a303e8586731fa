"""LEASH never breaks the main path: a failing bank or encoder means "no evidence", a failing
label is logged and dropped, several processes share one bank directory, and `review: leash`
forwards a write on its own only for a non-destructive tool with a calibration on held-out labels,
never with the hashing encoder."""

from __future__ import annotations

import json
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import numpy as np
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from mcp_spec_proxy.config.schema import LeashConfig, parse_config_text
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.leash.bank import Bank, BankError
from mcp_spec_proxy.leash.calibrate import CALIBRATION, Calibration, accept_curve, pick_accept
from mcp_spec_proxy.leash.encoders import (
    EmbeddingEncoder,
    Encoder,
    EncoderInfo,
    HashingEncoder,
    HiddenStateEncoder,
    StepView,
)
from mcp_spec_proxy.leash.layers import Leash, Score
from mcp_spec_proxy.leash.watch import LeashWatch
from mcp_spec_proxy.review import ReviewerKind, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review.leash import LeashReviewer
from mcp_spec_proxy.testing import ChatRequest, Respond, ScriptedModelServer
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.harness import PROXY_COMMAND, proxied, recorded, text_of, toy, verdict

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent


class TwinEncoder:
    """The hashing encoder's vectors under an embedding encoder's name (`review: leash` refuses hashing)."""

    def __init__(self, dim: int = 64, model: str = "twin") -> None:
        self._inner = HashingEncoder(dim)
        self._model = model

    @property
    def info(self) -> EncoderInfo:
        return EncoderInfo("embedding", self._model, self._inner.dim)

    async def encode_steps(self, steps: list[StepView]) -> np.ndarray:
        return await self._inner.encode_steps(steps)

    async def encode_texts(self, texts: list[str]) -> np.ndarray:
        return await self._inner.encode_texts(texts)


class FaissFails(Bank):
    """A bank whose index answers every lookup with the error a broken FAISS index raises."""

    def search(self, vector: Any, k: int = 10) -> Any:
        raise RuntimeError("Error in virtual void faiss::IndexHNSW::search(...): Error: 'k > 0' failed")


class DiskFull(Bank):
    """A bank on a disk that refuses every save."""

    def save(self) -> None:
        raise BankError(f"cannot save LEASH {self.kind} bank in {self.directory}: No space left on device")


class Fallback:
    """The ordinary reviewer behind `review: leash` (the strong model, as a config gives it); counts its calls."""

    by = ReviewerKind.STRONG.chain

    def __init__(self) -> None:
        self.calls = 0

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        self.calls += 1
        return Verdict(True, "the ordinary reviewer looked", len(request.segment), by=self.by)


class NoUser:
    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


def leash_config(tmp_path: Path, **extra: Any) -> LeashConfig:
    return LeashConfig.model_validate(
        {"encoder": "embedding", "embedding": {"base_url": "http://127.0.0.1:1/v1", "model": "twin"}}
        | {"bank_dir": str(tmp_path / "banks"), "k": 5, "min_neighbours": 3, **extra}
    )


def make_leash(
    tmp_path: Path, encoder: Encoder | None = None, bank: type[Bank] = Bank, **extra: Any
) -> tuple[Leash, Encoder]:
    encoder = encoder or TwinEncoder()
    tasks = bank.in_memory(kind="task", encoder=encoder.info)
    steps = bank.in_memory(kind="step", encoder=encoder.info)
    return Leash(leash_config(tmp_path, **extra), encoder, tasks, steps), encoder


def tool(name: str = "t__append", annotations: types.ToolAnnotations | None = None, server: str = "t") -> CatalogTool:
    definition = types.Tool(name=name, input_schema={"type": "object"}, annotations=annotations)
    return CatalogTool(name, server, name.split("__")[-1], definition, "write", "annotation", "", None, None, "", False)


def request_for(held: Step, catalog_tool: CatalogTool | None) -> ReviewRequest:
    return ReviewRequest("s", catalog_tool, held.arguments, None, Segment((held,)), History())


def warnings_about(caplog: pytest.LogCaptureFixture, operation: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and operation in r.getMessage()]


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there now: connections are refused at once


# -- a failing bank or encoder is no evidence --------------------------------------------------


@pytest.mark.parametrize("failure", ["faiss", "endpoint-down", "hidden-dimension"])
async def test_a_failing_lookup_is_no_evidence_logged_once_and_the_write_goes_to_the_ordinary_reviewer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp_spec_proxy.leash")
    hidden: Any = None
    if failure == "faiss":
        leash, _ = make_leash(tmp_path, bank=FaissFails, accept_threshold=0.5)
        expected = "RuntimeError: Error in virtual void faiss"
    elif failure == "endpoint-down":
        encoder = EmbeddingEncoder(f"http://127.0.0.1:{refused_port()}/v1", "emb", max_retries=0, timeout=10)
        leash, _ = make_leash(tmp_path, encoder=encoder, accept_threshold=0.5)
        expected = "EncoderError: embedding endpoint"
    else:
        leash, _ = make_leash(tmp_path, encoder=HiddenStateEncoder("weak", 8), accept_threshold=0.5)
        hidden = [0.1] * 5
        expected = "hidden state has 5 dims, expected 8"
    held = Step("t__append", {"line": "x"}, "write")
    watch = LeashWatch(leash)
    fallback = Fallback()

    with anyio.fail_after(30):
        first = await leash.step_score(held, hidden)
        second = await leash.step_score(held, hidden)
        escalated = await watch.drafted(held, hidden)
        observed = await watch.unreviewed(held, hidden)
        routed = await watch.route("append a line")
        reviewed = await LeashReviewer(leash, fallback).review(
            request_for(held, tool(annotations=types.ToolAnnotations(destructive_hint=False))), NoUser()
        )

    assert first == second == Score(None, ())
    assert (escalated, observed, routed) == (False, False, False)
    assert fallback.calls == 1 and reviewed.by == Fallback.by  # the ordinary path decided
    assert reviewed.evidence is not None and reviewed.evidence["score"] is None
    said = warnings_about(caplog, "Leash.step_score")
    assert len(said) == 1, said  # once, however many lookups fail the same way
    assert expected in said[0] and "deciding without LEASH evidence" in said[0]


async def test_labelling_that_fails_after_an_accepting_verdict_is_logged_and_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    leash, _ = make_leash(tmp_path, bank=DiskFull)
    steps = (Step("t__read", {"p": "a"}, "read"), Step("t__append", {"line": "x"}, "write"))
    with anyio.fail_after(10):
        await leash.label_verdict(steps, accepted_steps=2)
        await LeashWatch(leash).verdict(steps, 2)
        await leash.label_task("append a line", True)
        await LeashWatch(leash).finished("run-1", "append a line", list(steps))  # runs.jsonl still works
    assert len(warnings_about(caplog, "No space left on device")) == 2  # steps, then tasks: one line each
    assert (tmp_path / "banks" / "runs.jsonl").exists()


async def test_a_strict_leash_and_outcome_reports_let_the_same_failures_through(tmp_path: Path) -> None:
    leash, encoder = make_leash(tmp_path, bank=DiskFull)
    strict = Leash(leash.config, encoder, leash.tasks, leash.steps, strict=True)
    with pytest.raises(BankError, match="No space left on device"):
        await strict.label_task("append a line", True)  # `bank import`: a label not stored is an error
    await leash.remember("run-1", "append a line", [Step("t__append", {"line": "x"}, "write")])
    with pytest.raises(BankError, match="No space left on device"):
        await leash.report_outcome("run-1", True)  # whoever reports an outcome hears it was not stored


@pytest.mark.parametrize("review", ["strong", "allow"])
async def test_a_write_runs_through_the_proxy_while_the_bank_fails_at_every_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, review: str
) -> None:
    """`strong`: the accepting verdict's labels cannot be saved; `allow`: the shadow observer's lookup fails."""
    record_file = tmp_path / "record.jsonl"

    def answer(request: ChatRequest) -> str:
        return verdict(1)

    def broken_search(vector: Any, k: int = 10) -> Any:
        raise RuntimeError("Error in faiss::IndexFlat::search: out of memory")

    def broken_save() -> None:
        raise BankError("cannot save LEASH step bank: No space left on device")

    async with ScriptedModelServer(Respond(answer)) as server:
        config = {
            "servers": {"toy": toy(record_file)},
            "models": {"strong": {"base_url": server.base_url, "model": "strong-model", "max_retries": 0}},
            "review": {"default": review},
            "leash": {"encoder": "hashing", "dim": 64, "bank_dir": str(tmp_path / "banks"), "min_neighbours": 1},
        }
        async with proxied(config, tmp_path / "state", twins=True) as p:
            assert p.proxy.leash is not None
            # One label, so a lookup has something to search: the index itself is what fails.
            await p.proxy.leash.label_steps(
                [Step("toy__record", {"value": "x"}, "write")], ["success"], source="import"
            )
            monkeypatch.setattr(p.proxy.leash.steps, "search", broken_search)
            monkeypatch.setattr(p.proxy.leash.steps, "save", broken_save)
            result = await p.client.call_tool("toy__record", {"value": "kept", "intent": "log it"})
    assert not result.is_error, text_of(result)
    assert [json.loads(line)["value"] for line in recorded(record_file)] == ["kept"]


async def test_a_bank_corrupted_on_disk_keeps_answering_from_memory_and_is_not_overwritten(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    encoder = TwinEncoder()
    leash = Leash.open(leash_config(tmp_path), api_key=None)
    leash.encoder = encoder  # the configured endpoint is not running: encode with the twin
    held = Step("t__append", {"line": "x"}, "write")
    await leash.label_steps([held] * 4, ["success"] * 4, source="import")
    manifest = tmp_path / "banks" / "step" / "bank.json"
    manifest.write_text("{ not json")  # what a broken disk or another program might leave

    score = await leash.step_score(held)
    await leash.label_steps([held], ["failure"], source="verdict")

    assert score.value == 0.0 and len(score.neighbours) == 4  # the rows already loaded still answer
    assert manifest.read_text() == "{ not json"  # never written over
    assert warnings_about(caplog, "was not picked up")  # the reader said so, once
    assert warnings_about(caplog, "Leash.label_steps")  # and the label was dropped with a clear line


# -- several processes share one bank directory -------------------------------------------------

LABELLER = """
import json, sys
import anyio
from mcp_spec_proxy.config.schema import LeashConfig
from mcp_spec_proxy.leash.encoders import StepView
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.trajectory import Step

async def main(bank_dir: str, who: str, count: int) -> None:
    config = LeashConfig(encoder="hashing", dim=64, bank_dir=bank_dir)
    leash = Leash.open(config, strict=True)  # strict: any LEASH error ends this process with a traceback
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(count):
        await leash.label_verdict([Step(f"{who}__tool", {"i": i}, "write")], accepted_steps=i % 2)
        await leash.label_task(f"{who} task {i}", i % 2 == 0)
    print("labelled", flush=True)
    sys.stdin.readline()
    step = (await leash.encoder.encode_steps([StepView(f"{who}__tool", {"i": 0})]))[0]
    task = (await leash.encoder.encode_texts([f"{who} task 0"]))[0]
    steps = await leash.steps.asearch(step, 1000)
    tasks = await leash.tasks.asearch(task, 1000)
    print(json.dumps({
        "steps": sorted([n.id, n.metadata["tool"], n.label] for n in steps),
        "tasks": sorted(n.metadata["task"] for n in tasks),
    }), flush=True)

anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


async def test_two_processes_label_one_bank_dir_at_once_and_both_see_every_label(tmp_path: Path) -> None:
    bank_dir, count = tmp_path / "banks", 16
    names = ("alpha", "beta")
    logs = {who: (tmp_path / f"{who}.err").open("wb") for who in names}
    try:
        with anyio.fail_after(120):
            async with (
                await anyio.open_process(
                    [sys.executable, "-c", LABELLER, str(bank_dir), "alpha", str(count)], cwd=REPO, stderr=logs["alpha"]
                ) as alpha,
                await anyio.open_process(
                    [sys.executable, "-c", LABELLER, str(bank_dir), "beta", str(count)], cwd=REPO, stderr=logs["beta"]
                ) as beta,
            ):
                processes = (alpha, beta)
                lines = []
                for process in processes:
                    assert process.stdout is not None
                    lines.append(BufferedByteReceiveStream(process.stdout))

                async def each_says(expected: str) -> list[str]:
                    try:
                        said = [(await line.receive_until(b"\n", 1 << 20)).decode() for line in lines]
                    except (anyio.IncompleteRead, anyio.EndOfStream):
                        for handle in logs.values():
                            handle.flush()
                        pytest.fail("a labeller died: " + " | ".join(p.read_text() for p in tmp_path.glob("*.err")))
                    assert all(expected in text for text in said), said
                    return said

                await each_says("ready")  # both opened the banks before either labels anything
                for process in processes:
                    assert process.stdin is not None
                    await process.stdin.send(b"go\n")
                await each_says("labelled")
                for process in processes:
                    assert process.stdin is not None
                    await process.stdin.send(b"look\n")
                seen = [json.loads(text) for text in await each_says("{")]
                codes = [await process.wait() for process in processes]
    finally:
        for handle in logs.values():
            handle.close()

    errors = {who: (tmp_path / f"{who}.err").read_text() for who in names}
    assert codes == [0, 0] and errors == {"alpha": "", "beta": ""}, errors
    every_task = sorted(f"{who} task {i}" for who in names for i in range(count))
    for view in seen:
        assert [row[0] for row in view["steps"]] == list(range(2 * count))  # one row each, no id twice
        assert sorted(row[1] for row in view["steps"]) == sorted(f"{who}__tool" for who in names for _ in range(count))
        assert sum(row[2] == "failure" for row in view["steps"]) == count  # each rejected its even steps: 8 + 8
        assert view["tasks"] == every_task
    assert seen[0]["steps"] == seen[1]["steps"]  # the same ids for the same rows in both processes
    reopened = Bank.open(bank_dir / "step", kind="step", encoder=HashingEncoder(64).info)
    assert len(reopened) == 2 * count


@pytest.mark.parametrize("approximate_after", [None, 4])
async def test_a_save_adopts_rows_another_bank_saved_meanwhile_before_its_own(
    tmp_path: Path, approximate_after: int | None
) -> None:
    info = EncoderInfo("hashing", "test", 8)
    first = Bank.open(tmp_path, kind="step", encoder=info, approximate_after=approximate_after)
    second = Bank.open(tmp_path, kind="step", encoder=info, approximate_after=approximate_after)
    rng = np.random.default_rng(0)
    for round_ in range(5):
        first.add(rng.standard_normal(8), "success", source="verdict", metadata={"who": "first", "n": round_})
        second.add(rng.standard_normal(8), "failure", source="verdict", metadata={"who": "second", "n": round_})
        second.save()
        first.save()  # both hold an unsaved row here: the second's row goes first, then this one's
    query = rng.standard_normal(8)
    found = {
        bank: sorted((n.id, n.metadata["who"], n.metadata["n"]) for n in bank.search(query, 50))
        for bank in (first, second)
    }
    assert found[first] == found[second] and len(found[first]) == 10
    assert sorted(who for _, who, _ in found[first]) == ["first"] * 5 + ["second"] * 5
    assert len(Bank.open(tmp_path, kind="step", encoder=info, approximate_after=approximate_after)) == 10


# -- review: leash forwards alone only when it may ---------------------------------------------

NON_DESTRUCTIVE = types.ToolAnnotations(read_only_hint=False, destructive_hint=False)


def calibration(info: EncoderInfo, threshold: float = 0.25) -> Calibration:
    return Calibration(info, threshold, 40, 10, 20, 0, 0.05, 100, "held-out.jsonl", "2025-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("calibrated, non-destructive", None),
        ("destructive", "does not declare destructiveHint: false"),
        ("unannotated", "does not declare destructiveHint: false"),
        ("no calibration record", "no calibration record"),
        ("calibrated with another encoder", "the calibration record was measured with"),
        ("looser than calibrated", "is looser than the 0.1 calibrated"),
        ("untrusted server", "not trusted for annotations"),
        ("hashing encoder", "the hashing encoder never forwards a write on its own"),
        ("no accept_threshold", "leash.accept_threshold is not set"),
    ],
)
async def test_review_leash_forwards_alone_only_a_non_destructive_tool_with_a_calibration(
    tmp_path: Path, case: str, why: str | None
) -> None:
    encoder: Encoder = HashingEncoder(64) if case == "hashing encoder" else TwinEncoder()
    threshold = None if case == "no accept_threshold" else 0.2
    leash, _ = make_leash(tmp_path, encoder=encoder, accept_threshold=threshold)
    held = Step("t__append", {"line": "groceries"}, "write")
    await leash.label_steps([held] * 4, ["success"] * 4, source="import")
    recorded_with = TwinEncoder(model="another") if case == "calibrated with another encoder" else encoder
    if case != "no calibration record":
        calibration(recorded_with.info, 0.1 if case == "looser than calibrated" else 0.25).save(tmp_path / "banks")
    annotations = {
        "destructive": types.ToolAnnotations(destructive_hint=True),
        "unannotated": None,
    }.get(case, NON_DESTRUCTIVE)
    fallback = Fallback()
    untrusted = {"untrusted_servers": {"t"}} if case == "untrusted server" else {}
    reviewer = LeashReviewer(leash, fallback, **untrusted)

    result = await reviewer.review(request_for(held, tool(annotations=annotations)), NoUser())

    assert result.accepted and result.evidence is not None and result.evidence["score"] == 0.0
    if why is None:
        assert fallback.calls == 0 and result.by == ReviewerKind.LEASH.chain
        assert "without a model call" in result.reason
    else:
        assert fallback.calls == 1 and result.by == Fallback.by
        assert why in result.evidence["fallback"]


def test_accept_calibration_picks_the_loosest_threshold_within_the_false_accept_bound() -> None:
    scores = [0.0, 0.05, 0.1, 0.1, 0.3, 0.4, None, 0.9]
    failed = [False, False, False, True, True, False, False, True]
    points = accept_curve(scores, failed, steps=10)
    chosen = pick_accept(points, 0.25)
    assert chosen is not None and chosen.threshold == pytest.approx(0.1)
    assert (chosen.accepted, chosen.false_accepts) == (4, 1)
    strict = pick_accept(points, 0.0)
    assert strict is not None and (strict.threshold, strict.accepted) == (0.0, 1)  # 0.1 already lets a failure in
    assert pick_accept(accept_curve([0.9], [True]), 0.1) is None


async def test_bank_calibrate_records_a_calibration_that_lets_review_leash_forward_a_non_destructive_write(
    tmp_path: Path,
) -> None:
    record_file = tmp_path / "record.jsonl"
    chats: list[str] = []

    def answer(request: ChatRequest) -> str:
        chats.append(request.model)
        return verdict(1)

    def examples(name: str, first: int, count: int) -> Path:
        lines = [
            {"tool": "toy__record", "arguments": {"value": f"groceries list entry {i}"}, "label": "success"}
            for i in range(first, first + count)
        ] + [
            {"tool": "toy__erase", "arguments": {"target": f"whole archive folder {i}"}, "label": "failure"}
            for i in range(first, first + count)
        ]
        path = tmp_path / name
        path.write_text("\n".join(json.dumps(line) for line in lines))
        return path

    async with ScriptedModelServer(Respond(answer)) as server:
        leash = {
            "encoder": "embedding",
            "embedding": {"base_url": server.base_url, "model": "emb"},
            "bank_dir": str(tmp_path / "banks"),
            "k": 5,
            "min_neighbours": 3,
        }
        cli_config = tmp_path / "servers.yaml"
        cli_config.write_text(json.dumps({"servers": {}, "leash": leash}))
        with anyio.fail_after(90):
            imported = await anyio.run_process(
                [PROXY_COMMAND, "bank", "import", str(examples("train.jsonl", 0, 12)), "-c", str(cli_config)],
                check=False,
            )
            calibrated = await anyio.run_process(
                [
                    *(PROXY_COMMAND, "bank", "calibrate", str(examples("held-out.jsonl", 100, 12))),
                    *("-c", str(cli_config), "--max-false-accept", "0.05"),
                ],
                check=False,
            )
        assert imported.returncode == 0, imported.stderr.decode()
        assert calibrated.returncode == 0, calibrated.stderr.decode() + calibrated.stdout.decode()
        record = Calibration.load(tmp_path / "banks")
        assert record is not None and (record.held_out, record.held_out_failures) == (24, 12)
        assert record.false_accepts / max(record.accepted, 1) <= 0.05 and record.accepted > 0
        assert (tmp_path / "banks" / CALIBRATION).exists()

        config = {
            "servers": {"toy": toy(record_file)},
            "models": {"strong": {"base_url": server.base_url, "model": "strong-model", "max_retries": 0}},
            "review": {"default": "leash"},
            "leash": leash | {"accept_threshold": record.accept_threshold},
        }
        async with proxied(config, tmp_path / "state", twins=True) as p:
            result = await p.client.call_tool(
                "toy__record", {"value": "groceries list entry 7", "intent": "add to my list"}
            )
    assert not result.is_error, text_of(result)
    assert [json.loads(line)["value"] for line in recorded(record_file)] == ["groceries list entry 7"]
    assert chats == []  # forwarded on LEASH's word: toy__record declares destructiveHint: false


# -- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("review: {default: leash}\nleash: {bank_dir: /tmp/banks}\n", "review.default"),
        (
            "servers:\n  fs:\n    command: x\n    tools:\n      overrides:\n        'write_*': {review: leash}\n"
            "leash:\n  encoder: hashing\n",
            "servers.fs.tools.overrides.write_*.review",
        ),
    ],
)
def test_review_leash_with_the_hashing_encoder_is_a_config_error_naming_key_and_fix(text: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text, {}, file="servers.yaml")
    error = caught.value
    assert error.key == "leash.encoder" and error.file.startswith("servers.yaml:")
    assert f"`{key}: leash`" in error.problem and "set leash.encoder: embedding" in error.problem


def test_review_leash_with_an_embedding_encoder_loads_and_client_outcomes_are_off_by_default() -> None:
    text = "review: {default: leash}\nleash: {encoder: embedding, embedding: {base_url: 'http://e/v1', model: m}}\n"
    config = parse_config_text(text, {})
    assert config.leash is not None and config.leash.client_outcomes is False
    hashing = parse_config_text("review: {default: strong}\nleash: {client_outcomes: true}\n", {})
    assert hashing.leash is not None and hashing.leash.client_outcomes is True
