"""LEASH sees a step one way — the call, as it stands before it runs — when it labels it, looks it up and
calibrates on it; `bank calibrate` prints what the runtime then decides; `bank import` and `bank stats`
say what the banks really hold, under every encoder. Hashing encoder, and the scripted embedding server
over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner, Result

from mcp_spec_proxy.cli import main
from mcp_spec_proxy.config.schema import LeashConfig, load_config
from mcp_spec_proxy.leash.layers import Leash
from mcp_spec_proxy.leash.watch import LeashWatch
from mcp_spec_proxy.proxy import open_leash as proxy_leash
from mcp_spec_proxy.testing import Scripted, ScriptedModelServer
from mcp_spec_proxy.trajectory import Step

pytestmark = pytest.mark.anyio

WAIT_S = 20
LONG_OBSERVATION = "order 17: status pending, 3 items, total 120.50 EUR, shipping to Oslo, paid by card " * 8


def leash_config(tmp_path: Path, encoder: str = "hashing", base_url: str = "", **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {"encoder": encoder, "dim": 512, "bank_dir": str(tmp_path / "banks"), "k": 5}
    if encoder == "embedding":
        config["embedding"] = {"base_url": base_url, "model": "scripted-embedder"}
    return {"min_neighbours": 3, **config, **extra}


def open_leash(tmp_path: Path, encoder: str = "hashing", base_url: str = "", **extra: Any) -> Leash:
    return Leash.open(LeashConfig.model_validate(leash_config(tmp_path, encoder, base_url, **extra)), strict=True)


# -- one representation: labelled, then looked up, a step finds itself --------------------------


async def labelled_steps_find_themselves(tmp_path: Path, encoder: str, base_url: str = "") -> None:
    leash = open_leash(tmp_path, encoder, base_url, min_neighbours=1)
    executed = Step("orders__get", {"order_id": 17}, "read", LONG_OBSERVATION)  # a read the gate ran
    held = Step("orders__cancel", {"order_id": 17, "reason": "duplicate"}, "write")
    other = Step("orders__get", {"order_id": 18}, "read")  # another call, never executed
    # The gate labels a verdict's whole segment: its reads carry what they returned, the held write nothing.
    await leash.label_verdict([executed, held], 1)
    await leash.label_verdict([other], 0)
    # Judged again before it runs: the same call, with no observation of it yet.
    again = await leash.step_score(Step("orders__get", {"order_id": 17}, "read"))
    held_again = await leash.step_score(Step("orders__cancel", {"reason": "duplicate", "order_id": 17}, "write"))
    await leash.aclose()
    assert [n.id for n in again.neighbours[:1]] == [0]  # itself, not the unexecuted look-alike (id 2)
    assert again.neighbours[0].score == pytest.approx(1.0, abs=1e-4)
    assert again.neighbours[0].score > again.neighbours[1].score
    assert [n.id for n in held_again.neighbours[:1]] == [1]
    assert held_again.neighbours[0].score == pytest.approx(1.0, abs=1e-4)


async def test_a_labelled_read_looked_up_again_is_its_own_nearest_neighbour_under_hashing(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT_S):
        await labelled_steps_find_themselves(tmp_path, "hashing")


async def test_a_labelled_read_looked_up_again_is_its_own_nearest_neighbour_under_embeddings(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT_S):
        async with ScriptedModelServer(Scripted([]), embedding_dim=64) as server:
            await labelled_steps_find_themselves(tmp_path, "embedding", server.base_url)
            sent = [text for request in server.embedding_requests for text in request.input]
    assert sent and not any("observation" in text for text in sent)  # no representation carries one


# -- calibration is the runtime's decision -----------------------------------------------------


def example(tool: str, arguments: dict[str, Any], label: str, observation: str | None = None) -> dict[str, Any]:
    line: dict[str, Any] = {"kind": "step", "tool": tool, "arguments": arguments, "label": label}
    if observation is not None:
        line["observation"] = observation
    return line


def training() -> list[dict[str, Any]]:
    lines = [example("fs__write_file", {"path": f"/etc/cron.d/job{i}", "content": "x"}, "failure") for i in range(5)]
    lines += [example("fs__read_text_file", {"path": f"/home/u/notes{i}.txt"}, "success") for i in range(5)]
    lines += [example("orders__modify", {"order": i, "item": "shirt"}, "failure") for i in range(3)]
    lines += [example("orders__modify", {"order": i, "item": "shirt"}, "success") for i in range(3, 5)]
    return lines


def held_out() -> list[dict[str, Any]]:
    """Steps near failures, near successes, in a mixed region, and some with no near neighbour at all
    (the runtime has no opinion on those); each carries the observation a finished run would give."""
    lines = [
        example("fs__write_file", {"path": f"/etc/cron.d/job{i}", "content": "x"}, "failure", "written")
        for i in range(10, 13)
    ]
    lines += [
        example("fs__read_text_file", {"path": f"/home/u/notes{i}.txt"}, "success", LONG_OBSERVATION)
        for i in range(10, 13)
    ]
    lines += [example("orders__modify", {"order": 10, "item": "shirt"}, "success", "modified")]
    lines += [example("orders__modify", {"order": 11, "item": "shirt"}, "failure", "modified")]
    lines += [example("clock__now", {"zone": zone}, "failure", "12:00") for zone in ("UTC", "CET")]
    lines += [example("clock__now", {"zone": "EST"}, "success", "07:00")]
    return lines


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def cli(*arguments: str) -> Result:
    return CliRunner().invoke(main, list(arguments), catch_exceptions=False)


def config_file(tmp_path: Path, leash: dict[str, Any], **rest: Any) -> Path:
    path = tmp_path / "servers.yaml"
    path.write_text(json.dumps({"servers": {}, "leash": leash, **rest}))
    return path


def printed_rows(output: str) -> dict[str, str]:
    """`bank calibrate`'s table, row by threshold (as printed)."""
    lines = output.splitlines()
    start = lines.index("threshold  escalation  precision  recall") + 1
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        rows[line.split()[0]] = line
    return rows


