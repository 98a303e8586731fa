"""What a tau2 retail run reports as evidence: which split ran, measured wall, the deployment modelled.

- Splits: `--split train|test|all` picks tasks of a tau2-bench checkout by its split_tasks.json;
  ids in `--tasks` are found in every split; the repository's data (train only) refuses `test`.
- Real endpoints (the scripted server standing in): the report has the agent's measured wall
  beside the modelled figures, and trials give pass^k.
- `--cost-model FILE` is the deployment modelled; `none` leaves out every modelled figure.
- The SpecAgent table (`bench.tau2_retail.table`) combines runs only when they ran the same
  tasks and trials under one cost model, and docs/BENCHMARKS.md shows its empty form.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import click
import pytest
from click.testing import CliRunner

from bench.cost_model import load as load_cost_model
from bench.tau2_retail import data_dir, load_db, load_tasks
from bench.tau2_retail.catalogue import TOOLS
from bench.tau2_retail.db import REPO_ROOT, DataNotFound
from bench.tau2_retail.lanes import run_all
from bench.tau2_retail.outputs import write_outputs
from bench.tau2_retail.params import load as load_params
from bench.tau2_retail.runner import bench_tau2_retail, cost_model_from, select_tasks
from bench.tau2_retail.settings import Endpoints, Settings
from bench.tau2_retail.table import RunsDisagree, empty, read, render
from bench.tau2_retail.user_sim import GUIDELINES, STOP
from mcp_spec_proxy.config.schema import load_config
from mcp_spec_proxy.engine import Mode
from mcp_spec_proxy.fronts.gateway import ClientToolView
from mcp_spec_proxy.models import ModelConfig
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import segment_length, verdict
from tests.tau2_checkout import make_checkout

QUICK = "[run]\nwarmup = false\nconcurrency = 1\n"
ONE_GPU = REPO_ROOT / "bench" / "cost_one_gpu.toml"
WEAK, STRONG, USER = "weak-model", "strong-model", "user-model"


@pytest.fixture(scope="module")
def data() -> Path:
    try:
        return data_dir(os.environ)
    except DataNotFound as exc:
        pytest.skip(str(exc))


@pytest.fixture
def checkout(data: Path, tmp_path: Path) -> Path:
    ids = [str(task["id"]) for task in load_tasks(data / "tasks.json")]
    return make_checkout(data, tmp_path / "tau2-bench", [ids[1], ids[3]])


def ids_file(tmp_path: Path, ids: list[str]) -> Path:
    path = tmp_path / "ids.json"
    path.write_text(json.dumps(ids))
    return path


def test_a_split_picks_the_tasks_a_checkout_names_for_it(checkout: Path) -> None:
    every = [str(task["id"]) for task in load_tasks(checkout / "tasks.json")]
    test, _ = select_tasks(checkout, "test", None, None)
    train, _ = select_tasks(checkout, "train", None, None)
    both, _ = select_tasks(checkout, "all", None, None)
    assert [str(t["id"]) for t in test] == [every[1], every[3]]
    assert [str(t["id"]) for t in train] == [i for i in every if i not in (every[1], every[3])]
    assert [str(t["id"]) for t in both] == every
    assert [str(t["id"]) for t in select_tasks(checkout, None, None, 3)[0]] == [every[0], every[2], every[4]]


def test_task_ids_are_found_in_every_split_and_checked_against_a_named_one(checkout: Path, tmp_path: Path) -> None:
    held_out = str(select_tasks(checkout, "test", None, None)[0][0]["id"])
    chosen, source = select_tasks(checkout, None, ids_file(tmp_path, [held_out]), None)
    assert [str(t["id"]) for t in chosen] == [held_out] and source == "--tasks"
    assert [str(t["id"]) for t in select_tasks(checkout, "test", ids_file(tmp_path, [held_out]), None)[0]] == [held_out]
    with pytest.raises(click.BadParameter, match=f"not in the train split: {held_out}"):
        select_tasks(checkout, "train", ids_file(tmp_path, [held_out]), None)
    with pytest.raises(click.BadParameter, match="no such task ids: nope"):
        select_tasks(checkout, None, ids_file(tmp_path, ["nope"]), None)


def test_the_repositorys_data_has_no_test_split_and_says_where_it_is(data: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        bench_tau2_retail, ["--data", str(data), "--split", "test", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2, result.output
    assert "--split" in result.output and "sierra-research/tau2-bench" in result.output
    assert not (tmp_path / "out").exists()  # refused before anything ran
    assert len(select_tasks(data, "train", None, None)[0]) == len(select_tasks(data, "all", None, None)[0]) == 74


def test_the_command_runs_the_test_split_of_a_checkout(checkout: Path, tmp_path: Path) -> None:
    (tmp_path / "quick.toml").write_text(QUICK)
    out = tmp_path / "out"
    arguments = ["--data", str(checkout), "--split", "test", "--limit", "1", "--mode", "weak-only"]
    arguments += ["--params", str(tmp_path / "quick.toml"), "--cost-model", str(ONE_GPU), "--out", str(out)]
    result = CliRunner().invoke(bench_tau2_retail, arguments, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    held_out = json.loads((checkout / "split_tasks.json").read_text())["test"][0]  # the file, not the code under test
    assert [json.loads(line)["task"] for line in (out / "results.jsonl").read_text().splitlines()] == [held_out]
    text = (out / "summary.md").read_text()
    assert f"tasks: 1 (the test split; ids {held_out})" in text
    assert f"cost model: {ONE_GPU} (MODELLED" in text and "Qwen3-32B, BF16, 1 x H200" in text
    assert json.loads((out / "summary.json").read_text())["meta"]["split"] == "test"


def test_a_cost_model_is_a_file_none_or_the_papers(tmp_path: Path) -> None:
    assert cost_model_from("none") is None and cost_model_from("NONE") is None
    default = cost_model_from(None)
    assert default is not None and default.source == "bench/cost_model.toml"
    one_gpu = cost_model_from(str(ONE_GPU))
    assert one_gpu is not None and one_gpu.strong.decode_tps == 48
    (tmp_path / "bad.toml").write_text("[weak]\n")
    for value, message in ((str(tmp_path / "bad.toml"), "prefill_chunk_tokens"), ("/nonexistent.toml", "no such file")):
        with pytest.raises(click.BadParameter, match=message):
            cost_model_from(value)


def settings_for(data: Path, out: Path, tasks: list[Any], modes: list[Mode], **fields: Any) -> Settings:
    params = load_params(None)
    params = params.model_copy(update={"run": params.run.model_copy(update={"warmup": False, "concurrency": 1})})
    defaults: dict[str, Any] = {"trials": 1, "cost": load_cost_model(), "endpoints": None}
    return Settings(
        params=params,
        modes=modes,
        seed=0,
        tasks=tasks,
        data=data,
        original=load_db(data / "db.json"),
        out=out,
        leash_dir=out / "leash",
        in_process=True,
        **{**defaults, **fields},
    )


@pytest.mark.anyio
async def test_without_a_cost_model_nothing_is_modelled_and_the_wall_is_the_measured_one(
    data: Path, tmp_path: Path
) -> None:
    tasks = [task for task in load_tasks(data / "tasks.json") if task["id"] == "0"]
    settings = settings_for(data, tmp_path, tasks, ["weak-only", "strong-only"], cost=None)
    with anyio.fail_after(60):
        records = await run_all(settings)
    text = write_outputs(settings, records, "test", 1.0, "regex")
    assert records and all("hbm_gb" not in r and "modelled_wall_s" not in r and r["wall_s"] > 0 for r in records)
    assert "cost model: none (--cost-model none): nothing modelled" in text
    assert "wall s (measured)" in text and "modelled wall" not in text and "modelled HBM" not in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["modes"]["strong-only"]["vs_strong_only"]) >= {"wall_s", "strong_decode_tokens"}
    assert "hbm_gb" not in summary["modes"]["strong-only"]["vs_strong_only"]


def respond(request: ChatRequest) -> Reply:
    """The customer asks once and stops; the agent reads once and answers."""
    if request.model == USER:
        assert GUIDELINES[:60] in str(request.messages[0]["content"])
        own = sum(message["role"] == "assistant" for message in request.messages)
        return Reply(content=["Hi, I am Yusuf Rossi, 19122.", f"Thanks. {STOP}"][min(own, 1)])
    if request.json_schema is not None:
        return Reply(content=verdict(segment_length(request), "fine"))
    if request.messages[-1]["role"] == "tool":
        return Reply(content="Found you. Anything else?")
    arguments = {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}
    return Reply(tool_calls=[ToolCall("retail__find_user_id_by_name_zip", arguments)])


@pytest.mark.anyio
async def test_real_endpoints_report_the_measured_wall_and_pass_hat_k_over_trials(data: Path, tmp_path: Path) -> None:
    tasks = [task for task in load_tasks(data / "tasks.json") if task["id"] in ("0", "25")]
    modes: list[Mode] = ["weak-only", "strong-only", "spec"]
    async with ScriptedModelServer(Respond(respond), models=(WEAK, STRONG, USER)) as server:
        endpoints = Endpoints(
            weak=ModelConfig(base_url=server.base_url, model=WEAK, max_retries=0),
            strong=ModelConfig(base_url=server.base_url, model=STRONG, max_retries=0),
            user=ModelConfig(base_url=server.base_url, model=USER, max_retries=0, temperature=0.0),
        )
        settings = settings_for(data, tmp_path, tasks, modes, trials=2, endpoints=endpoints)
        with anyio.fail_after(120):
            records = await run_all(settings)
    text = write_outputs(settings, records, "test", 1.0, "the endpoints' own usage counts")

    assert sorted((r["mode"], r["task"], r["trial"]) for r in records) == sorted(
        (mode, task_id, trial) for mode in modes for task_id in ("0", "25") for trial in (0, 1)
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    for mode in modes:
        mine = [r for r in records if r["mode"] == mode]
        means = summary["modes"][mode]["means"]
        assert means["wall_s"] == pytest.approx(sum(r["wall_s"] for r in mine) / len(mine))
        assert summary["modes"][mode]["pass_hat_k"] == {"1": 0.5, "2": 0.5}  # 25 passes both trials, 0 neither
    assert summary["modes"]["spec"]["vs_strong_only"]["wall_s"] is not None
    assert "| wall s (measured) | modelled wall s | modelled HBM GB |" in text and "pass^2" in text
    assert "measured wall" in text  # the verdict line quotes it
    assert "the DEFAULT cost model is the SpecAgent paper's hypothetical H20 deployment" in text


def write_run(folder: Path, mode: str, tasks: list[str], cost: str | None = "c.toml", real: bool = True) -> Path:
    folder.mkdir(parents=True)
    lines = [
        {"mode": mode, "task": t, "trial": 0, "reward": 1.0 if t == "a" else 0.0, "strong_decode_tokens": d,
         "wall_s": 10.0 * d + 1, "hbm_gb": 2.0 * d + 1, "modelled_wall_s": 1.0, "modelled_s_by_call": {},
         "events": {}, "strong_calls_by_purpose": {}, "other_s": 0.0, "status": "answered", "drafted_steps": 0,
         "accepted_steps": 0, "replacements": 0, "repairs": 0, "strong_calls": 1, "weak_calls": 0}
        for t, d in zip(tasks, [100.0, 300.0] if mode == "strong-only" else [50.0, 50.0], strict=False)
    ]  # fmt: skip
    (folder / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    meta = {"split": "test", "cost_model": cost, "real_endpoints": real, "endpoints": None}
    (folder / "summary.json").write_text(json.dumps({"meta": meta}))
    return folder


def test_the_table_combines_one_mode_per_folder_into_ratios_to_strong_only(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / mode, mode, ["a", "b"]) for mode in ("strong-only", "spec")]
    text = render(read(runs))
    assert "| strong-only | 2 | 50.0 % | 1.00x | 1.00x | 1.00x |" in text
    # spec: decode 50 vs 200 mean, wall 501 vs 2001, HBM 101 vs 401.
    assert "| spec | 2 | 50.0 % | 0.25x | 0.25x | 0.25x |" in text
    assert "wall: the agent's measured turns" in text and "HBM: MODELLED by c.toml" in text


def test_the_table_refuses_runs_that_a_ratio_cannot_join(tmp_path: Path) -> None:
    base = write_run(tmp_path / "strong-only", "strong-only", ["a", "b"])
    cases = {
        "other tasks": write_run(tmp_path / "fewer", "spec", ["a"]),
        "different deployments": write_run(tmp_path / "other-cost", "spec", ["a", "b"], cost="other.toml"),
        "in both": write_run(tmp_path / "again", "strong-only", ["a", "b"]),
    }
    for message, folder in cases.items():
        with pytest.raises(RunsDisagree, match=message):
            read([base, folder])
    with pytest.raises(RunsDisagree, match="not a finished runner output"):
        read([base, tmp_path])


def test_without_a_cost_model_the_table_has_no_hbm_and_the_measured_wall(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / m, m, ["a", "b"], cost=None, real=False) for m in ("strong-only", "spec")]
    text = render(read(runs))
    assert "| spec | 2 | 50.0 % | 0.25x | 0.25x | n/a |" in text and "HBM: n/a (no cost model)" in text


def test_the_benchmarks_doc_shows_the_empty_table_the_gpu_script_fills() -> None:
    doc = (REPO_ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert empty() in doc
    assert "scripts/gpu-tau2.sh --tau2" in doc


def test_the_documented_gateway_config_reads_exactly_tau2_retails_read_tools() -> None:
    # tau2-bench's own runner with the gateway as its agent: its retail tools are the client's.
    config = load_config(REPO_ROOT / "bench" / "tau2_retail" / "gateway.yaml", {})
    assert config.gateway.backend_tools is False and not config.servers
    assert config.models["weak"].hidden_states == "native" and config.review.default == "strong"
    definitions = [{"type": "function", "function": {"name": name}} for name in TOOLS]
    view = ClientToolView(None, definitions, config.gateway.client_read_only)
    reads = {tool.name for tool in view.tools() if tool.effect == "read"}
    # transfer_to_human_agents changes nothing in the DB but hands the customer over: verified like a write.
    assert reads == {name for name, spec in TOOLS.items() if not spec.mutating} - {"transfer_to_human_agents"}
