"""tau2 retail with real endpoints: a user simulator talks with the agent, as tau2-bench runs a task.

The fast test serves the agent's models and the user simulator from one scripted model server
(real HTTP, the product's client): a two-turn conversation ends at the user's stop token, is
scored and reported, and no request to the agent's models holds the scenario or the gold
actions. The slow one (`real_model`) runs two tasks against a real local model (SmolLM2-135M on
llama.cpp): it mostly fails them; what it checks is that they run, score and report.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from bench.cost_model import load as load_cost_model
from bench.tau2_retail import data_dir, load_db, load_tasks
from bench.tau2_retail.db import DataNotFound
from bench.tau2_retail.lanes import run_all
from bench.tau2_retail.outputs import write_outputs
from bench.tau2_retail.params import load as load_params
from bench.tau2_retail.runner import endpoints_from
from bench.tau2_retail.scoring import Task
from bench.tau2_retail.settings import Endpoints, Settings
from bench.tau2_retail.user_sim import GREETING, STOP, flipped
from mcp_spec_proxy.engine import Mode
from mcp_spec_proxy.models import ModelConfig
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.real_model import MODEL_NAME

WEAK, STRONG, USER = "weak-model", "strong-model", "user-model"
MODES: list[Mode] = ["weak-only", "strong-only", "spec"]
OPENING = "Hello, this is Yusuf Rossi from 19122. Two items of an order need swapping."
SECOND = "Thanks. Can you go ahead?"
CLOSING = f"That is all, thank you. {STOP}"
_BLOCK = re.compile(r"```json\n(.*?)\n```", re.DOTALL)


@pytest.fixture(scope="module")
def data() -> Path:
    try:
        return data_dir(os.environ)
    except DataNotFound as exc:
        pytest.skip(str(exc))


def settings_for(
    data: Path, out: Path, endpoints: Endpoints, tasks: list[Task], modes: list[Mode], **run: Any
) -> Settings:
    params = load_params(None)
    params = params.model_copy(update={"run": params.run.model_copy(update={"warmup": False, **run})})
    return Settings(
        params=params,
        modes=modes,
        trials=1,
        seed=0,
        tasks=tasks,
        data=data,
        original=load_db(data / "db.json"),
        out=out,
        leash_dir=out / "leash",
        cost=load_cost_model(),
        endpoints=endpoints,
        in_process=True,
        policy=(data / "policy.md").read_text(encoding="utf-8"),
        agent_policy=(data / "policy.md").read_text(encoding="utf-8"),
    )


def respond(request: ChatRequest) -> Reply:
    """The user speaks three times (the last a stop); the agent reads once per turn, then answers."""
    if request.model == USER:
        own = sum(message["role"] == "assistant" for message in request.messages)
        return Reply(content=[OPENING, SECOND, CLOSING][own])
    if request.json_schema is not None:  # spec's verifier: every drafted segment is valid
        steps = json.loads(_BLOCK.findall(str(request.messages[-1]["content"]))[-1])
        return Reply(content=json.dumps({"reason": "fine", "accepted_steps": len(steps), "replacement_action": None}))
    if request.messages[-1]["role"] == "tool":
        turn = sum(message["role"] == "user" for message in request.messages)
        return Reply(content=f"Found your account (turn {turn}). What next?")
    arguments = {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}
    return Reply(tool_calls=[ToolCall("retail__find_user_id_by_name_zip", arguments)])


def secrets(task: Task) -> list[str]:
    """What only the user simulator and the scorer may know: the scenario's texts and the gold actions."""
    instructions = task["user_scenario"]["instructions"]
    texts = [instructions[key] for key in ("reason_for_call", "unknown_info", "task_instructions")]
    for action in task["evaluation_criteria"]["actions"]:
        texts.append(json.dumps(action["arguments"], ensure_ascii=False))
        texts.extend(item for item in action["arguments"].get("new_item_ids", []))
    return texts


