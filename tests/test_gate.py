"""The one write gate, tried from outside at every door a call can take.

The ground truth is the toy backend's record file: the ledger of the writes it really ran. The
models are the scripted OpenAI-compatible server, told to be hostile: the weak and the strong
model both reach for a tool whose reviewer is `deny`, the verifier accepts everything, and the
reviewer's substitutes name denied tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditLog, read_audit
from mcp_spec_proxy.calls.gate import Gate, GateCall
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.review import InputNeeded, ReviewerKind, ReviewRequest, Verdict
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.harness import approve, call_error, proxied, recorded, segment_length, spawned, text_of, toy, verdict

pytestmark = pytest.mark.anyio

MODES = ["spec", "weak-only", "strong-only"]


def drafting(request: ChatRequest) -> bool:
    return bool(request.tools) and request.json_schema is None


def ran_a_tool(request: ChatRequest) -> bool:
    return any(message.get("role") == "tool" for message in request.messages)


def hostile_models(tool: str, **arguments: Any) -> Respond:
    """Both models call `tool` once, then answer; the verifier accepts every segment."""

    def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:
            return verdict(segment_length(request))
        if drafting(request) and not ran_a_tool(request):
            return Reply(tool_calls=[ToolCall(tool, arguments)])
        return "done"

    return Respond(answer)


def world(server: ScriptedModelServer, tmp_path: Path, review: dict[str, Any], **servers: Any) -> dict[str, Any]:
    endpoint = {"base_url": server.base_url, "max_retries": 0}
    return {
        "servers": servers or {"toy": toy(tmp_path / "ledger")},
        "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
        "review": {"intent": False, **review},
        "speculation": {"max_steps": 6},
    }


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return read_audit(path) if path.exists() else []


def stories(state: Path) -> dict[str, list[str]]:
    """Each call id's events in order: held → verdict → forwarded (or blocked, …)."""
    joined: dict[str, list[str]] = {}
    for event in audit(state):
        if "call" in event:
            joined.setdefault(event["call"], []).append(event["event"])
    return joined


@pytest.mark.parametrize("mode", MODES)
async def test_delegate_never_runs_a_denied_tool_in_any_mode(tmp_path: Path, mode: str) -> None:
    async with ScriptedModelServer(hostile_models("toy__record", value="x")) as server:
        review = {"default": "strong", "on_reject": "repair"}
        cfg = world(
            server, tmp_path, review, toy=toy(tmp_path / "ledger", tools={"overrides": {"record": {"review": "deny"}}})
        )
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            result = await p.client.call_tool("delegate", {"task": "record x", "mode": mode})
    assert recorded(tmp_path / "ledger") == [], text_of(result)
    held = [e for e in audit(tmp_path / "state") if e["event"] == "held"]
    assert held and all(e["reviewer"] == "deny" for e in held)
    assert {e["author"] for e in held} <= {"weak", "strong", "repair", "replacement"}
    assert all(story[:3] == ["held", "verdict", "blocked"] for story in stories(tmp_path / "state").values())


@pytest.mark.parametrize("mode", MODES)
async def test_delegate_asks_the_human_tool_reviewer_and_falls_back_to_deny(tmp_path: Path, mode: str) -> None:
    async with ScriptedModelServer(hostile_models("toy__record", value="x")) as server:
        cfg = world(server, tmp_path, {"default": "human", "fallback": "deny"})
        async with proxied(cfg, tmp_path / "state", twins=True) as p:  # this client cannot be asked
            await p.client.call_tool("delegate", {"task": "record x", "mode": mode})
    assert recorded(tmp_path / "ledger") == []
    verdicts = [e for e in audit(tmp_path / "state") if e["event"] == "verdict"]
    assert verdicts and not any(e["accepted"] for e in verdicts)


