"""The relay's side doors, tried from outside with a prying backend (tests/fixtures/prying_server.py):
a question raised while another client's call is in flight, a 2026-07-28 client that cancels its
write, a person slower than the backend's own timeout, a round of several questions, a prompt that
asks the user, and the audit line of each relayed request."""

from __future__ import annotations

import errno
import json
import os
import sys
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from pydantic import FileUrl

from mcp_spec_proxy.fronts.relay import MAX_WAITING_PER_SESSION
from tests.harness import ERAS, text_of
from tests.test_relay import http_proxy, proxy_params

pytestmark = pytest.mark.anyio

PRYING = Path(__file__).parent / "fixtures" / "prying_server.py"


def prying(tmp: Path, *flags: str, **extra: Any) -> dict[str, Any]:
    for name in ("entered", "release"):
        if not (tmp / name).exists():
            os.mkfifo(tmp / name)
    env = {
        "PRYING_ENTERED": str(tmp / "entered"),
        "PRYING_RELEASE": str(tmp / "release"),
        "PRYING_LEDGER": str(tmp / "ledger"),
    }
    return {"command": sys.executable, "args": [str(PRYING), *flags], "env": env, **extra}


async def user(context: Any, params: Any) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"username": "ada"})


async def roots(context: Any) -> types.ListRootsResult:
    return types.ListRootsResult(roots=[types.Root(uri=FileUrl("file:///home/ada"))])


async def fifo(path: Path, text: str | None = None) -> str:
    """Read the named pipe (or write `text` to it), off the event loop."""
    if text is None:
        return await anyio.to_thread.run_sync(path.read_text, abandon_on_cancel=True)
    await anyio.to_thread.run_sync(path.write_text, text, abandon_on_cancel=True)
    return text


def release_if_waited(path: Path) -> None:
    """Let a held write go, if it still waits: a write cancelled before it opened the pipe never
    will, and a blocking write would wait for it for ever (seen under load)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # nobody has the pipe open for reading
            return
        raise
    with os.fdopen(descriptor, "w") as pipe:
        pipe.write("go")


async def test_a_question_while_another_clients_call_is_in_flight_asks_neither_client(tmp_path: Path) -> None:
    """Client A's completion makes a handshake-era backend ask for sampling while B's write is in
    flight on it: that request names no call, so neither A's user nor B's is shown it."""
    asked: dict[str, list[str]] = {"A": [], "B": []}

    def sampler(name: str) -> Any:
        async def sample(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
            asked[name].append(str(params.messages[0].content))
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=name), model="m"
            )

        return sample

    config = {"servers": {"p": prying(tmp_path, "--legacy-only")}, "review": {"default": "allow"}}
    ref = types.PromptReference(type="ref/prompt", name="p__greet")
    with anyio.fail_after(60):
        async with (
            http_proxy(tmp_path, config) as url,
            Client(url, mode="legacy", sampling_callback=sampler("A")) as a,
            Client(url, mode="legacy", sampling_callback=sampler("B")) as b,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(b.call_tool, "p__held_write", {})
            await fifo(tmp_path / "entered")  # B's write is in flight at the backend
            values = (await a.complete(ref, {"name": "who", "value": "A-secret"})).completion.values
            await fifo(tmp_path / "release", "go")
        async with Client(proxy_params(tmp_path, config), mode="legacy", sampling_callback=sampler("A")) as a:
            alone = (await a.complete(ref, {"name": "who", "value": "alone"})).completion.values
    assert asked["B"] == [] and "A-secret" not in json.dumps(asked)
    assert values[0].startswith("error: mcp-spec-proxy cannot tell which client") and "several clients" in values[0]
    assert alone == ["A"] and len(asked["A"]) == 1  # with no one else's call in flight, A is asked


@pytest.mark.parametrize("era", ERAS)
async def test_a_write_its_client_cancels_is_cancelled_at_the_backend(tmp_path: Path, era: str) -> None:
    """Also for a 2026-07-28 client that could be asked something, whose call runs suspended."""
    config = {"servers": {"p": prying(tmp_path)}, "review": {"default": "allow"}}
    with anyio.fail_after(60):
        async with Client(proxy_params(tmp_path, config), mode=era, elicitation_callback=user) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "p__held_write", {})
                await fifo(tmp_path / "entered")
                tg.cancel_scope.cancel()  # the client gives up on its write while the backend runs it
            how = text_of(await client.call_tool("p__how_did_held_write_end", {}))
            release_if_waited(tmp_path / "release")
    assert how == "cancelled"
    assert not (tmp_path / "ledger").exists()


@pytest.mark.parametrize("era", ERAS)
async def test_a_person_slower_than_the_backends_timeout_is_not_cut_off(tmp_path: Path, era: str) -> None:
    """The backend's `timeout` is its own time to answer; its wait for the client is not counted."""

    async def slow(context: Any, params: Any) -> types.ElicitResult:
        await anyio.sleep(1.5)  # longer than the backend's timeout below: a person reading the form
        return await user(context, params)

    config = {"servers": {"p": prying(tmp_path, timeout=1)}, "review": {"default": "allow"}}
    with anyio.fail_after(60):
        async with Client(proxy_params(tmp_path, config), mode=era, elicitation_callback=slow) as client:
            said = text_of(await client.call_tool("p__ask_user", {}))
    assert said == "user said {'username': 'ada'}"


