"""What the approval console tells a person whose decision meets a call that is being stopped.

A card is decided in the same moment its call stops waiting (the replica's second signal, or its
client leaving): the person's approval never reaches the call, and the console must not say "the
call runs now" — it says it came too late and nothing ran. While the replica is shutting down,
an approval that does reach its call says the call runs only if it is forwarded before the stop.
The console's own `decide` route is driven here with the real queue and reviewer; the guard in
front of it (key, Host, origin) has its own tests.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
import pytest
from starlette.requests import Request

from mcp_spec_proxy.fronts.console import STOPPING, TOO_LATE, Console
from mcp_spec_proxy.review import ReviewRequest, Verdict
from mcp_spec_proxy.review.console import ConsoleQueue, ConsoleReviewer, Pending
from mcp_spec_proxy.tools.catalog import CatalogTool
from mcp_spec_proxy.trajectory import History, Segment, Step

pytestmark = pytest.mark.anyio


def _request() -> ReviewRequest:
    definition = types.Tool(name="t__w", input_schema={"type": "object"})
    tool = CatalogTool("t__w", "t", "w", definition, "write", "default", "unannotated", None, None, "", False)
    return ReviewRequest("s", tool, {}, None, Segment((Step("t__w", {}, "write"),)), History())


async def _decision(item: Pending, action: str) -> Request:
    """The page's POST for `item`, its body already read (as the route reads it first)."""
    body = json.dumps({"action": action, "digest": item.digest}).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": f"/decide/{item.id}", "headers": []}
    request = Request({**scope, "path_params": {"item": item.id}}, receive)
    await request.body()
    return request


async def _held(queue: ConsoleQueue) -> Pending:
    with anyio.fail_after(10):
        version = queue.version
        while not queue.pending():
            version = await queue.changed_since(version)
    return queue.pending()[0]


class _NoUser:
    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


async def _no_audit() -> list[dict[str, Any]]:
    return []


@pytest.mark.parametrize("action", ["approve", "deny"])
async def test_a_decision_that_meets_a_call_as_it_is_stopped_says_it_came_too_late_not_that_it_runs(
    action: str,
) -> None:
    queue = ConsoleQueue(60)
    queue.url = "http://127.0.0.1:9/"  # a console is served
    reviewer = ConsoleReviewer(queue)
    console = Console(queue, _no_audit)
    verdicts: list[Verdict] = []
    waits: list[anyio.CancelScope] = []

    async def held_call() -> None:
        with anyio.CancelScope() as waiting:
            waits.append(waiting)
            verdicts.append(await reviewer.review(_request(), _NoUser()))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(held_call)
            request = await _decision(await _held(queue), action)
            waits[0].cancel()  # the call stops waiting, and in the same moment the person decides
            answer = await console.decide(request)
    told = json.loads(bytes(answer.body))
    assert answer.status_code == 409, told
    assert told["error"] == TOO_LATE and "did not run" in told["error"]
    assert verdicts == []  # the call never took the decision


async def test_an_approval_while_the_replica_shuts_down_says_the_call_runs_only_if_forwarded_before_the_stop() -> None:
    queue = ConsoleQueue(60)
    queue.url = "http://127.0.0.1:9/"
    reviewer = ConsoleReviewer(queue)
    console = Console(queue, _no_audit, stopping=lambda: True)  # its drain ran out, or a second signal came
    verdicts: list[Verdict] = []

    async def held_call() -> None:
        verdicts.append(await reviewer.review(_request(), _NoUser()))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(held_call)
            answer = await console.decide(await _decision(await _held(queue), "approve"))
    told = json.loads(bytes(answer.body))
    assert answer.status_code == 200 and told["message"] == STOPPING, told
    assert [verdict.accepted for verdict in verdicts] == [True]


async def test_an_approval_that_reaches_its_call_says_the_call_runs_now() -> None:
    queue = ConsoleQueue(60)
    queue.url = "http://127.0.0.1:9/"
    reviewer = ConsoleReviewer(queue)
    console = Console(queue, _no_audit, stopping=lambda: False)
    verdicts: list[Verdict] = []

    async def held_call() -> None:
        verdicts.append(await reviewer.review(_request(), _NoUser()))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(held_call)
            answer = await console.decide(await _decision(await _held(queue), "approve"))
    told = json.loads(bytes(answer.body))
    assert answer.status_code == 200 and told["message"] == "Approved: the call runs now.", told
    assert [verdict.accepted for verdict in verdicts] == [True]