async def runtime_rows(config_path: Path, steps: list[Step], failed: list[bool]) -> dict[str, str]:
    """What the runtime's step escalation (`LeashWatch.drafted`) does over the held-out steps, per threshold,
    with LEASH opened from the config file as the proxy opens it (`proxy.open_leash`)."""
    config = load_config(config_path, {})
    assert config.leash is not None
    rows = {}
    for i in range(21):
        threshold = i / 20
        leash_config = config.leash.model_copy(update={"escalate_threshold": threshold})
        leash = proxy_leash(config.model_copy(update={"leash": leash_config}), {})
        assert leash is not None
        watch = LeashWatch(leash)
        flagged = [await watch.drafted(step, None) for step in steps]
        await leash.aclose()
        hits = sum(f and bad for f, bad in zip(flagged, failed, strict=True))
        rate = sum(flagged) / len(steps)
        precision = hits / sum(flagged) if any(flagged) else 1.0
        recall = hits / sum(failed)
        rows[f"{threshold:.2f}"] = f"{threshold:9.2f}  {rate:10.3f}  {precision:9.3f}  {recall:6.3f}"
    return rows


async def calibrate_against_runtime(tmp_path: Path, leash: dict[str, Any], **rest: Any) -> dict[str, str]:
    """`bank calibrate`'s printed curve, asserted equal to the runtime's decisions; the runtime's rows."""
    config = config_file(tmp_path, leash, **rest)
    train = write_jsonl(tmp_path / "train.jsonl", training())
    held = held_out()
    held_file = write_jsonl(tmp_path / "held-out.jsonl", held)
    imported = await anyio.to_thread.run_sync(cli, "bank", "import", str(train), "-c", str(config))
    printed = await anyio.to_thread.run_sync(
        cli, "bank", "calibrate", str(held_file), "--target-rate", "0.4", "-c", str(config)
    )
    # At runtime a step is judged as drafted: no observation yet.
    steps = [Step(line["tool"], line["arguments"], "read") for line in held]
    failed = [line["label"] == "failure" for line in held]
    runtime = await runtime_rows(config, steps, failed)
    assert imported.exit_code == 0, imported.output
    assert imported.output.strip() == "imported 0 tasks and 15 steps"
    assert printed.exit_code == 0, printed.output
    calibrated = printed_rows(printed.output)
    assert calibrated == runtime
    chosen = printed.output.strip().splitlines()[-1]
    threshold = chosen.split()[1].rstrip(":")
    rate, precision, recall = (float(x) for x in runtime[threshold].split()[1:])
    assert f"escalates {rate:.1%}, precision {precision:.1%}, recall {recall:.1%}" in chosen
    return runtime


async def test_bank_calibrate_prints_what_the_runtime_then_decides(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT_S * 3):
        runtime = await calibrate_against_runtime(tmp_path, leash_config(tmp_path))
    # A data set where unscored steps matter: the runtime flags none of the three, even at threshold 0.
    scored = 11 - 3
    assert float(runtime["0.00"].split()[1]) == pytest.approx(scored / 11, abs=1e-3)