async def test_a_round_of_two_questions_reaches_a_2026_client_as_one_round_under_the_backends_keys(
    tmp_path: Path,
) -> None:
    config = {"servers": {"p": prying(tmp_path, protocol="auto")}, "review": {"default": "allow"}}
    with anyio.fail_after(60):
        async with Client(
            proxy_params(tmp_path, config), mode="2026-07-28", elicitation_callback=user, list_roots_callback=roots
        ) as client:
            session = client.session
            first = await session.call_tool("p__two_questions", {}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult)
            assert sorted(first.input_requests or {}) == ["a", "b"]
            answers: types.InputResponses = {"a": await user(None, None), "b": await roots(None)}
            done = await session.call_tool(
                "p__two_questions", {}, input_responses=answers, request_state=first.request_state
            )
    assert text_of(done) == "answered a,b"


@pytest.mark.parametrize("era", ERAS)
async def test_a_prompt_that_asks_the_user_works_through_the_proxy_in_both_eras(tmp_path: Path, era: str) -> None:
    config = {"servers": {"p": prying(tmp_path)}, "review": {"default": "allow"}}
    with anyio.fail_after(60):
        async with Client(proxy_params(tmp_path, config), mode=era, elicitation_callback=user) as client:
            prompt = await client.get_prompt("p__greet")
    content = prompt.messages[0].content
    assert isinstance(content, types.TextContent) and content.text == "hello {'username': 'ada'}"
    audit = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    relayed = [row for row in audit if row.get("event") == "relayed"]
    assert [(row["server"], row["method"]) for row in relayed] == [("p", "elicitation/create")]
    assert relayed[0]["session"]  # the session it was asked for, in both eras


@pytest.mark.parametrize("front", ["stdio", "http"])
async def test_a_backend_puts_no_more_than_the_cap_of_questions_before_a_handshake_era_user(
    tmp_path: Path, front: str
) -> None:
    """A backend asks 200 questions at once during one read: 64 (one session's cap, as on the
    2026-07-28 era) reach the person, and the rest are refused at once with words that say why.
    On stdio the read is served past the SDK (its connection is asked), over HTTP on its stream."""
    count, waiting, peak = 200, 0, 0
    release = anyio.Event()

    async def person(context: Any, params: Any) -> types.ElicitResult:
        nonlocal waiting, peak
        waiting += 1
        peak = max(peak, waiting)
        if waiting > MAX_WAITING_PER_SESSION:
            release.set()  # past the cap already: no need to wait for the refusals
        await release.wait()
        waiting -= 1
        return await user(context, params)

    said = ""
    config = {"servers": {"p": prying(tmp_path)}, "review": {"default": "allow"}}
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            where = (
                proxy_params(tmp_path, config)
                if front == "stdio"
                else await stack.enter_async_context(http_proxy(tmp_path, config))
            )
            client = await stack.enter_async_context(Client(where, mode="legacy", elicitation_callback=person))

            async def ask_many() -> None:
                nonlocal said
                said = text_of(await client.call_tool("p__ask_many", {"count": count}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask_many)
                refusals = await client.call_tool("p__refusals", {"at_least": count - MAX_WAITING_PER_SESSION})
                release.set()
    assert peak == MAX_WAITING_PER_SESSION
    assert text_of(refusals) == str(count - MAX_WAITING_PER_SESSION)
    answered = f"answered {MAX_WAITING_PER_SESSION}, refused {count - MAX_WAITING_PER_SESSION}: "
    assert said.startswith(answered), said
    assert "mcp-spec-proxy did not relay this elicitation/create: 64 of this session's questions wait" in said


async def test_a_client_that_leaves_mid_call_frees_the_backend_for_the_next_client(tmp_path: Path) -> None:
    """A's session ends while its write runs at a shared handshake-era backend: the write is
    cancelled there at once, and B's call is asked B's question (not refused because A's call
    is still in flight)."""
    config = {"servers": {"p": prying(tmp_path, "--legacy-only")}, "review": {"default": "allow"}}
    with anyio.fail_after(60):
        async with http_proxy(tmp_path, config) as url:
            async with Client(url, mode="legacy") as a, anyio.create_task_group() as tg:
                tg.start_soon(a.call_tool, "p__held_write", {})
                await fifo(tmp_path / "entered")
                tg.cancel_scope.cancel()  # A goes away, its call in flight
            async with Client(url, mode="legacy", elicitation_callback=user) as b:
                how = text_of(await b.call_tool("p__how_did_held_write_end", {}))
                asked = await b.call_tool("p__ask_user", {})
            release_if_waited(tmp_path / "release")
    assert how == "cancelled"
    assert not asked.is_error, asked
    assert not (tmp_path / "ledger").exists()