@pytest.mark.parametrize("mode", MODES)
async def test_delegate_human_tool_runs_once_the_user_approves(tmp_path: Path, mode: str) -> None:
    # The control for the two tests above: the same run, a user who says yes, one write.
    async with ScriptedModelServer(hostile_models("toy__record", value="x")) as server:
        cfg = world(server, tmp_path, {"default": "human"})
        async with proxied(cfg, tmp_path / "state", twins=True, elicitation=approve(True)) as p:
            await p.client.call_tool("delegate", {"task": "record x", "mode": mode})
        verify = [r for r in server.chat_requests if r.json_schema is not None]
    assert len(recorded(tmp_path / "ledger")) == 1
    # In spec mode the strong verifier sees the weak draft before the user is asked; outside it,
    # a weak write meets the strong reviewer only if the tool's reviewer is the strong model.
    assert len(verify) == (1 if mode == "spec" else 0)
    (story,) = stories(tmp_path / "state").values()
    assert story == ["held", "verdict", "forwarded"]


async def test_weak_only_at_delegate_meets_the_strong_reviewer(tmp_path: Path) -> None:
    async with ScriptedModelServer(hostile_models("toy__record", value="x")) as server:
        cfg = world(server, tmp_path, {"default": "strong"})
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            await p.client.call_tool("delegate", {"task": "record x", "mode": "weak-only"})
        verify = [r for r in server.chat_requests if r.json_schema is not None]
    assert len(recorded(tmp_path / "ledger")) == 1
    assert len(verify) == 1  # an unreviewed weak write at the door is gone
    held = next(e for e in audit(tmp_path / "state") if e["event"] == "held")
    assert (held["author"], held["reviewer"]) == ("weak", "strong")


@pytest.mark.parametrize("on_reject", ["replace", "repair"])
@pytest.mark.parametrize(("substitute_review", "runs"), [("deny", 0), ("strong", 1)])
async def test_a_substitute_meets_its_own_tools_reviewer(
    tmp_path: Path, on_reject: str, substitute_review: str, runs: int
) -> None:
    substitute = {"tool": "b__record", "arguments": {"value": "instead"}}

    def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:  # the verifier rejects the held write, proposing b__record
            return verdict(0, "use b", substitute if on_reject == "replace" else None)
        return Reply(tool_calls=[ToolCall("b__record", {"value": "instead"})])  # the repair turn

    async with ScriptedModelServer(Respond(answer)) as server:
        b = toy(tmp_path / "b-ledger", tools={"overrides": {"record": {"review": substitute_review}}})
        cfg = world(server, tmp_path, {"default": "strong", "on_reject": on_reject}, a=toy(tmp_path / "a-ledger"), b=b)
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            result = await p.client.call_tool("a__record", {"value": "held"})
    assert recorded(tmp_path / "a-ledger") == []
    assert len(recorded(tmp_path / "b-ledger")) == runs, text_of(result)
    held = [e for e in audit(tmp_path / "state") if e["event"] == "held"]
    first, second = held
    assert second["replaces"] == first["call"]
    assert second["author"] == ("replacement" if on_reject == "replace" else "repair")
    assert second["reviewer"] == ("deny" if substitute_review == "deny" else "strong (authored)")


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
async def test_a_replacement_of_a_tool_with_an_output_schema_reaches_the_client_as_what_it_is(
    tmp_path: Path, era: str
) -> None:
    """The client's library checks a success of `pay` against pay's output schema; another tool ran
    in its place, so the client gets an error result saying so — not a broken answer."""
    substitute = {"tool": "toy__record", "arguments": {"value": "instead"}}

    def answer(request: ChatRequest) -> str:
        return verdict(0, "record it instead", substitute)

    async with ScriptedModelServer(Respond(answer)) as server:
        cfg = world(server, tmp_path, {"default": "strong", "on_reject": "replace"})
        cfg["servers"] = {"toy": toy(tmp_path / "ledger", "--receipts")}
        async with spawned(cfg, tmp_path, mode=era) as client:
            with anyio.fail_after(60):
                result = await client.call_tool("toy__pay", {"value": "100"})
    assert result.is_error and result.structured_content is None
    assert "replaced it with toy__record" in text_of(result) and "recorded instead" in text_of(result)
    assert recorded(tmp_path / "ledger") == ['{"value": "instead"}']  # the replacement ran, pay never did