async def test_bank_calibrate_prints_what_the_runtime_then_decides_under_embeddings(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT_S * 3):
        async with ScriptedModelServer(Scripted([]), embedding_dim=64) as server:
            runtime = await calibrate_against_runtime(tmp_path, leash_config(tmp_path, "embedding", server.base_url))
            sent = [text for request in server.embedding_requests for text in request.input]
    assert not any("observation" in text for text in sent)  # calibration sent no held-out observation
    assert float(runtime["0.00"].split()[1]) < 1.0  # some steps have no opinion: never flagged


async def test_bank_calibrate_prints_what_the_runtime_then_decides_under_hiddens_fallback(tmp_path: Path) -> None:
    """`hidden` with a weak server that returns no states: the fallback embedding stands in at the
    runtime, and import and calibrate work over that same fallback (never over a state they lack)."""
    weak = {"weak": {"base_url": "http://127.0.0.1:9/v1", "model": "w", "provider": "vllm"}}
    with anyio.fail_after(WAIT_S * 3):
        async with ScriptedModelServer(Scripted([]), embedding_dim=64) as server:
            endpoint = {"base_url": server.base_url, "model": "scripted-embedder"}
            leash = leash_config(tmp_path, "hidden", embedding=endpoint)
            await calibrate_against_runtime(tmp_path, leash, models=weak)
            stats = await anyio.to_thread.run_sync(cli, "bank", "stats", "-c", str(tmp_path / "servers.yaml"))
    step = stats_of(stats.output)["step"]
    assert step["encoder"] == {"name": "embedding", "model": "scripted-embedder", "dim": 64}
    assert (step["count"], step["failures"]) == (15, 8)


# -- import and stats say what the banks hold --------------------------------------------------


def stats_of(output: str) -> dict[str, dict[str, Any]]:
    return {line.split(": ", 1)[0]: json.loads(line.split(": ", 1)[1]) for line in output.splitlines()}


async def import_then_stats(
    tmp_path: Path, leash: dict[str, Any], **rest: Any
) -> tuple[Result, dict[str, dict[str, Any]]]:
    config = config_file(tmp_path, leash, **rest)
    lines = [{"kind": "task", "text": "cancel order 17", "label": "failure"}, *training()]
    examples = write_jsonl(tmp_path / "train.jsonl", lines)
    imported = await anyio.to_thread.run_sync(cli, "bank", "import", str(examples), "-c", str(config))
    stats = await anyio.to_thread.run_sync(cli, "bank", "stats", "-c", str(config))
    assert stats.exit_code == 0, stats.output
    return imported, stats_of(stats.output)


async def test_bank_import_and_stats_agree_under_hashing(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT_S * 2):
        imported, stats = await import_then_stats(tmp_path, leash_config(tmp_path))
    assert imported.exit_code == 0, imported.output
    assert imported.output.strip() == "imported 1 tasks and 15 steps"
    assert (stats["task"]["count"], stats["step"]["count"], stats["step"]["failures"]) == (1, 15, 8)


async def test_bank_import_and_stats_agree_under_embeddings(tmp_path: Path) -> None:
    with anyio.fail_after(WAIT_S * 2):
        async with ScriptedModelServer(Scripted([]), embedding_dim=32) as server:
            imported, stats = await import_then_stats(tmp_path, leash_config(tmp_path, "embedding", server.base_url))
    assert imported.exit_code == 0, imported.output
    assert imported.output.strip() == "imported 1 tasks and 15 steps"
    assert (stats["task"]["count"], stats["step"]["count"]) == (1, 15)
    assert stats["step"]["encoder"] == {"name": "embedding", "model": "scripted-embedder", "dim": 32}


async def test_bank_import_under_hidden_refuses_in_one_line_and_stores_nothing(tmp_path: Path) -> None:
    """With a weak model whose server returns its states, the step bank holds only those. (Without
    one, the fallback stands in at the runtime too, and an import over it is what the runtime uses.)"""
    weak = {
        "weak": {"base_url": "http://127.0.0.1:9/v1", "model": "w", "provider": "sglang", "hidden_states": "native"}
    }
    with anyio.fail_after(WAIT_S * 2):
        imported, stats = await import_then_stats(tmp_path, leash_config(tmp_path, "hidden"), models=weak)
        held_file = write_jsonl(tmp_path / "held-out.jsonl", held_out() * 2)
        config = str(tmp_path / "servers.yaml")
        calibrated = await anyio.to_thread.run_sync(
            cli, "bank", "calibrate", str(held_file), "--target-rate", "0.4", "-c", config
        )
    assert imported.exit_code != 0
    assert "imported" not in imported.output
    assert len(imported.output.strip().splitlines()) == 1
    assert "hidden" in imported.output and "drafting calls" in imported.output
    assert (stats["task"]["count"], stats["step"]["count"]) == (0, 0)
    assert calibrated.exit_code != 0 and "threshold" not in calibrated.output
    assert "drafting calls" in calibrated.output
