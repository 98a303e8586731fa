"""Suspended calls of 2026-07-28 clients (`fronts/relay.py`), from the side of a client that
never comes back, one that floods, and one that forges: the front outlives each of them."""

from __future__ import annotations

from typing import Any, cast

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from mcp_spec_proxy.backends.relay import CALLER
from mcp_spec_proxy.fronts import relay
from mcp_spec_proxy.fronts.relay import Suspensions

pytestmark = pytest.mark.anyio

ELICIT = types.ClientCapabilities(elicitation=types.ElicitationCapability())
BINDING = ("session", "ask__ask_user", "digest")


async def nothing(server: str, method: str) -> None:
    return None


def asking(outcomes: list[str], ended: anyio.Event) -> Any:
    """A call that asks its client one thing, and records what became of the question."""

    async def run() -> str:
        link = CALLER.get()
        assert link is not None
        try:
            params = {"message": "who?", "requestedSchema": {}}
            answer = await link.relay("ask", "elicitation/create", params, None)
            outcomes.append(f"answered {answer}")
        except MCPError as exc:
            outcomes.append(f"error {exc.code}: {exc.message}")
        finally:
            ended.set()
        return "done"

    return run


async def test_a_question_nobody_answers_ends_its_call_within_the_ttl_and_its_state_is_then_refused() -> None:
    suspensions = Suspensions(0.2)
    outcomes: list[str] = []
    ended = anyio.Event()
    async with suspensions.hosting():
        first = await suspensions.call("client", ELICIT, BINDING, asking(outcomes, ended), nothing)
        assert isinstance(first, types.InputRequiredResult)
        assert first.input_requests is not None and first.request_state is not None
        with anyio.fail_after(5):
            await ended.wait()
        assert outcomes == ["error -32001: the client did not answer elicitation/create within 0.2s (review.timeout)"]
        answer = {next(iter(first.input_requests)): types.ElicitResult(action="accept", content={})}
        with pytest.raises(MCPError, match="names no call waiting"):
            await suspensions.resume(first.request_state, BINDING, answer)


async def test_past_a_sessions_cap_its_oldest_question_is_given_up_and_other_sessions_keep_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(relay, "MAX_WAITING_PER_SESSION", 2)
    suspensions = Suspensions(60)
    outcomes: list[str] = []
    victim: list[str] = []
    ended = [anyio.Event() for _ in range(3)]
    victim_ended = anyio.Event()
    async with suspensions.hosting():
        other = ("another session", "ask__ask_user", "digest")
        assert isinstance(
            await suspensions.call("victim", ELICIT, other, asking(victim, victim_ended), nothing),
            types.InputRequiredResult,
        )
        for event in ended:  # one session floods
            asked = await suspensions.call("client", ELICIT, BINDING, asking(outcomes, event), nothing)
            assert isinstance(asked, types.InputRequiredResult)
        with anyio.fail_after(5):
            await ended[0].wait()
        assert outcomes == [
            "error -32001: the client did not answer elicitation/create: more than 2 of this session's questions waited"
        ]
        assert not ended[1].is_set() and not ended[2].is_set() and not victim_ended.is_set()


async def test_a_state_moved_to_other_arguments_resumes_nothing_and_the_call_still_waits_for_its_own() -> None:
    suspensions = Suspensions(60)
    outcomes: list[str] = []
    ended = anyio.Event()
    async with suspensions.hosting():
        first = await suspensions.call("client", ELICIT, BINDING, asking(outcomes, ended), nothing)
        assert isinstance(first, types.InputRequiredResult)
        assert first.input_requests is not None and first.request_state is not None
        key = next(iter(first.input_requests))
        answer = {key: types.ElicitResult(action="accept", content={"username": "eve"})}
        with pytest.raises(MCPError, match="names no call waiting"):
            await suspensions.resume(first.request_state, ("session", "ask__ask_user", "other"), answer)
        forged = first.request_state[:-4] + "0000"
        with pytest.raises(MCPError, match="names no call waiting"):
            await suspensions.resume(forged, BINDING, answer)
        assert await suspensions.resume(first.request_state, BINDING, answer) == "done"

        second = await suspensions.call("client", ELICIT, BINDING, asking(outcomes, anyio.Event()), nothing)
        assert isinstance(second, types.InputRequiredResult)
        assert await suspensions.resume(second.request_state, BINDING, {"wrong-key": answer[key]}) == "done"
    assert outcomes == [
        "answered {'action': 'accept', 'content': {'username': 'eve'}}",
        f"error -32001: the client did not answer elicitation/create: its retry carried no answer under {key!r}",
    ]


async def test_a_client_without_the_capability_is_never_suspended() -> None:
    suspensions = Suspensions(60)
    outcomes: list[str] = []
    async with suspensions.hosting():
        mute = types.ClientCapabilities()
        assert await suspensions.call("client", mute, BINDING, asking(outcomes, anyio.Event()), nothing) == "done"
    assert outcomes == ["error -32601: the client does not support elicitation/create"]


async def test_a_question_of_a_round_that_fails_fails_the_read_as_itself_not_as_a_task_group() -> None:
    # A round's questions are asked at once; one whose relay raises (its audit line cannot be
    # written, say) must reach the read's caller as that error, which the error result then names.
    from mcp_spec_proxy.backends.requests import Requests
    from mcp_spec_proxy.errors import StateError

    class Session:
        async def dispatch_input_request(self, context: Any, request: Any) -> Any:
            if context.request_id == "b":
                raise StateError("the audit log cannot be written")
            await anyio.sleep_forever()  # the other question waits for its person: it is cancelled

    class FakeClient:
        session = Session()

    elicit = {"method": "elicitation/create", "params": {"message": "name?", "requestedSchema": {"type": "object"}}}
    roots = {"method": "roots/list"}
    answer = {"result": {"resultType": "input_required", "inputRequests": {"a": elicit, "b": roots}}}
    with anyio.fail_after(5), pytest.raises(StateError, match="audit log cannot be written"):
        await Requests._answer_input_required(cast(Requests, object()), cast(Any, FakeClient()), "t", {}, answer)