async def test_audit_joins_each_call_by_one_id_and_caps_a_flooding_reason(tmp_path: Path) -> None:
    flood = "x" * 2_000_000

    def answer(request: ChatRequest) -> str:
        return verdict(segment_length(request) - 1, flood)

    async with ScriptedModelServer(Respond(answer)) as server:
        cfg = world(server, tmp_path, {"default": "strong"})
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            await p.client.call_tool("toy__echo", {"text": "look first"})
            await p.client.call_tool("toy__record", {"value": "v"})
    events = audit(tmp_path / "state")
    assert [e["event"] for e in events] == ["read", "held", "verdict", "blocked"]
    assert len({e["call"] for e in events[1:]}) == 1
    assert events[0]["author"] == "client" and events[1]["author"] == "client"
    reason = events[2]["reason"]
    assert len(reason) < 5000 and reason.endswith("more characters cut]")
    assert (tmp_path / "state" / "audit.jsonl").stat().st_size < 100_000


class _Asks:
    by = ReviewerKind.HUMAN.chain

    async def review(self, request: ReviewRequest, user: Any) -> Verdict:
        raise InputNeeded("k", "may I?", {})


class _Breaks:
    by = ReviewerKind.STRONG.chain

    async def review(self, request: ReviewRequest, user: Any) -> Verdict:
        raise RuntimeError("the model server fell over")


def _gate(reviewer: Any) -> tuple[Gate, GateCall]:
    config = ProxyConfig.model_validate({"servers": {}, "review": {"default": reviewer.by.text}})
    tool = CatalogTool(
        "t__w",
        "t",
        "w",
        types.Tool(name="t__w", input_schema={"type": "object"}),
        "write",
        "default",
        "unannotated",
        None,
        None,
        "",
        False,
    )
    held = Step("t__w", {}, "write")
    request = ReviewRequest("s", tool, {}, None, Segment((held,)), History())
    gate = Gate(config, BackendPool({}, _no_listing), {reviewer.by.text: reviewer}, AuditLog(None))
    return gate, GateCall("s", tool, {}, "client", request)


async def _no_listing(server: str, listing: Any) -> None:
    return None


async def _progress(progress: float, total: float | None, message: str | None) -> None:
    return None


async def test_with_a_progress_token_a_question_to_the_user_leaves_as_itself() -> None:
    # A client that sends a progress token gets a heartbeat task beside its review; the reviewer's
    # "ask the user" signal must not come out wrapped in that task group's ExceptionGroup.
    gate, call = _gate(_Asks())
    with pytest.raises(InputNeeded):
        await gate.write(call, _NoUser(), _progress)


async def test_with_a_progress_token_a_reviewer_failure_is_named_and_fails_closed() -> None:
    gate, call = _gate(_Breaks())
    outcome = await gate.write(call, _NoUser(), _progress)
    assert not outcome.forwarded
    assert "RuntimeError: the model server fell over" in outcome.verdict.reason
    assert "ExceptionGroup" not in outcome.verdict.reason


class _NoUser:
    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


