"""scripts/gpu-tau2.sh end to end, with the scripted model server standing in for both GPU endpoints.

No GPU here: `WEAK_URL`/`STRONG_URL` make the script start no SGLang and use two scripted servers
(real HTTP) as the weak and the strong endpoint; everything else is what a GPU user runs — the
test split of a tau2-bench checkout, the four modes one after another, a user simulator on the
strong endpoint, LEASH on the weak model's hidden states, the table. The checkout names two
tasks `test`: 25, whose gold actions only read (an agent that only reads passes it), and 0,
which needs an exchange (it fails it), so every mode's pass@1 is 50 %.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from bench.tau2_retail import data_dir
from bench.tau2_retail.db import REPO_ROOT, DataNotFound
from bench.tau2_retail.table import MODES
from bench.tau2_retail.user_sim import GUIDELINES, STOP
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import segment_length, verdict
from tests.tau2_checkout import make_checkout

SCRIPT = REPO_ROOT / "scripts" / "gpu-tau2.sh"
WEAK, STRONG = "Qwen/Qwen3-4B", "Qwen/Qwen3-32B"  # the script's defaults: the names it sends
STAND_IN = "scripted-stand-in"  # what the strong endpoint lists: it answers any name, as a stand-in does
TEST_IDS = ["0", "25"]
HIDDEN = 16
OPENING = "Hello, this is Yusuf Rossi from 19122. I have a question about my orders."


@pytest.fixture(scope="module")
def data() -> Path:
    try:
        return data_dir(os.environ)
    except DataNotFound as exc:
        pytest.skip(str(exc))


def is_user_simulator(request: ChatRequest) -> bool:
    return GUIDELINES[:60] in str(request.messages[0].get("content"))


def respond(request: ChatRequest) -> Reply:
    """The customer speaks twice (the second a stop); the agent looks the user up once a turn, then answers."""
    if is_user_simulator(request):
        own = sum(message["role"] == "assistant" for message in request.messages)
        return Reply(content=[OPENING, f"Thanks, that is all. {STOP}"][min(own, 1)])
    if request.json_schema is not None:  # the verifier: every drafted step is valid, whatever the schema asks
        return Reply(content=verdict(segment_length(request), "fine"))
    if request.messages[-1]["role"] == "tool":
        return Reply(content="I found your account. What would you like to do?")
    arguments = {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}
    return Reply(tool_calls=[ToolCall("retail__find_user_id_by_name_zip", arguments)])


def script_env(**values: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WEAK_", "STRONG_", "USER_"))}
    env.update(PYTHON=sys.executable, **values)
    return env


async def run_script(*arguments: str, env: dict[str, str]) -> tuple[int, str]:
    done = await anyio.run_process(["bash", str(SCRIPT), *arguments], env=env, check=False, stdin=None)
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def table_rows(text: str) -> dict[str, list[str]]:
    rows = [line.strip("| ").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return {row[0]: row for row in rows[1:]}


@pytest.mark.anyio
async def test_the_gpu_script_runs_every_mode_over_the_test_split_and_writes_the_table(
    data: Path, tmp_path: Path
) -> None:
    make_checkout(data, tmp_path / "tau2-bench", TEST_IDS)
    out = tmp_path / "out"
    async with (
        ScriptedModelServer(Respond(respond), models=(WEAK,), hidden_size=HIDDEN) as weak,
        ScriptedModelServer(Respond(respond), models=(STAND_IN,)) as strong,
    ):
        env = script_env(WEAK_URL=weak.base_url, STRONG_URL=strong.base_url, LEASH_DIM=str(HIDDEN), MAX_TURNS="3")
        with anyio.fail_after(400):
            code, output = await run_script("--tau2", str(tmp_path / "tau2-bench"), "--out", str(out), env=env)
        weak_requests, strong_requests = list(weak.chat_requests), list(strong.chat_requests)
    assert code == 0, output
    assert "starting no server" in output and not list(out.glob("sglang-*.log"))
    assert f"the weak endpoint lists {WEAK} (asked for: {WEAK})" in output
    assert f"the strong endpoint lists {STAND_IN} (asked for: {STRONG})" in output

    for mode in MODES:
        records = [json.loads(line) for line in (out / mode / "results.jsonl").read_text().splitlines()]
        assert sorted(r["task"] for r in records) == sorted(TEST_IDS), mode  # the test split, all of it
        assert all(r["error"] is None and r["ended_by"] == STOP for r in records), records
        assert {r["task"]: r["reward"] for r in records} == {"25": 1.0, "0": 0.0}
        summary = json.loads((out / mode / "summary.json").read_text())
        assert summary["meta"]["split"] == "test" and summary["meta"]["cost_model"].endswith("cost_one_gpu.toml")
        text = (out / mode / "summary.md").read_text()
        assert "| wall s (measured) |" in text  # the column
        # What each endpoint lists, not a claim; the scripted agents' parameters, which endpoints do not use, left out.
        assert "REAL" not in text and f"strong {STRONG} asked for, but its endpoint lists {STAND_IN}" in text
        assert "run.draft_steps" in text and "verifier.recall" not in text and "weak.error_rate" not in text

    table = (out / "table.md").read_text()
    rows = table_rows(table)
    assert list(rows) == list(MODES)
    assert all(row[1:3] == ["2", "50.0 %"] for row in rows.values()), table
    assert rows["strong-only"][3:] == ["1.00x", "1.00x", "1.00x"]
    assert rows["weak-only"][3] == "0.00x"  # weak-only never calls the strong model
    assert all(cell.endswith("x") and cell != "n/a" for row in rows.values() for cell in row[3:]), table
    assert "split test" in table and "wall: the agent's measured turns" in table and "cost_one_gpu.toml" in table
    stand_in = f"{STRONG} asked for, but its endpoint lists {STAND_IN}: NOT the model named"
    assert f"weak {WEAK} (listed by its endpoint), strong {stand_in}, user {stand_in}" in table

    # Each role went to its own endpoint: the customer is the strong model, only the weak one gives hidden states.
    assert weak_requests and not any(is_user_simulator(r) for r in weak_requests)
    assert any(is_user_simulator(r) for r in strong_requests)
    assert any(r.wants_hidden_states for r in weak_requests) and not any(r.wants_hidden_states for r in strong_requests)
    assert {r.model for r in weak_requests} == {WEAK} and {r.model for r in strong_requests} == {STRONG}


@pytest.mark.anyio
async def test_the_gpu_script_refuses_a_test_split_it_does_not_have_before_starting_anything(tmp_path: Path) -> None:
    # The repository's own data holds the train split only; SGLang must not load 70 GB of weights to learn that.
    env = script_env(SGLANG_PYTHON="/nonexistent/python")
    with anyio.fail_after(30):
        code, output = await run_script("--out", str(tmp_path / "out"), env=env)
    assert code == 1
    assert "holds no test split" in output and "sierra-research/tau2-bench" in output
    assert not (tmp_path / "out").exists()


@pytest.mark.anyio
async def test_the_gpu_script_wants_both_urls_or_neither(data: Path, tmp_path: Path) -> None:
    make_checkout(data, tmp_path / "tau2-bench", TEST_IDS)
    env = script_env(WEAK_URL="http://127.0.0.1:9/v1")
    with anyio.fail_after(30):
        code, output = await run_script("--tau2", str(tmp_path / "tau2-bench"), env=env)
    assert code == 1 and "set both WEAK_URL and STRONG_URL" in output


@pytest.mark.anyio
async def test_the_gpu_script_gives_up_on_an_endpoint_that_never_answers(data: Path, tmp_path: Path) -> None:
    checkout = make_checkout(data, tmp_path / "tau2-bench", TEST_IDS)
    with anyio.fail_after(60):
        async with ScriptedModelServer(Respond(respond), models=(STRONG,)) as strong:
            # Port 9 (discard) on loopback: nothing listens there.
            env = script_env(WEAK_URL="http://127.0.0.1:9/v1", STRONG_URL=strong.base_url, WAIT_S="1")
            code, output = await run_script("--data", str(checkout), "--out", str(tmp_path / "o"), env=env)
    assert code == 1 and "the weak model did not answer at http://127.0.0.1:9/v1/models within 1s" in output
    assert not (tmp_path / "o" / "weak-only").exists()


def fake_sglang(tmp_path: Path, **values: str) -> dict[str, str]:
    """SGLANG_PYTHON as a stub: `-c "import sglang"` succeeds, `-m sglang.launch_server` runs fake_sglang.py."""
    stub = tmp_path / "sglang-python"
    fake = REPO_ROOT / "tests" / "fake_sglang.py"
    stub.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\nexec "{sys.executable}" "{fake}" "$@"\n')
    stub.chmod(0o755)
    record = tmp_path / "started"
    record.mkdir()
    ports = {"WEAK_PORT": str(free_port()), "STRONG_PORT": str(free_port())}
    return {"SGLANG_PYTHON": str(stub), "FAKE_SGLANG_RECORD": str(record), **ports, **values}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def started(env: dict[str, str], role: str) -> dict[str, Any] | None:
    path = Path(env["FAKE_SGLANG_RECORD"]) / f"{env[role.upper() + '_PORT']}.json"
    return json.loads(path.read_text()) if path.exists() else None


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


@pytest.mark.anyio
async def test_the_gpu_script_starts_the_weak_server_with_hidden_states_then_the_strong_one_and_stops_both(
    data: Path, tmp_path: Path
) -> None:
    checkout = make_checkout(data, tmp_path / "tau2-bench", TEST_IDS)
    env = script_env(
        **fake_sglang(tmp_path), MODES="strong-only spec", LIMIT="1", MAX_TURNS="1", SGLANG_ARGS="--log-level warning"
    )
    with anyio.fail_after(120):
        code, output = await run_script("--data", str(checkout), "--out", str(tmp_path / "out"), env=env)
    assert code == 0, output
    weak, strong = started(env, "weak"), started(env, "strong")
    assert weak is not None and strong is not None
    servers = (weak, strong)
    assert weak["started"] < strong["started"]  # the strong server's share is of what the weak one left
    assert flag(weak["flags"], "--model-path") == WEAK and flag(strong["flags"], "--model-path") == STRONG
    assert "--enable-return-hidden-states" in weak["flags"] and "--enable-return-hidden-states" not in strong["flags"]
    memory = [(flag(s["flags"], "--mem-fraction-static"), flag(s["flags"], "--max-total-tokens")) for s in servers]
    assert memory == [("0.25", "131072"), ("0.95", "163840")]  # the split of docs/BENCHMARKS.md
    assert all(flag(s["flags"], "--log-level") == "warning" for s in servers)
    # Each in its own process group, and both gone when the script is.
    assert weak["pgid"] == weak["pid"] and strong["pgid"] == strong["pid"]
    assert not alive(weak["pid"]) and not alive(strong["pid"])
    assert list(table_rows((tmp_path / "out" / "table.md").read_text())) == ["strong-only", "spec"]


@pytest.mark.anyio
async def test_the_gpu_script_stops_at_a_server_that_dies_and_shows_its_log(data: Path, tmp_path: Path) -> None:
    checkout = make_checkout(data, tmp_path / "tau2-bench", TEST_IDS)
    fakes = fake_sglang(tmp_path)
    env = script_env(**fakes, FAKE_SGLANG_DIE=fakes["WEAK_PORT"])
    with anyio.fail_after(60):
        code, output = await run_script("--data", str(checkout), "--out", str(tmp_path / "out"), env=env)
    assert code == 1
    assert "the weak server exited before it answered" in output and "CUDA out of memory" in output
    assert started(env, "strong") is None and not (tmp_path / "out" / "weak-only").exists()
