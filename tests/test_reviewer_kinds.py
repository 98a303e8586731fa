"""Reviewer kinds as data: one table of traits, and the promise the `person` trait carries.

The table (`review/kinds.py`) must have a row for every kind, with every trait; the text the
audit trail shows must be what it has always shown; and `review.on_error: allow` forgives a
reviewer's failure only where its kind says no person may be waiting — tried at the gate for
every kind there is (a ledger executor is the ground truth of what ran), and through the real
proxy for every review mode that asks a person (the toy backend's ledger).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditLog, read_audit
from mcp_spec_proxy.calls.gate import Gate, GateCall
from mcp_spec_proxy.config.schema import ProxyConfig, ReviewMode
from mcp_spec_proxy.review import Chain, Reviewer, ReviewerKind, ReviewFailed, ReviewRequest, UserChannel, Verdict
from mcp_spec_proxy.review import kinds as kinds_module
from mcp_spec_proxy.review.waiting import Both
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step
from tests.console_world import calling, console_world
from tests.harness import proxied, recorded, segment_length, toy, verdict

pytestmark = pytest.mark.anyio

K = ReviewerKind
PERSONS = [kind for kind in ReviewerKind if kind.person]


# -- the table -------------------------------------------------------------------------------


def test_every_kind_has_a_row_stating_every_trait() -> None:
    for kind in ReviewerKind:
        traits = (kind.person, kind.judgement, kind.proposes, kind.met_by_strong_author, kind.mode)
        assert all(type(trait) is bool for trait in traits), kind
        assert kind.text and "→" not in kind.text and "+" not in kind.text, kind


def test_a_kind_that_leaves_out_a_trait_cannot_be_declared() -> None:
    # A new person-reviewer that says nothing of `person` (or of anything else) is an error where
    # it is written, at import: there is no default for a trait to fall back on.
    with pytest.raises(TypeError):

        class Short(kinds_module._Row):
            OPERATOR = ("operator", True, True)

    class Vague(kinds_module._Row):
        OPERATOR = ("operator", "yes", True, False, False, True)

    with pytest.raises(TypeError, match="every trait is True or False"):
        kinds_module._check_table(Vague)

    class Joined(kinds_module._Row):
        OPERATOR = ("op→erator", True, True, False, False, True)

    with pytest.raises(TypeError, match="hold no"):
        kinds_module._check_table(Joined)


def test_the_modes_of_the_table_are_the_modes_servers_yaml_may_name() -> None:
    assert {kind.text for kind in ReviewerKind if kind.mode} == set(get_args(ReviewMode))
    assert all(ReviewerKind.of_mode(mode).text == mode for mode in get_args(ReviewMode))


def test_each_kind_keeps_the_name_the_audit_trail_has_always_shown() -> None:
    shown = {
        K.ALLOW: "allow",
        K.DENY: "deny",
        K.HUMAN: "human",
        K.CONSOLE: "console",
        K.STRONG: "strong",
        K.STRONG_THEN_HUMAN: "strong_then_human",
        K.LEASH: "leash",
        K.CONSOLE_RULE: "console-rule",
        K.CONSOLE_UNAVAILABLE: "console-unavailable",
        K.STRONG_UNREADABLE: "strong (unreadable)",
        K.STRONG_AUTHORED: "strong (authored)",
        K.WEAK_ONLY_BASELINE: "weak-only (baseline)",
        K.STRONG_ONLY_BASELINE: "strong-only (baseline)",
        K.ON_ERROR: "on_error",
        K.HELD: "held",
    }
    assert {kind: kind.text for kind in ReviewerKind} == shown


def test_a_chain_renders_as_before_and_only_its_stored_text_is_read_back() -> None:
    chains = {
        "human→console": K.HUMAN.chain.then(K.CONSOLE.chain),
        "strong→human→console-rule": K.STRONG.chain.then(K.HUMAN.chain.then(K.CONSOLE_RULE.chain)),
        "strong+human→console": K.STRONG.chain.plus(K.HUMAN.chain.then(K.CONSOLE.chain)),
        "strong+console": K.STRONG.chain.plus(K.CONSOLE.chain),
    }
    for text, chain in chains.items():
        assert chain.text == text and Chain.parse(text) == chain
    judged = {text: chain.judged for text, chain in chains.items()}
    assert judged == {
        "human→console": True,
        "strong→human→console-rule": False,  # a standing rule judged nothing
        "strong+human→console": True,
        "strong+console": True,
    }
    # A stored text that is not exactly a chain of known kinds is no judgement.
    for garbled in ("", "strong→", "→strong", "strong→operator", "Strong", "strong +human", "strong→→human"):
        assert Chain.parse(garbled) is None, garbled
    assert Chain.parse(None) is None


def test_only_a_proposing_kind_deciding_may_have_its_replacement_run() -> None:
    assert [kind for kind in ReviewerKind if kind.proposes] == [K.STRONG]
    assert K.STRONG.chain.proposes and not K.STRONG.chain.then(K.HUMAN.chain).proposes
    assert not K.STRONG_UNREADABLE.chain.proposes


# -- on_error: allow, at the gate, for every kind ----------------------------------------------


class _Failing:
    """A reviewer of `kind` that never decides: it waits past the review timeout, or breaks."""

    def __init__(self, kind: ReviewerKind, how: str) -> None:
        self.by = kind.chain
        self._how = how

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        if self._how == "silent":
            await anyio.sleep_forever()
        if self._how == "review-failed":
            raise ReviewFailed("no answer came", ())
        raise RuntimeError("the reviewer fell over")


class _Handing:
    """A reviewer that hands every call to its `fallback`, as `review: leash` does."""

    by = K.LEASH.chain

    def __init__(self, fallback: Reviewer) -> None:
        self.fallback = fallback

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return await self.fallback.review(request, user)


class _Accepts:
    by = K.STRONG.chain

    async def review(self, request: ReviewRequest, user: UserChannel) -> Verdict:
        return Verdict(True, "fine", len(request.segment), by=self.by)


class _NoUser:
    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


def _tool() -> CatalogTool:
    definition = types.Tool(name="t__w", input_schema={"type": "object"})
    return CatalogTool("t__w", "t", "w", definition, "write", "default", "unannotated", None, None, "", False)


async def _ran_under_on_error_allow(reviewer: Reviewer) -> bool:
    """Whether the gate ran a write `reviewer` never decided, with `review.on_error: allow`; the
    executor's ledger is what ran."""
    review = {"default": "human", "on_error": "allow", "timeout": 0.05}
    config = ProxyConfig.model_validate({"servers": {}, "review": review})
    gate = Gate(config, BackendPool({}, _no_listing), {"human": reviewer}, AuditLog(None))
    tool = _tool()
    held = Step(tool.name, {"v": 1}, "write")
    request = ReviewRequest("s", tool, {"v": 1}, None, Segment((held,)), History())
    call = GateCall("s", tool, {"v": 1}, "client", request)
    ledger: list[dict[str, Any]] = []

    async def executor(tool: CatalogTool, arguments: dict[str, Any], report: Any) -> types.CallToolResult:
        ledger.append(arguments)
        return types.CallToolResult(content=[types.TextContent(type="text", text="ran")])

    with anyio.fail_after(10):
        outcome = await gate.write(call, _NoUser(), executor=executor)
    assert outcome.forwarded == bool(ledger)
    assert outcome.verdict.failed != bool(ledger)  # refused as a failure, never as a judgement
    return bool(ledger)