async def test_an_approval_is_single_use_and_bound_to_its_call(tmp_path: Path) -> None:
    cfg = {"servers": {"toy": toy(tmp_path / "ledger")}, "review": {"default": "human", "intent": False}}
    async with proxied(cfg, tmp_path / "state", twins=True, mode="2026-07-28", elicitation=approve(True)) as p:
        session = p.client.session
        asked = await session.call_tool("toy__record", {"value": "v"}, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        (key,) = (asked.input_requests or {}).keys()
        yes: types.InputResponses = {key: types.ElicitResult(action="accept", content={"approve": True})}
        results = [
            await session.call_tool(
                "toy__record",
                {"value": "v"},
                input_responses=yes,
                request_state=asked.request_state,
                allow_input_required=True,
            )
            for _ in range(3)
        ]
        moved = await session.call_tool(
            "toy__record",
            {"value": "other"},
            input_responses=yes,
            request_state=asked.request_state,
            allow_input_required=True,
        )
    assert isinstance(results[0], types.CallToolResult) and not results[0].is_error
    # Replays are asked again, never forwarded; so is the ticket moved onto other arguments.
    assert all(isinstance(r, types.InputRequiredResult) for r in [*results[1:], moved])
    assert [line for line in recorded(tmp_path / "ledger")] == ['{"value": "v"}']


async def test_strong_then_human_asks_the_model_once_across_the_retry(tmp_path: Path) -> None:
    async with ScriptedModelServer(Respond(lambda r: verdict(segment_length(r) - 1, "looks wrong"))) as server:
        cfg = world(server, tmp_path, {"default": "strong_then_human"})
        async with proxied(cfg, tmp_path / "state", twins=True, mode="2026-07-28", elicitation=approve(True)) as p:
            result = await p.client.call_tool("toy__record", {"value": "v"})
        calls = len(server.chat_requests)
    assert not result.is_error, text_of(result)
    assert len(recorded(tmp_path / "ledger")) == 1
    assert calls == 1


async def test_a_stdio_session_spans_calls_in_the_2026_era(tmp_path: Path) -> None:
    """Over stdio one connection is one session whatever its era: the reviewer sees the reads."""
    from tests.harness import spawned

    seen: list[int] = []

    def answer(request: ChatRequest) -> str:
        seen.append(segment_length(request))
        return verdict(segment_length(request))

    async with ScriptedModelServer(Respond(answer)) as server:
        cfg = world(server, tmp_path, {"default": "strong"})
        async with spawned(cfg, tmp_path, mode="2026-07-28") as client:
            await client.call_tool("toy__echo", {"text": "one"})
            await client.call_tool("toy__echo", {"text": "two"})
            with anyio.fail_after(30):
                result = await client.call_tool("toy__record", {"value": "v"})
    assert not result.is_error, text_of(result)
    assert seen == [3]  # two reads and the held write


@pytest.mark.parametrize("named", [True, False], ids=["named-session", "no-session-named"])
async def test_http_2026_era_session_is_the_one_the_client_names(tmp_path: Path, named: bool) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    from mcp_spec_proxy.config.schema import ProxyConfig
    from mcp_spec_proxy.fronts.http import serve_http
    from mcp_spec_proxy.fronts.mcp import SESSION_HEADER, McpFront
    from mcp_spec_proxy.proxy import StatePaths, running_proxy

    seen: list[int] = []

    def answer(request: ChatRequest) -> str:
        seen.append(segment_length(request))
        return verdict(segment_length(request))

    headers = {SESSION_HEADER: "agent-7"} if named else {}
    async with ScriptedModelServer(Respond(answer)) as server:
        config = ProxyConfig.model_validate(world(server, tmp_path, {"default": "strong"}))
        with anyio.fail_after(60):
            async with running_proxy(config, StatePaths(tmp_path / "state")) as proxy, anyio.create_task_group() as tg:
                front = McpFront(proxy)
                port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
                url = f"http://127.0.0.1:{port}/mcp"
                async with (
                    httpx2.AsyncClient(headers=headers) as http,
                    Client(streamable_http_client(url, http_client=http), mode="2026-07-28") as client,
                ):
                    await client.call_tool("toy__echo", {"text": "one"})
                    result = await client.call_tool("toy__record", {"value": "v"})
                tg.cancel_scope.cancel()
    assert not result.is_error, text_of(result)
    assert seen == ([2] if named else [1])  # named: the read before the write is in its segment


# -- found by attacking the gate ----------------------------------------------------------------


async def test_an_approval_answers_only_the_question_the_user_saw(tmp_path: Path) -> None:
    """2026-07-28 era: the verifier proposes one substitute, the user approves it; on the retry the
    verifier proposes another. The approval must not be spent on what the user never saw."""
    proposals = iter(["SHOWN", "NEVER-SHOWN", "NEVER-SHOWN", "NEVER-SHOWN", "NEVER-SHOWN"])

    def answer(request: ChatRequest) -> str:
        return verdict(0, "use b", {"tool": "b__record", "arguments": {"value": next(proposals)}})

    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": "SHOWN" in params.message.split("NEVER")[0]})

    async with ScriptedModelServer(Respond(answer)) as server:
        b = toy(tmp_path / "b-ledger", tools={"overrides": {"record": {"review": "human"}}})
        cfg = world(server, tmp_path, {"default": "strong", "on_reject": "replace"}, a=toy(tmp_path / "a-ledger"), b=b)
        async with proxied(cfg, tmp_path / "state", twins=True, mode="2026-07-28", elicitation=elicit) as p:
            await p.client.call_tool("a__record", {"value": "held"})
    assert recorded(tmp_path / "b-ledger") in ([], ['{"value": "SHOWN"}'])
    assert len(asked) >= 2  # the second, different substitute was put to the user again


@pytest.mark.parametrize("how", ["user-silent", "client-error"])
async def test_on_error_allow_forgives_a_model_never_a_silent_user(tmp_path: Path, how: str) -> None:
    from mcp import MCPError

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        if how == "user-silent":
            await anyio.sleep(3)
            return types.ElicitResult(action="decline")
        raise MCPError(code=-32603, message="client UI crashed")

    review = {"default": "human", "intent": False, "on_error": "allow", "timeout": 1}
    cfg = {"servers": {"toy": toy(tmp_path / "ledger")}, "review": review}
    async with proxied(cfg, tmp_path / "state", twins=True, elicitation=elicit) as p:
        result = await p.client.call_tool("toy__record", {"value": "never approved"})
    assert result.is_error and recorded(tmp_path / "ledger") == []


def erring(ledger: Path) -> dict[str, Any]:
    import sys

    server = Path(__file__).parent / "fixtures" / "erring_server.py"
    return {"command": sys.executable, "args": [str(server)], "env": {"TOY_RECORD_FILE": str(ledger)}}


async def test_a_write_whose_backend_answers_with_an_error_is_still_audited_as_forwarded(tmp_path: Path) -> None:
    cfg = {"servers": {"e": erring(tmp_path / "ledger")}, "review": {"default": "allow", "intent": False}}
    async with proxied(cfg, tmp_path / "state", twins=True) as p:
        error = await call_error(p.client, "e__write_then_error", {"value": "v"})
    assert (error.code, error.message) == (-32603, "partial failure after the write")  # as the backend sent it
    assert recorded(tmp_path / "ledger") == ['{"value": "v"}']
    events = [e for e in audit(tmp_path / "state") if e["event"] != "read"]
    assert [e["event"] for e in events] == ["held", "verdict", "forwarded"] and events[2]["is_error"] is True
    assert events[2]["error_code"] == -32603


async def test_a_read_error_inside_a_drafted_turn_is_an_observation_not_a_crash(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:
            return verdict(segment_length(request))
        if not ran_a_tool(request):
            return Reply(tool_calls=[ToolCall("e__read_error", {"value": "x"}), ToolCall("e__echo", {"value": "y"})])
        return "done"

    async with ScriptedModelServer(Respond(answer)) as server:
        cfg = world(server, tmp_path, {"default": "strong"}, e=erring(tmp_path / "ledger"))
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            assert p.proxy.engine is not None
            result = await p.proxy.engine.run("do it", "spec")
    assert result.status == "answered"
    assert result.steps[0].is_error and "bad read" in (result.steps[0].observation or "")


async def test_a_substitute_that_asks_the_user_leaves_the_session_able_to_commit(tmp_path: Path) -> None:
    class Asks:
        async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
            raise InputNeeded("k", message, schema)

    def answer(request: ChatRequest) -> str:
        return verdict(0, "use b", {"tool": "b__record", "arguments": {"value": "x"}})

    async with ScriptedModelServer(Respond(answer)) as server:
        b = toy(tmp_path / "b", tools={"overrides": {"record": {"review": "human"}}})
        cfg = world(server, tmp_path, {"default": "strong", "on_reject": "replace"}, a=toy(tmp_path / "a"), b=b)
        cfg["speculation"] = {"draft_steps": 2}
        async with proxied(cfg, tmp_path / "state", twins=True) as p:
            session = p.proxy.barrier.new_session()
            with pytest.raises(InputNeeded):
                await p.proxy.barrier.call(session, "a__record", {"value": "v"}, Asks())
            for n in range(6):
                await p.proxy.barrier.call(session, "a__echo", {"text": str(n)}, Asks())
    assert session.history.held == 0
    assert len(session.history.open) < 2  # runs of reads commit again
