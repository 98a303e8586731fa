"""A real model on the wire: SmolLM2-135M behind llama.cpp (scripts/local_model.py), driven
through the product's own paths — the MCP front's strong review, `mcp-spec-proxy run`, the
gateway, and LEASH's embedding encoder and banks.

A 135M model answers poorly. These tests assert protocol and plumbing — requests the server
accepts, answers that are well-formed, parsed and handled, audits that match what reached the
backend — never the quality of a verdict or an answer.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest
import yaml

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.leash import Bank, EmbeddingEncoder, StepView
from mcp_spec_proxy.models import ChatModel, ModelConfig
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests import backends
from tests.harness import PROXY_COMMAND, proxied, recorded, stdio, text_of, toy
from tests.real_model import MODEL_NAME

pytestmark = [pytest.mark.real_model, pytest.mark.anyio]

# Bounded answers: the model may ramble until max_tokens (tool_choice "required" is not enforced),
# and a verdict cut short by max_tokens is malformed — enough room for a short JSON verdict.
REVIEW_TOKENS = 256
DRAFT_TOKENS = 96


def endpoint(url: str, max_tokens: int) -> dict[str, Any]:
    return {
        "base_url": url,
        "model": MODEL_NAME,
        "max_retries": 0,
        "timeout": 120,
        "temperature": 0,
        "max_tokens": max_tokens,
        # llama.cpp's repetition samplers: greedy decoding at 135M otherwise loops inside an open
        # JSON object (the verdict's replacement arguments) until max_tokens cuts it off.
        "extra_body": {"dry_multiplier": 0.8, "repeat_penalty": 1.2},
    }


def drafting(url: str) -> dict[str, Any]:
    """The weak model with `provider: llamacpp`: grammar-bound JSON actions. Through this template
    it never emits native tool calls, so drafted reads only run (and writes are only held) this way."""
    return endpoint(url, 2 * DRAFT_TOKENS) | {"provider": "llamacpp"}  # room for a whole JSON action


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return read_audit(path) if path.exists() else []


def toy_echo_record(ledger: Path) -> dict[str, Any]:
    """The toy server with only its two plain tools (a read and a write): a short prompt."""
    return toy(ledger, tools={"include": ["echo", "record"]})


async def test_strong_review_of_a_held_write_is_parsed_and_the_ledger_matches_it(
    local_model: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    config = {
        "servers": {"toy": toy_echo_record(ledger)},
        "models": {"strong": endpoint(local_model, REVIEW_TOKENS)},
        "review": {"default": "strong", "policy": "Only record values the user asked for."},
    }
    async with proxied(config, tmp_path / "state") as p:
        with anyio.fail_after(240):
            read = await p.client.call_tool("toy__echo", {"text": "the user asked to record apple"})
            write = await p.client.call_tool(
                "toy__record", {"value": "apple", "intent": "the user asked to record apple"}
            )
    assert not read.is_error, text_of(read)
    events = [e for e in audit(tmp_path / "state") if e.get("tool") == "toy__record" or e["event"] != "read"]
    held = [e for e in events if e["event"] == "held"]
    verdicts = [e for e in events if e["event"] == "verdict"]
    assert len(held) == 1 and held[0]["reviewer"] == "strong"
    assert len(verdicts) == 1 and verdicts[0]["call"] == held[0]["call"]
    decision = verdicts[0]
    # The strong model's own verdict — or, when its answer is unreadable (often, at 135M), the
    # reviewer's refusal of it — never the gate's on_error stand-in for a reviewer that failed.
    assert decision["decided_by"] in ("strong", "strong (unreadable)"), decision
    assert decision["reason"].strip()
    assert decision["accepted_steps"] in (0, 1, 2)  # the segment: the echo read and the write
    # Whatever it decided, the backend saw the write iff it was accepted.
    written = [json.loads(line) for line in recorded(ledger)]
    if decision["accepted"]:
        assert written == [{"value": "apple"}], text_of(write)
        assert [e["event"] for e in events if e.get("call") == decision["call"]][-1] == "forwarded"
    else:
        assert written == [], text_of(write)
        assert write.is_error
        assert [e["event"] for e in events if e.get("call") == decision["call"]][-1] == "blocked"


def test_cli_run_in_spec_mode_answers_or_stops_cleanly(local_model: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = {
        "servers": {"toy": toy_echo_record(ledger)},
        "models": {"weak": drafting(local_model), "strong": endpoint(local_model, REVIEW_TOKENS)},
        "review": {"default": "strong"},
        # answer_graded: the weak model's final answer is held and verified too, so the run meets
        # the strong model even when the weak one answers at once (at 135M it mostly does).
        "speculation": {
            "draft_steps": 2,
            "max_steps": 3,
            "max_segments": 3,
            "max_wall_s": 240,
            "answer_graded": True,
        },
    }
    config_file = tmp_path / "local-model.yaml"
    config_file.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [
            PROXY_COMMAND,
            "--config",
            str(config_file),
            "--state-dir",
            str(tmp_path / "state"),
            "run",
            "Echo the word hello with the echo tool, then say what it returned.",
            "--mode",
            "spec",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out, err = done.stdout.strip(), done.stderr
    print(f"exit {done.returncode}\n--- stdout\n{out}\n--- stderr\n{err}")  # shown with -rP: what the model did
    assert "Traceback" not in err and "Traceback" not in out, err
    summary = [line for line in err.splitlines() if line.startswith("status=")]
    assert len(summary) == 1, err
    status = summary[0].split()[0].removeprefix("status=")
    if done.returncode == 0:
        assert status == "answered" and out, err
    else:
        # A clean stop: exit 1, one line on stdout saying why, the summary naming the same status.
        assert done.returncode == 1, err
        assert out == f"(no answer: {status})", (out, err)
        assert status in ("max_steps", "max_segments", "timeout", "model_error"), err
    # Every write the run reached went through the gate: nothing recorded without an accepting verdict.
    accepted = [e for e in audit(tmp_path / "state") if e["event"] == "verdict" and e["accepted"]]
    assert len(recorded(ledger)) <= sum(1 for e in accepted if e["tool"] == "toy__record")


async def test_gateway_serves_a_completion_over_a_real_read_tool(local_model: str, tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("meeting at noon\n")
    fs = stdio(backends.filesystem(root), tools={"include": ["read_text_file", "list_directory"]})
    config = ProxyConfig.model_validate(
        {
            "servers": {"fs": fs},
            "models": {"weak": drafting(local_model), "strong": endpoint(local_model, REVIEW_TOKENS)},
            "review": {"default": "strong"},
            "speculation": {"draft_steps": 2, "max_steps": 3, "max_segments": 2, "max_wall_s": 200},
        }
    )
    body = {
        "model": "spec",
        "messages": [{"role": "user", "content": f"Read {root / 'notes.txt'} with fs__read_text_file."}],
    }
    with anyio.fail_after(240):
        async with running_proxy(config, StatePaths(tmp_path / "state")) as proxy, anyio.create_task_group() as tg:
            port = await tg.start(
                lambda task_status: serve_gateway(Gateway(proxy), "127.0.0.1", 0, task_status=task_status)
            )
            async with httpx.AsyncClient(timeout=230) as client:
                response = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            tg.cancel_scope.cancel()
    assert response.status_code < 500, response.text
    assert response.status_code == 200, response.text
    completion = response.json()
    assert completion["object"] == "chat.completion"
    choice = completion["choices"][0]
    message = choice["message"]
    assert message["role"] == "assistant"
    if message.get("tool_calls"):
        assert choice["finish_reason"] == "tool_calls"
        assert all(json.loads(call["function"]["arguments"]) is not None for call in message["tool_calls"])
    else:
        assert isinstance(message["content"], str)
    # The backend read ran inside the gateway (or the weak model answered at once); no write was offered.
    assert not [e for e in audit(tmp_path / "state") if e["event"] == "forwarded"]


# Each: a text, its paraphrase, and an unrelated text.
PARAPHRASES = [
    ("The cat sat on the mat.", "A cat was sitting on the mat.", "Quarterly revenue grew by five percent."),
    ("What time is it in Tokyo?", "Tell me the current time in Tokyo.", "Write a poem about the sea."),
    ("Send an email to Ana about the meeting", "Email Ana regarding the meeting", "List the files in my home folder"),
]


async def test_embedding_encoder_gets_real_vectors_and_a_bank_counts_labelled_steps(
    local_model: str, tmp_path: Path
) -> None:
    encoder = EmbeddingEncoder(local_model, MODEL_NAME, timeout=60, max_retries=0)
    try:
        with anyio.fail_after(120):
            info = await encoder.probe()
            assert info.name == "embedding" and info.dim > 0
            nearer = 0
            for text, paraphrase, unrelated in PARAPHRASES:
                vectors = await encoder.encode_texts([text, paraphrase, unrelated])
                assert vectors.shape == (3, info.dim) and vectors.dtype == np.float32
                assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
                nearer += float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])
            assert nearer * 2 > len(PARAPHRASES), f"paraphrase nearer in only {nearer} of {len(PARAPHRASES)}"

            steps = [
                StepView("fs__read_text_file", {"path": "/notes/a.txt"}, "meeting at noon"),
                StepView("fs__read_text_file", {"path": "/notes/b.txt"}, "lunch at one"),
                StepView("fs__write_file", {"path": "/etc/passwd", "content": "root::0:0"}),
            ]
            step_vectors = await encoder.encode_steps(steps)
            assert step_vectors.shape == (3, info.dim)
            bank = await Bank.aopen(tmp_path / "banks" / "step", kind="step", encoder=encoder.info)
            await bank.aadd(step_vectors, ["success", "success", "failure"], source="verdict")
            await bank.asave()
            stats = Bank.open(tmp_path / "banks" / "step", kind="step", encoder=encoder.info).stats()
            neighbours = await bank.asearch(step_vectors[0], k=3)
    finally:
        await encoder.aclose()
    assert (stats["count"], stats["successes"], stats["failures"]) == (3, 2, 1)
    assert stats["encoder"] == {"name": "embedding", "model": MODEL_NAME, "dim": info.dim}
    assert neighbours[0].id == 0 and neighbours[0].score == pytest.approx(1.0, abs=1e-4)


async def test_hidden_drafting_on_llamacpp_asks_for_nothing_more_and_keeps_the_prefix_cache(local_model: str) -> None:
    # llama.cpp has no return_hidden_states: a draft that asks for them gets none and costs nothing
    # more. (A second /v1/embeddings request per draft used to evict the draft's prefix cache: the
    # next draft's cached share fell from ~0.87 to ~0; LEASH's fallback encoder stands in instead.)
    weak = ChatModel(
        "weak", ModelConfig(provider="llamacpp", **endpoint(local_model, DRAFT_TOKENS) | {"extra_body": {}})
    )
    read_tool = {
        "type": "function",
        "function": {
            "name": "fs__read_text_file",
            "description": "Read a text file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
    ask = [{"role": "user", "content": "Read /notes/todo.txt"}]
    try:
        with anyio.fail_after(120):
            first = await weak.complete(ask, purpose="draft", thinking=False, tools=[read_tool], hidden_states=True)
            again = await weak.complete(ask, purpose="draft", thinking=False, tools=[read_tool], hidden_states=True)
    finally:
        await weak.aclose()
    assert first.hidden_states == () == again.hidden_states
    assert [c.purpose for c in weak.calls] == ["draft", "draft"]
    assert again.call.cached_tokens / max(1, again.call.prompt_tokens) > 0.5


def test_the_local_model_demo_as_documented_holds_its_write_for_a_verdict(local_model: str, tmp_path: Path) -> None:
    import os
    import shlex

    repo = Path(__file__).resolve().parent.parent
    page = (repo / "docs" / "SPECAGENT.md").read_text()
    [command] = [line for line in page.splitlines() if "examples/local-model.yaml run" in line]
    notes = tmp_path / "notes.txt"
    env = {**os.environ, "LOCAL_MODEL_URL": local_model, "NOTES_FILE": str(notes), "XDG_STATE_HOME": str(tmp_path)}
    done = subprocess.run(shlex.split(command), cwd=repo, env=env, capture_output=True, text=True, timeout=400)
    print(f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}")  # -rP: what it did
    assert "Traceback" not in done.stderr, done.stderr
    events = audit(tmp_path / "mcp-spec-proxy")
    verdicts = [e for e in events if e["event"] == "verdict" and e["tool"] == "notes__add_note"]
    assert verdicts, done.stderr  # the write was held and a verdict given on it
    # And the run said so, with the verdict: the accepted call, or the step it rejected and why.
    assert "… verifying a segment" in done.stderr
    assert "… accepted: notes__add_note ran" in done.stderr or "… rejected at step" in done.stderr, done.stderr
    # Ground truth: the note is written only after an accepting verdict.
    written = notes.read_text().splitlines() if notes.exists() else []
    assert len(written) <= sum(1 for e in verdicts if e["accepted"]), (written, verdicts)
