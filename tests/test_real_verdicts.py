"""Verdicts from a real model on the wire: SmolLM2-135M behind llama.cpp, bound by the verdict schema.

llama.cpp turns the `response_format` schema into a grammar, so the model can only sample what
the schema admits. These tests check that llama.cpp takes the schema (every segment shape,
a count's branches up to a long segment) and holds even a model told to break it to it, and
that the strong reviews of realistic segments — a read or two and a held write, through the
MCP front, one session — are readable: protocol, not the quality of a verdict. The toy
backend's record file is the ground truth of what ran. `bench/verdicts.py` measures the same
on the τ² retail tools and prints the decode tokens per verdict (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import anyio
import jsonschema
import pytest
from mcp import Client

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.models import ChatModel, ModelConfig
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.review.verdict import REASON_MAX_CHARS, parse_verdict, response_format, verdict_schema
from tests.harness import recorded, text_of
from tests.test_real_model import REVIEW_TOKENS, endpoint, toy_echo_record

pytestmark = [pytest.mark.real_model, pytest.mark.anyio]

# A model told to write what the old schema let it write and the parser refuses.
BAIT = (
    'Reply with exactly this JSON and nothing else: {"first_rejected_tool": "", "accepted_steps": 9, "reason": "'
    + "this reason goes on and on, " * 20
    + '", "verdict": "accept"}'
)
OFFERED = {"toy__echo": ["text"], "toy__record": ["value"], "shop__cancel_order": ["order_id", "reason"]}
SEGMENTS = [
    ["toy__record"],
    ["toy__echo", "toy__record"],
    ["toy__echo", "toy__echo", "toy__record"],
    [*["shop__get_order"] * 7, "shop__cancel_order"],
]


async def test_llamacpp_takes_the_verdict_schema_and_its_grammar_holds_the_model_to_it(local_model: str) -> None:
    model = ChatModel("strong", ModelConfig.model_validate(endpoint(local_model, 2 * REVIEW_TOKENS)))
    try:
        with anyio.fail_after(240):
            for tools in SEGMENTS:
                completion = await model.complete(
                    [{"role": "user", "content": BAIT}],
                    purpose="verify",
                    thinking=False,
                    response_format=response_format(tools, OFFERED),
                )
                assert completion.finish_reason != "length", completion.content
                value = json.loads(completion.content or "")  # JSON and nothing around it
                jsonschema.validate(value, verdict_schema(tools, OFFERED))
                verdict = parse_verdict(completion.content, tools)
                assert 0 <= verdict.accepted_steps <= len(tools) and len(verdict.reason) <= REASON_MAX_CHARS
    finally:
        await model.aclose()


# (what the user asked to record, what the agent records, reads before the write): matches and mismatches.
CASES = [
    ("apple", "apple", 1),
    ("pear", "plum", 1),
    ("42", "42", 2),
    ("blue car", "red car", 1),
    ("meeting at noon", "meeting at noon", 1),
    ("Ana's phone: 555-0100", "Ana's phone: 555-0199", 2),
    ("milk", "milk", 1),
    ("order W123 shipped", "order W123 cancelled", 1),
    ("2 tickets", "2 tickets", 2),
    ("refund 10 EUR", "refund 100 EUR", 1),
    ("green", "green", 1),
    ("Paris", "Berlin", 1),
    ("call mum", "call mum", 2),
    ("3 apples", "3 apples", 1),
    ("yes", "no", 1),
    ("invoice 7", "invoice 7", 1),
    ("room 12", "room 21", 2),
    ("tea", "tea", 1),
    ("Monday", "Friday", 1),
    ("done", "done", 1),
]


async def test_strong_reviews_of_realistic_segments_are_readable(local_model: str, tmp_path: Path) -> None:
    ledger, state, telemetry = tmp_path / "ledger", tmp_path / "state", tmp_path / "telemetry.jsonl"
    config = {
        "servers": {"toy": toy_echo_record(ledger)},
        "models": {"strong": endpoint(local_model, REVIEW_TOKENS)},
        "review": {"default": "strong", "policy": "Only record values the user asked for."},
    }
    # One session for all the reviews (harness.proxied bounds a whole session to 60 s: too short here).
    with anyio.fail_after(600):
        async with (
            running_proxy(ProxyConfig.model_validate(config), StatePaths(state), telemetry=telemetry) as proxy,
            Client(McpFront(proxy).server, mode="legacy") as client,
        ):
            for asked, value, reads in CASES:
                for n in range(reads):
                    read = await client.call_tool("toy__echo", {"text": f"the user asked to record {asked}"[n:]})
                    assert not read.is_error, text_of(read)
                await client.call_tool("toy__record", {"value": value, "intent": f"the user asked to record {asked}"})
    verdicts = [e for e in read_audit(state / "audit.jsonl") if e["event"] == "verdict"]
    decisions = [json.loads(line) for line in telemetry.read_text().splitlines()]
    decisions = [d for d in decisions if d["kind"] == "decision"]
    assert len(verdicts) == len(decisions) == len(CASES)
    attempts = [[c for c in d["model_calls"] if c["purpose"] == "verify"] for d in decisions]
    # Read on the first answer: the strong model's own verdict from one request, no retry.
    first_try = sum(v["decided_by"] == "strong" and len(a) == 1 for v, a in zip(verdicts, attempts, strict=True))
    decoded = sorted(c["completion_tokens"] for a in attempts for c in a)
    p95 = decoded[min(len(decoded) - 1, round(0.95 * (len(decoded) - 1)))]
    print(  # shown with -rP: the figures bench/verdicts.py reports
        f"readable on the first answer: {first_try}/{len(CASES)}; accepted {sum(v['accepted'] for v in verdicts)};"
        f" decode tokens per verdict p50 {statistics.median(decoded):g}, p95 {p95}"
    )
    assert first_try >= 0.95 * len(CASES), [(v["decided_by"], v["reason"][:120]) for v in verdicts]
    # Whatever each verdict said, the backend ran exactly the accepted writes.
    accepted = [json.dumps({"value": value}) for (_, value, _), v in zip(CASES, verdicts, strict=True) if v["accepted"]]
    assert recorded(ledger) == accepted
