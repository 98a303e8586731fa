"""The repair turn shares the verifier's prefix: its prompt is the verification's, byte for byte.

Whatever differs — the verdict, the repair instruction, a JSON-action guide — comes after the
verifier's messages, so the prefix cache that served the verification serves the repair up to
them. Asserted on the wire with the scripted model server (at the MCP front's barrier, for native
tools and for JSON actions, and in the engine), where the toy backend's ledger and the filesystem
are the ground truth of what ran; and measured with llama.cpp's real prefix cache (SmolLM2-135M,
`real_model`): the first repair's cached share of its prompt is at least the verification's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.engine.hooks import NoUser
from mcp_spec_proxy.models import ChatModel, ModelCall, ModelConfig
from mcp_spec_proxy.prompts import REPAIR_HEADING, is_repair_prompt, review_steps
from mcp_spec_proxy.review import ReviewRequest, Verdict
from mcp_spec_proxy.review.kinds import ReviewerKind
from mcp_spec_proxy.review.strong import ProposedStep, Repairer, StrongReviewer
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.harness import proxied, recorded, segment_length, text_of, toy, verdict
from tests.real_model import MODEL_NAME
from tests.test_engine import call
from tests.test_engine import world as engine_world
from tests.test_reviewer_isolation import INJECTION, KINDS, catalog_with, hostile_tool, outside_fences

pytestmark = pytest.mark.anyio

Json = list[dict[str, Any]]


def wire(request: ChatRequest) -> Json:
    """The messages exactly as they came over the wire (the request body), not as parsed."""
    messages: Json = request.raw["messages"]
    return messages


def same_bytes(first: Json, second: Json) -> bool:
    return json.dumps(first, ensure_ascii=False) == json.dumps(second, ensure_ascii=False)


def invalid_replacement(request: ChatRequest) -> str:
    """A rejection of the held call whose replacement names no tool: the repair turn follows."""
    return verdict(segment_length(request) - 1, "the user asked for apple", {"tool": "toy__nope", "arguments": {}})


def repaired_as_action(request: ChatRequest) -> Reply:
    """The repair turn's answer: a native tool call, or the JSON action where no tools were sent."""
    if request.tools:
        return Reply(tool_calls=[ToolCall("toy__record", {"value": "apple"})])
    return Reply(content=json.dumps({"tool": "toy__record", "arguments": {"value": "apple"}}))


@pytest.mark.parametrize("provider", ["vllm", "llamacpp"])  # native tools; JSON actions
async def test_the_repair_request_starts_with_the_verify_requests_messages_byte_for_byte(
    tmp_path: Path, provider: str
) -> None:
    def answer(request: ChatRequest) -> Reply | str:
        return repaired_as_action(request) if is_repair_prompt(request.messages) else invalid_replacement(request)

    async with ScriptedModelServer(Respond(answer)) as server:
        strong = {"base_url": server.base_url, "model": "strong-model", "max_retries": 0, "provider": provider}
        config = {
            "servers": {"toy": toy(tmp_path / "ledger")},
            "models": {"strong": strong},
            "review": {"default": "strong", "on_reject": "repair"},
        }
        async with proxied(config, tmp_path / "state", twins=True) as p:
            read = await p.client.call_tool("toy__echo", {"text": "apple"})
            # No intent: the verifier's prompt notes its absence, and the repair's must say the same.
            result = await p.client.call_tool("toy__record", {"value": "pear"})
        requests = list(server.chat_requests)
    assert not read.is_error and not result.is_error, text_of(result)
    assert recorded(tmp_path / "ledger") == ['{"value": "apple"}']  # the repaired call ran, the rejected one never
    verify, repair = requests
    assert not is_repair_prompt(verify.messages) and is_repair_prompt(repair.messages)
    shared = len(wire(verify))
    assert same_bytes(wire(repair)[:shared], wire(verify))
    assert [m["role"] for m in wire(repair)[shared:]] == ["assistant", "user"]
    assert wire(repair)[-1]["content"].startswith(f"{REPAIR_HEADING}\nRejected step: step 2 (toy__record)")
    if provider == "llamacpp":  # the JSON-action guide comes after the verifier's bytes, never in the system text
        assert not repair.tools and repair.json_schema is not None
        assert "You act by replying with exactly one JSON object" in wire(repair)[-1]["content"]
    # The prompt's readers see the accepted read and, last, the rejected call without a result.
    _, numbered = review_steps(repair.messages)
    assert [(s.tool, s.observation) for s in numbered] == [("toy__echo", "apple"), ("toy__record", None)]


async def test_the_engines_repair_request_starts_with_its_verify_requests_messages(tmp_path: Path) -> None:
    notes, other = str(tmp_path / "files" / "notes.txt"), str(tmp_path / "files" / "other.txt")
    weak: list[Reply | str] = [
        call("fs__list_directory", path=str(tmp_path / "files")),
        call("fs__read_text_file", path=other),  # the wrong file: step 2 is rejected
        call("fs__write_file", path=str(tmp_path / "files" / "todo.txt"), content="unrelated"),
        call("fs__write_file", path=str(tmp_path / "files" / "todo.txt"), content="buy milk"),
        "Done.",
    ]
    verdicts: Iterator[Callable[[ChatRequest], str]] = iter(
        [lambda r: verdict(1, "read the notes, not other.txt"), lambda r: verdict(segment_length(r))]
    )

    def strong(request: ChatRequest) -> Reply | str:
        if is_repair_prompt(request.messages):
            return Reply(tool_calls=[ToolCall("fs__read_text_file", {"path": notes})])
        return next(verdicts)(request)

    async with engine_world(tmp_path, weak, strong) as w:
        result = await w.engine.run("Copy my notes into todo.txt")
        calls = w.by("strong-model")
    assert result.status == "answered", result
    assert (w.root / "todo.txt").read_text() == "buy milk"
    assert [s.tool for s in result.steps] == ["fs__list_directory", "fs__read_text_file", "fs__write_file"]
    verify, repair = calls[0], calls[1]
    assert is_repair_prompt(repair.messages) and not is_repair_prompt(verify.messages)
    assert same_bytes(wire(repair)[: len(wire(verify))], wire(verify))
    assert wire(repair)[-1]["content"].startswith(f"{REPAIR_HEADING}\nRejected step: step 2 (fs__read_text_file)")