async def _no_listing(server: str, listing: Any) -> None:
    return None


@pytest.mark.parametrize("how", ["silent", "review-failed", "broken"])
@pytest.mark.parametrize("kind", list(ReviewerKind), ids=lambda kind: kind.name)
async def test_on_error_allow_forgives_a_failure_only_where_no_person_may_wait(kind: ReviewerKind, how: str) -> None:
    assert await _ran_under_on_error_allow(_Failing(kind, how)) is not kind.person


@pytest.mark.parametrize("kind", PERSONS, ids=lambda kind: kind.name)
async def test_a_silent_person_behind_another_reviewer_is_never_forgiven(kind: ReviewerKind) -> None:
    # Handed on (LEASH's fallback), or asked after a model accepted (the engine's `Both`).
    assert not await _ran_under_on_error_allow(_Handing(_Failing(kind, "silent")))
    assert not await _ran_under_on_error_allow(Both(_Accepts(), _Failing(kind, "silent")))


# -- on_error: allow, through the proxy, for every mode that asks a person ---------------------


def _silent_user(released: anyio.Event) -> Any:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        await released.wait()  # the person never answers while the call waits
        return types.ElicitResult(action="decline")

    return elicit


async def _human(tmp_path: Path) -> tuple[types.CallToolResult, list[str]]:
    released = anyio.Event()
    review = {"default": "human", "intent": False, "on_error": "allow", "timeout": 0.5}
    config = {"servers": {"toy": toy(tmp_path / "ledger")}, "review": review}
    async with proxied(config, tmp_path / "state", twins=True, elicitation=_silent_user(released)) as p:
        result = await p.client.call_tool("toy__record", {"value": "never approved"})
        released.set()
    return result, recorded(tmp_path / "ledger")


async def _console(tmp_path: Path) -> tuple[types.CallToolResult, list[str]]:
    review = {"default": "console", "intent": False, "on_error": "allow", "timeout": 0.5}
    async with console_world(tmp_path, review) as world:
        result = await calling(world, "toy__record", {"value": "never approved"}).wait()
        [line] = [line for line in read_audit(world.p.state.audit) if line["event"] == "verdict"]
        assert "timed out" in line["reason"] and line["decided_by"] == "on_error"
    return result, recorded(world.ledger)


async def _strong_then_human(tmp_path: Path) -> tuple[types.CallToolResult, list[str]]:
    def answer(request: ChatRequest) -> Reply | str:
        return verdict(segment_length(request) - 1, "not this one")  # the model rejects: the user decides

    released = anyio.Event()
    async with ScriptedModelServer(Respond(answer)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0, "model": "strong-model"}
        review = {"default": "strong_then_human", "intent": False, "on_error": "allow", "timeout": 0.5}
        config = {"servers": {"toy": toy(tmp_path / "ledger")}, "models": {"strong": endpoint}, "review": review}
        async with proxied(config, tmp_path / "state", twins=True, elicitation=_silent_user(released)) as p:
            result = await p.client.call_tool("toy__record", {"value": "never approved"})
            released.set()
    return result, recorded(tmp_path / "ledger")


SILENT_PERSON = {K.HUMAN: _human, K.CONSOLE: _console, K.STRONG_THEN_HUMAN: _strong_then_human}
"""A world where the person behind each person mode stays silent; a new one needs its own here."""


def test_every_mode_that_asks_a_person_is_tried_silent() -> None:
    assert set(SILENT_PERSON) == {kind for kind in PERSONS if kind.mode}


@pytest.mark.parametrize("kind", list(SILENT_PERSON), ids=lambda kind: kind.name)
async def test_on_error_allow_never_runs_a_write_its_person_left_unanswered(tmp_path: Path, kind: ReviewerKind) -> None:
    result, ran = await SILENT_PERSON[kind](tmp_path)
    assert result.is_error and ran == []
