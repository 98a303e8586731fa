"""The tau2 retail benchmark runner: output shape, what each mode may call, pass^k, reproducibility.

The command runs once through click on two tasks in every mode with real retail server
processes (no warm-up, to stay quick); the reproducibility check runs the same tasks twice
in-process (the retail server's in-memory twin) and compares everything but measured times.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from bench.cost_model import load as load_cost_model
from bench.tau2_retail import data_dir, load_db, load_tasks
from bench.tau2_retail.authors import Action, Seen, gold, progress
from bench.tau2_retail.db import DEFAULT_DATA_DIR, DataNotFound
from bench.tau2_retail.lanes import run_all
from bench.tau2_retail.params import load as load_params
from bench.tau2_retail.report import deterministic, order, pass_hat_k
from bench.tau2_retail.runner import bench_tau2_retail, parse_modes
from bench.tau2_retail.settings import Settings
from bench.tau2_retail.tokens import unescape
from mcp_spec_proxy.engine import MODES

TASKS = ["0", "13"]
ORDER = ["weak-only", "strong-only", "spec", "spec+leash"]  # as the command is given them
QUICK = "[run]\nwarmup = false\nconcurrency = 2\n"
RECORD_KEYS = {
    "mode", "trial", "task", "reward", "status", "strong_calls", "strong_calls_by_purpose", "strong_decode_tokens",
    "strong_prefill_tokens", "strong_cached_tokens", "weak_calls", "weak_decode_tokens", "weak_prefill_tokens",
    "modelled_wall_s", "hbm_gb", "events", "trajectory",
}  # fmt: skip


@pytest.fixture(scope="module")
def data() -> Path:
    try:
        return data_dir(os.environ)
    except DataNotFound as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def cli_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench")
    (root / "tasks.json").write_text(json.dumps(TASKS))
    (root / "quick.toml").write_text(QUICK)
    out = root / "out"
    arguments = ["--mode", "weak-only,strong-only", "--mode", "spec", "--mode", "spec+leash", "--trials", "1"]
    arguments += ["--seed", "0", "--tasks", str(root / "tasks.json"), "--params", str(root / "quick.toml")]
    result = CliRunner().invoke(bench_tau2_retail, [*arguments, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_the_command_writes_one_line_per_task_run_a_summary_and_two_plots(cli_run: Path) -> None:
    records = lines(cli_run)
    assert [(r["mode"], r["task"]) for r in records] == [(mode, task) for mode in ORDER for task in TASKS]
    assert all(set(r) >= RECORD_KEYS and r["trial"] == 0 and r["status"] == "answered" for r in records)
    summary = json.loads((cli_run / "summary.json").read_text())
    assert list(summary["modes"]) == ORDER
    for mode in summary["modes"].values():
        assert mode["runs"] == len(TASKS) and set(mode["pass_hat_k"]) == {"1"}
        assert mode["pass_hat_k"]["1"] == pytest.approx(mode["pass_rate"])
        assert set(mode["vs_strong_only"]) >= {"pass_rate_points", "strong_decode_tokens", "modelled_wall_s", "hbm_gb"}
    assert summary["modes"]["strong-only"]["vs_strong_only"]["strong_decode_tokens"] == 1.0
    text = (cli_run / "summary.md").read_text()
    assert "| spec |" in text and "verifier.recall = 0.85" in text and "pass^1" in text
    assert sorted(p.name for p in cli_run.glob("*.png")) == [
        "tau2-success-vs-strong-tokens.png",
        "tau2-success-vs-wall.png",
    ]


def test_strong_only_makes_no_weak_call_and_weak_only_no_strong_call(cli_run: Path) -> None:
    for r in lines(cli_run):
        if r["mode"] == "strong-only":
            assert r["weak_calls"] == r["weak_decode_tokens"] == r["weak_prefill_tokens"] == 0
            assert set(r["strong_calls_by_purpose"]) == {"answer"} and r["strong_decode_tokens"] > 0
        if r["mode"] == "weak-only":
            assert r["strong_calls"] == r["strong_decode_tokens"] == 0 and r["weak_calls"] > 0


def test_spec_calls_the_strong_model_only_to_verify_or_repair(cli_run: Path) -> None:
    spec = [r for r in lines(cli_run) if r["mode"] in ("spec", "spec+leash")]
    for r in spec:
        assert set(r["strong_calls_by_purpose"]) <= {"verify", "repair"}
        assert r["strong_calls"] == r["strong_calls_by_purpose"].get("verify", 0) + r["repairs"]
        assert r["weak_calls"] > 0 and r["segments"] >= 1
    # answer_graded: every task ends with a verified answer, so every run verified at least once.
    assert all(r["strong_calls_by_purpose"]["verify"] >= 1 for r in spec)


def test_pass_hat_k_is_the_mean_over_tasks_of_c_choose_k_over_n_choose_k() -> None:
    outcomes = {"a": [True, True, False, False], "b": [True] * 4, "c": [False] * 4}
    assert pass_hat_k(outcomes, 1) == pytest.approx(0.5)
    assert pass_hat_k(outcomes, 2) == pytest.approx((1 / 6 + 1 + 0) / 3)
    assert pass_hat_k(outcomes, 3) == pytest.approx((0 + 1 + 0) / 3)
    assert pass_hat_k(outcomes, 4) == pytest.approx(1 / 3)
    assert math.isnan(pass_hat_k({"a": [True]}, 2))


async def bench(data: Path, tmp: Path, seed: int) -> list[dict[str, Any]]:
    params = load_params(None)
    # Errors on about half the weak steps, so the runs compared include rejections, replacements and repairs.
    params = params.model_copy(
        update={
            "run": params.run.model_copy(update={"warmup": False, "concurrency": 2}),
            "weak": params.weak.model_copy(update={"error_rate": 0.5}),
            "verifier": params.verifier.model_copy(update={"replacement": 0.5}),
        }
    )
    tasks = [task for task in load_tasks(data / "tasks.json") if task["id"] in TASKS]
    settings = Settings(
        params=params,
        modes=list(MODES),
        trials=1,
        seed=seed,
        tasks=tasks,
        data=data,
        original=load_db(data / "db.json"),
        out=tmp,
        leash_dir=tmp / "leash",
        cost=load_cost_model(),
        in_process=True,
    )
    return [deterministic(r) for r in order(await run_all(settings), list(MODES), TASKS)]


@pytest.mark.anyio
async def test_the_same_seed_gives_the_same_runs(data: Path, tmp_path: Path) -> None:
    with anyio.fail_after(120):
        first = await bench(data, tmp_path / "first", seed=3)
        second = await bench(data, tmp_path / "second", seed=3)
    assert first == second
    events = [event for r in first for event in r["events"]]
    assert any(event.startswith("weak_error.") for event in events) and "verifier.caught" in events


def test_progress_skips_wrong_reads_and_counts_a_wrong_write_as_done() -> None:
    golden = [Action("retail__get_order_details", {"order_id": "#W1"}), Action("retail__cancel_pending_order", {})]
    wrong_read = Seen(Action("retail__get_order_details", {"order_id": "#W2"}))
    assert progress(golden, [wrong_read]) == 0
    assert progress(golden, [wrong_read, Seen(golden[0])]) == 1
    wrong_write = Action("retail__cancel_pending_order", {"order_id": "#W2"})
    assert progress(golden, [Seen(wrong_write, error=True)]) == 0
    assert progress(golden, [Seen(wrong_write)]) == 2
    assert progress(golden, [Seen(golden[1])]) == 2  # premature, right arguments: the read is skipped


def test_gold_names_the_catalog_tools(data: Path) -> None:
    task = next(task for task in load_tasks(data / "tasks.json") if task["id"] == "0")
    assert [action.tool for action in gold(task)][:2] == [
        "retail__find_user_id_by_name_zip",
        "retail__get_order_details",
    ]


def test_data_takes_a_tau2_bench_checkout_running_its_train_split_with_our_tools_spec(
    data: Path, tmp_path: Path
) -> None:
    # A tau2-bench checkout's data/tau2/domains/retail: both splits in tasks.json, no TOOLS.md.
    checkout = tmp_path / "tau2-bench" / "data" / "tau2" / "domains" / "retail"
    checkout.mkdir(parents=True)
    for name in ("db.json", "policy.md"):
        (checkout / name).write_bytes((data / name).read_bytes())
    train = load_tasks(data / "tasks.json")[:1]
    held_out = {**train[0], "id": "held-out"}
    (checkout / "tasks.json").write_text(json.dumps([held_out, *train]))
    (checkout / "split_tasks.json").write_text(json.dumps({"train": [train[0]["id"]], "test": ["held-out"]}))
    (tmp_path / "quick.toml").write_text(QUICK)
    out = tmp_path / "out"
    arguments = ["--data", str(checkout), "--mode", "weak-only", "--params", str(tmp_path / "quick.toml")]
    result = CliRunner().invoke(bench_tau2_retail, [*arguments, "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [r["task"] for r in lines(out)] == [str(train[0]["id"])]
    assert (
        f"data: {checkout.resolve()} (tools' spec: {DEFAULT_DATA_DIR / 'TOOLS.md'})" in (out / "summary.md").read_text()
    )


def test_data_without_a_db_is_refused_naming_the_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench_tau2_retail, ["--data", str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "--data" in result.output and "no db.json" in result.output


def test_modes_may_be_repeated_or_comma_separated() -> None:
    assert parse_modes(["spec, weak-only", "spec", "strong-only"]) == ["spec", "weak-only", "strong-only"]


def test_unescape_undoes_one_level_of_json_string_escapes() -> None:
    assert unescape(json.dumps('{"a": "x\ny"}')) == '"{"a": "x\ny"}"'
    assert unescape("ends with a backslash \\") == "ends with a backslash \\"