async def test_a_json_action_repair_shows_no_backend_description_outside_a_fence() -> None:
    """A hostile backend's description, in the JSON-action guide, would reach the repair unfenced."""
    catalog = catalog_with(hostile_tool())
    held = Step("evil__send", {"to": "mallory"}, "write")
    request = ReviewRequest("s1", catalog.lookup(held.tool), held.arguments, None, Segment((held,)), History())
    rejection = Verdict(False, "the user asked to send to bob", 0, by=ReviewerKind.STRONG.chain)
    answer = Reply(content=json.dumps({"tool": "evil__send", "arguments": {"to": "bob"}}))
    async with ScriptedModelServer(Respond(lambda r: answer)) as server:
        config = ModelConfig(base_url=server.base_url, model="m", provider="llamacpp", max_retries=0)
        model = ChatModel("strong", config)
        try:
            proposal, _ = await Repairer(model, catalog).repair(request, rejection)
        finally:
            await model.aclose()
        (sent,) = server.chat_requests
    assert isinstance(proposal, ProposedStep) and proposal.arguments == {"to": "bob"}
    assert sent.json_schema is not None and not sent.tools
    for message in wire(sent):
        assert INJECTION not in outside_fences(str(message["content"]), KINDS)
    assert "evil__send" in wire(sent)[-1]["content"]  # named in the guide; defined (fenced) above


# -- llama.cpp's real prefix cache -----------------------------------------------------------------

REVIEW_TOKENS = 96  # the verdict's content does not matter here: the prompts' layout does
REPAIR_TOKENS = 64


def toy_catalog() -> Catalog:
    catalog = Catalog(ProxyConfig.model_validate({"servers": {"toy": {"command": "x"}}}), FingerprintStore(None))
    text = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    value = {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}
    catalog.set_tools(
        "toy",
        [
            types.Tool(
                name="echo",
                description="Echo the text back.",
                input_schema=text,
                annotations=types.ToolAnnotations(read_only_hint=True),
            ),
            types.Tool(name="record", description="Record a value.", input_schema=value),
        ],
    )
    return catalog


def share(call: ModelCall) -> float:
    """The cached share of one request's prompt (llama.cpp: usage.prompt_tokens_details.cached_tokens)."""
    return call.cached_tokens / call.prompt_tokens


@pytest.mark.real_model
async def test_the_first_repair_serves_at_least_the_verifications_share_of_its_prompt_from_llamacpps_cache(
    local_model: str,
) -> None:
    catalog = toy_catalog()
    config = ModelConfig(
        provider="llamacpp",  # JSON actions: the guide is where the layout used to lose the prefix
        base_url=local_model,
        model=MODEL_NAME,
        max_retries=0,
        timeout=120,
        temperature=0,
        max_tokens=REVIEW_TOKENS,
        extra_body={"dry_multiplier": 0.8, "repeat_penalty": 1.2},  # as test_real_model: no loops to max_tokens
    )
    model = ChatModel("strong", config)
    policy = "Record only what the user asked for."
    reviewer, repairer = StrongReviewer(model, catalog, policy), Repairer(model, catalog, policy)
    task = "Echo apple, record it; then echo pear and record apple again."

    def segment(word: str) -> Segment:
        return Segment(
            (Step("toy__echo", {"text": word}, "read", observation=word), Step("toy__record", {"value": word}, "write"))
        )

    try:
        with anyio.fail_after(240):
            # Two reviews of one session, as the barrier makes them: the second's prefix is the first's.
            first = Segment(segment("apple").steps)
            await reviewer.review(
                ReviewRequest("s", catalog.lookup("toy__record"), {"value": "apple"}, None, first, History(), task),
                NoUser(),
            )
            committed = [*first.steps[:1], Step("toy__record", {"value": "apple"}, "write", observation="recorded")]
            second = ReviewRequest(
                "s",
                catalog.lookup("toy__record"),
                {"value": "pear"},
                None,
                segment("pear"),
                History(committed=committed),
                task,
            )
            before = len(model.calls)
            await reviewer.review(second, NoUser())
            verify = model.calls[before]  # its first attempt: what a retry adds is the retry's
            # Whatever the 135M model said, the repair follows a rejection of the held call.
            rejection = Verdict(False, "the user asked to record apple, not pear", 1, by=ReviewerKind.STRONG.chain)
            _, repaired = await repairer.repair(second, rejection)
    finally:
        await model.aclose()
    assert repaired is not None and repaired.purpose == "repair"
    figures = {
        "first verify": (model.calls[0].cached_tokens, model.calls[0].prompt_tokens),
        "second verify": (verify.cached_tokens, verify.prompt_tokens),
        "first repair": (repaired.cached_tokens, repaired.prompt_tokens),
    }
    print({name: f"{cached}/{prompt} = {cached / prompt:.2f}" for name, (cached, prompt) in figures.items()})
    assert verify.cached_tokens > 0  # the cache is on and reported: the second review reused the first's prefix
    assert share(repaired) >= share(verify), figures