@pytest.mark.anyio
async def test_a_conversation_ends_at_the_users_stop_is_scored_and_never_shows_the_agent_the_gold(
    data: Path, tmp_path: Path
) -> None:
    task = next(task for task in load_tasks(data / "tasks.json") if task["id"] == "0")
    async with ScriptedModelServer(Respond(respond), models=(WEAK, STRONG, USER)) as server:
        endpoints = Endpoints(
            weak=ModelConfig(base_url=server.base_url, model=WEAK, max_retries=0),
            strong=ModelConfig(base_url=server.base_url, model=STRONG, max_retries=0),
            user=ModelConfig(base_url=server.base_url, model=USER, max_retries=0, temperature=0.0),
        )
        settings = settings_for(data, tmp_path, endpoints, [task], MODES, concurrency=1)
        with anyio.fail_after(60):
            records = await run_all(settings)
        requests = list(server.chat_requests)
    text = write_outputs(settings, records, "test", 1.0, "the endpoints' own usage counts")

    assert sorted(r["mode"] for r in records) == sorted(MODES)
    for r in records:
        assert r["error"] is None and r["status"] == "answered"
        assert (r["turns"], r["ended_by"], r["user_calls"]) == (2, STOP, 3)
        assert r["reward"] == 0.0  # the gold exchanges two items; this agent only looked the user up
        assert r["trajectory"][0] == "find_user_id_by_name_zip" and r["steps"] >= 2
        assert [turn["role"] for turn in r["transcript"]] == ["agent", "user", "agent", "user", "agent"]
        assert r["transcript"][1]["content"] == OPENING

    agent = [request for request in requests if request.model != USER]
    user = [request for request in requests if request.model == USER]
    assert agent and len(user) == 3 * len(MODES)
    for request in agent:
        seen = json.dumps(request.raw, ensure_ascii=False)
        assert not [secret for secret in secrets(task) if secret in seen]
        assert STOP not in seen
    second_turn = [r for r in agent if r.model != STRONG or r.json_schema is None]
    assert any(OPENING in json.dumps(r.messages) and SECOND in json.dumps(r.messages) for r in second_turn)
    # The simulator holds the scenario and sees the agent's words as the user's, its own as the assistant's.
    assert all(task["user_scenario"]["instructions"]["reason_for_call"] in str(r.messages[0]["content"]) for r in user)
    last = user[-1].messages[1:]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[0]["content"] == GREETING and last[1]["content"] == OPENING
    assert not any("tool_calls" in m or m["role"] == "tool" for m in last)

    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == len(MODES)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["modes"]) == MODES and all(m["runs"] == 1 for m in summary["modes"].values())
    assert "user simulator" in text and f"weak {WEAK} (listed by its endpoint)" in text and "REAL" not in text
    assert "run.draft_steps" in text and "verifier.recall" not in text  # the scripted agents' parameters: unused
    assert summary["meta"]["endpoints"]["user"]["listed"] == [WEAK, STRONG, USER]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "tau2-success-vs-strong-tokens.png",
        "tau2-success-vs-wall.png",
    ]


def test_flipped_hides_tool_traffic_and_swaps_roles() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "agent rules"},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
        {"role": "tool", "tool_call_id": "c", "content": "secret record"},
        {"role": "assistant", "content": "done"},
    ]
    assert flipped(messages) == [
        {"role": "user", "content": GREETING},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "done"},
    ]


def test_the_user_simulator_defaults_to_the_strong_endpoint() -> None:
    params = load_params(None)
    endpoints = endpoints_from(params, "http://w/v1", "w", "http://s/v1", "s")
    assert endpoints is not None and endpoints.user is None
    endpoints = endpoints_from(params, "http://w/v1", "w", "http://s/v1", "s", user_model="u", max_tokens=64)
    assert endpoints is not None and endpoints.user is not None
    assert (endpoints.user.base_url, endpoints.user.model, endpoints.user.max_tokens) == ("http://s/v1", "u", 64)
    assert endpoints_from(params, None, None, None, None) is None
    endpoints = endpoints_from(params, "http://w/v1", "w", "http://s/v1", "s", provider="sglang", leash_dim=2560)
    assert endpoints is not None and endpoints.weak.hidden_states == "native"
    assert (endpoints.leash_encoder, endpoints.leash_dim) == ("hidden", 2560)


@pytest.mark.real_model
@pytest.mark.anyio
async def test_two_tasks_run_score_and_report_against_a_real_model(
    data: Path, tmp_path: Path, local_model: str
) -> None:
    # SmolLM2-135M on two CPU cores: every answer, turn and step is bounded so two tasks fit in minutes.
    # llamacpp: JSON actions under llama.cpp's grammar, so even this model calls tools; its repetition
    # samplers keep greedy decoding from looping until max_tokens.
    config = ModelConfig(
        base_url=local_model,
        model=MODEL_NAME,
        provider="llamacpp",
        max_retries=0,
        timeout=240.0,
        max_tokens=96,
        extra_body={"dry_multiplier": 0.8, "repeat_penalty": 1.2},
    )
    endpoints = Endpoints(weak=config, strong=config, user=config.model_copy(update={"temperature": 0.0}))
    tasks = load_tasks(data / "tasks.json")[:2]
    settings = settings_for(data, tmp_path, endpoints, tasks, ["weak-only"], concurrency=1, max_steps=2, draft_steps=2)
    settings.max_turns = 2
    settings.agent_policy = ""  # the policy would triple each prompt; the small model gains nothing from it
    with anyio.fail_after(600):
        records = await run_all(settings)
    write_outputs(settings, records, "test", 1.0, "the endpoints' own usage counts")

    assert sorted(r["task"] for r in records) == sorted(str(t["id"]) for t in tasks)
    for r in records:
        assert r["reward"] in (0.0, 1.0) and r["user_calls"] >= 1
        assert 0 <= r["turns"] <= 2 and r["ended_by"]
        assert r["weak_calls"] <= 2 * 2 + 1  # bounded: turns x steps (a turn may end on a model error)
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (tmp_path / "summary.md").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["modes"]["weak-only"]["runs"] == 2
