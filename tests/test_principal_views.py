"""The principal everywhere: under `auth:` who asks is named on the approval console's card, on the
call's spans (its subject only), on the audit lines of prompts, resources and completions, and
LEASH counts its labels by principal — one principal's many sessions are one witness, two
principals are two. Tokens come from a real authorization server (`tests/oauth.py`); the toy's
ledger says what ran, the audit log what the proxy says."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.asgi import host_names
from mcp_spec_proxy.fronts.console import Console, serve_console
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.fronts.probes import Door
from mcp_spec_proxy.observe.telemetry import SUBJECT
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import Respond, ScriptedModelServer
from tests.fixtures import feature_server
from tests.harness import ERAS, recorded, toy, toy_twins
from tests.oauth import AuthServer, authorization_server
from tests.ops_world import SERVING, serving, until
from tests.test_access_identity import client
from tests.test_leash_provenance import Strong, leash_section, look_alike
from tests.test_telemetry_otlp import accept, receiving

pytestmark = pytest.mark.anyio

HOSTILE = '<img src=x onerror="document.title=1">\u202eann'  # a subject is the issuer's text, shown as text


@dataclass
class Front:
    url: str
    state: Path
    auth: AuthServer
    console: str | None  # the console's link with its key, where one is served

    async def token(self, sub: str, client_id: str | None = None) -> str:
        return await self.auth.mint(sub=sub, client_id=client_id or f"cli-{sub}", aud=self.url, scope="mcp")

    def audit(self, event: str) -> list[dict[str, Any]]:
        return [line for line in read_audit(self.state / "audit.jsonl") if line["event"] == event]


@asynccontextmanager
async def identified(tmp_path: Path, **sections: Any) -> AsyncIterator[Front]:
    """The HTTP front under `auth:` over the toy (`rec`) and a server with prompts and resources
    (`feat`), with `sections` of servers.yaml; the approval console served where `review` is it."""
    async with authorization_server() as auth, anyio.create_task_group() as tg:
        door = Door(token=None, hosts=host_names("127.0.0.1"))
        port = await tg.start(door.serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/mcp"
        raw = {
            "servers": {"toy": toy(tmp_path / "rec"), "feat": {"command": "-"}},
            "auth": {"issuer": auth.issuer, "audience": url, "scopes": ["mcp"]},
            **sections,
        }
        in_process = {**toy_twins(raw), "feat": feature_server.build()}
        config = ProxyConfig.model_validate(raw)
        async with running_proxy(config, StatePaths(tmp_path / "state"), in_process=in_process) as proxy:
            link = None
            if proxy.console is not None:
                site = Console(proxy.console, proxy.store.read_audit, proxy.leash)
                link = await tg.start(lambda task_status: serve_console(site, "127.0.0.1", 0, task_status=task_status))
            await tg.start(functools.partial(serve_http, McpFront(proxy), "127.0.0.1", port, door=door))
            yield Front(url, tmp_path / "state", auth, link)
            tg.cancel_scope.cancel()


# -- the audit lines of prompts, resources and completions ------------------------------------------


@pytest.mark.parametrize("mode", ERAS)
async def test_prompts_resources_and_completions_are_audited_with_the_tokens_principal(
    tmp_path: Path, mode: str
) -> None:
    async with identified(tmp_path, review={"default": "allow"}) as f:
        with anyio.fail_after(60):
            async with client(f.url, await f.token("ann"), mode) as session:
                await session.get_prompt("feat__greet", {"name": "ada"})
                await session.read_resource(feature_server.TODAY)
                prompt = types.PromptReference(type="ref/prompt", name="feat__greet")
                await session.complete(prompt, {"name": "name", "value": "a"})
    ann = {"sub": "ann", "client_id": "cli-ann"}
    for event in ("prompt", "resource", "completion"):
        assert [line.get("principal") for line in f.audit(event)] == [ann], event


async def test_without_auth_a_prompts_audit_line_names_nobody(tmp_path: Path) -> None:
    from tests.harness import proxied

    config = {"servers": {"feat": {"command": "-"}}, "review": {"default": "allow"}}
    async with proxied(config, tmp_path / "state", in_process={"feat": feature_server.build()}) as p:
        await p.client.get_prompt("feat__greet", {"name": "ada"})
    [line] = [line for line in read_audit(tmp_path / "state" / "audit.jsonl") if line["event"] == "prompt"]
    assert "principal" not in line


# -- the approval console ----------------------------------------------------------------------------


async def test_the_console_card_says_who_asked_escaped_as_text(tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.async_api", reason="pip install playwright (the test extra)")
    from tests.test_console import CHROMIUM, WAIT_MS

    if CHROMIUM is None:
        pytest.skip("no system Chromium: apt-get install chromium (scripts/test.sh does)")
    async with identified(tmp_path, review={"default": "console", "timeout": 60, "intent": False}) as f:
        assert f.console is not None
        results: list[types.CallToolResult] = []

        async def write(sub: str, value: str) -> None:
            async with client(f.url, await f.token(sub, "desk<b>top"), "legacy") as session:
                results.append(await session.call_tool("toy__record", {"value": value}))

        async with playwright.async_playwright() as p, anyio.create_task_group() as tg:
            browser = await p.chromium.launch(executable_path=CHROMIUM)
            try:
                page = await browser.new_page()
                page.set_default_timeout(WAIT_MS)
                await page.goto(f.console)
                tg.start_soon(write, HOSTILE, "buy milk")
                card = page.locator("article.call")
                await card.wait_for()
                asked = await card.locator(".principal").inner_text()
                marked = [await card.locator(f".principal {tag}").count() for tag in ("img", "b")]
                title = await page.title()
                await card.get_by_role("button", name="Deny").click()
                await card.locator(".status.ok").wait_for()
            finally:
                await browser.close()
    assert asked == 'asked by <img src=x onerror="document.title=1">⟨U+202E⟩ann (client desk<b>top)'
    assert marked == [0, 1] and title.startswith("Waiting for you")  # no markup of theirs: only the page's <b>
    assert [result.is_error for result in results] == [True] and recorded(tmp_path / "rec") == []
    [held] = f.audit("held")
    assert held["principal"] == {"sub": HOSTILE, "client_id": "desk<b>top"}


# -- spans ---------------------------------------------------------------------------------------------


async def test_a_calls_spans_name_the_subject_alone(tmp_path: Path) -> None:
    audience = "https://proxy.example.com/mcp"
    with receiving() as receiver:
        async with authorization_server() as auth, ScriptedModelServer(Respond(accept)) as model:
            config = {
                "servers": {"toy": toy(tmp_path / "rec")},
                "models": {"strong": {"base_url": model.base_url, "model": "strong-model", "max_retries": 0}},
                "review": {"default": "strong", "intent": False},
                "telemetry": {"otlp": receiver.url},
                "auth": {"issuer": auth.issuer, "audience": audience, "scopes": ["mcp"]},
            }
            token = await auth.mint(sub="ann", client_id="cli-ann", aud=audience, scope="mcp", groups=["finance"])
            async with serving(config, tmp_path) as proxy:
                with anyio.fail_after(60):
                    async with client((await proxy.line(SERVING)).group(1), token, "legacy") as session:
                        read = await session.call_tool("toy__echo", {"text": "hello"})
                        write = await session.call_tool("toy__record", {"value": "traced"})
                    proxy.terminate()
                    assert await proxy.wait() == 0
        assert read.meta is not None and write.meta is not None
        with anyio.fail_after(30):
            await until(lambda: any(span.attributes.get(SUBJECT) for span in receiver.spans))
            await until(lambda: len({span.trace for span in receiver.spans}) >= 2)
    assert recorded(tmp_path / "rec") == ['{"value": "traced"}']
    for call in (read.meta[CALL_META], write.meta[CALL_META]):
        spans = receiver.trace_of(call)
        root = next(span for span in spans if not span.parent)
        assert root.attributes[SUBJECT] == "ann"  # the trace's root: the request's span
        (gate,) = [span for span in spans if span.name.startswith("call ")]
        assert gate.attributes[SUBJECT] == "ann"
    # The subject alone: never the client, its scopes or groups, nor the token.
    every = repr([span.attributes for span in receiver.spans]) + repr([s.resource for s in receiver.spans])
    for secret in ("cli-ann", "finance", token, token.split(".")[1]):
        assert secret not in every


# -- LEASH: labels counted by principal -----------------------------------------------------------------


async def leash_front(tmp_path: Path, labellers: list[str]) -> tuple[Strong, Any, list[str]]:
    """Each of `labellers` (a subject; repeated: the same principal again) has a look-alike accepted by
    the strong model in a session of its own; then `dave` sends another. Dave's verdict, the values
    the strong model judged, and the ledger."""
    strong = Strong()
    async with ScriptedModelServer(Respond(strong)) as server:
        leash = leash_section(tmp_path, server.base_url, "hashed-words")
        models = {"strong": {"base_url": server.base_url, "model": "strong-model", "max_retries": 0}}
        async with identified(tmp_path, models=models, review={"default": "leash"}, leash=leash) as f:
            with anyio.fail_after(120):
                for i, sub in enumerate(labellers):
                    async with client(f.url, await f.token(sub), "legacy") as session:  # a session of its own
                        done = await session.call_tool("toy__record", {"value": look_alike(i)})
                        assert not done.is_error, done
                async with client(f.url, await f.token("dave"), "legacy") as session:
                    benign = await session.call_tool("toy__record", {"value": look_alike(99)})
        assert benign.meta is not None
        [decided] = [line for line in f.audit("verdict") if line["call"] == benign.meta[CALL_META]]
    ledger = [json.loads(line)["value"] for line in recorded(tmp_path / "rec")]
    return strong, decided, ledger


async def test_one_principals_many_sessions_count_as_one_witness_for_review_leash(tmp_path: Path) -> None:
    strong, decided, ledger = await leash_front(tmp_path, ["mallory", "mallory", "mallory"])
    # Three sessions, one principal: one witness, so the strong model decides dave's call.
    assert decided["decided_by"] == "strong" and decided["accepted"]
    assert "1 independent session(s)" in decided["evidence"]["fallback"]
    assert len(strong.judged) == 4 and look_alike(99) in ledger


async def test_three_principals_labels_count_as_three_and_let_review_leash_pass(tmp_path: Path) -> None:
    strong, decided, ledger = await leash_front(tmp_path, ["alice", "bob", "carol"])
    assert decided["decided_by"] == "leash" and decided["accepted"]
    assert len(strong.judged) == 3 and look_alike(99) in ledger  # the fourth passed on LEASH's word


async def test_two_principals_labels_count_as_two(tmp_path: Path) -> None:
    _, decided, _ = await leash_front(tmp_path, ["alice", "bob", "alice"])
    assert decided["decided_by"] == "strong"
    assert "2 independent session(s)" in decided["evidence"]["fallback"]


# -- a request that names no client: `delegate`'s steps, a substitute ------------------------------------


async def test_a_call_whose_request_names_no_client_is_shown_and_labelled_as_its_principals(tmp_path: Path) -> None:
    """The engine's steps (`delegate`) and a reviewer's substitute reach the gate with a request that
    names no client: the gate names it by the call's principal, on the console card and on LEASH's label."""
    from mcp_spec_proxy.calls.gate import GateCall
    from mcp_spec_proxy.principal import Principal
    from mcp_spec_proxy.review import ReviewRequest
    from mcp_spec_proxy.review.console import Decision
    from mcp_spec_proxy.trajectory import History, Segment, Step
    from tests.harness import proxied
    from tests.test_leash_safety import NoUser

    ann = Principal("https://id.example.com/", "ann", "cli-ann", ("mcp",), ("finance",))
    config = {
        "servers": {"toy": toy(tmp_path / "rec")},
        "review": {"default": "console", "timeout": 60, "intent": False},
        "leash": {"bank_dir": str(tmp_path / "banks"), "min_neighbours": 1},
    }
    async with proxied(config, tmp_path / "state", twins=True) as p:
        queue, leash = p.proxy.console, p.proxy.leash
        assert queue is not None and leash is not None
        queue.url = "http://127.0.0.1:9/"  # as the console front sets it: the reviewer waits on the page
        tool = p.proxy.catalog.lookup("toy__record")
        step = Step(tool.name, {"value": "v"}, "write")
        request = ReviewRequest("task-1", tool, {"value": "v"}, None, Segment((step,)), History())
        call = GateCall("task-1", tool, {"value": "v"}, "weak", request, principal=ann)
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.proxy.gate.write, call, NoUser())
            with anyio.fail_after(30):
                while not queue.pending():
                    await queue.changed_since(queue.version)
            [item] = queue.pending()
            queue.decide(item.id, item.digest, Decision("approve"))
        labelled = await leash.step_score(step)
    assert item.principal == ann
    assert recorded(tmp_path / "rec") == ['{"value": "v"}']
    assert [n.provenance.client for n in labelled.neighbours] == [ann.key]


async def test_the_console_history_says_who_asked_each_call_and_filters_by_it(tmp_path: Path) -> None:
    from mcp_spec_proxy.fronts.console import history

    async with identified(tmp_path, review={"default": "allow", "intent": False}) as f:
        with anyio.fail_after(60):
            for sub in ("ann", "bob"):
                async with client(f.url, await f.token(sub), "legacy") as session:
                    await session.call_tool("toy__record", {"value": f"{sub} notes"})
                    await session.call_tool("toy__echo", {"text": f"{sub} reads"})
    rows = history.calls(read_audit(f.state / "audit.jsonl"))
    assert sorted((row.principal, row.kind) for row in rows) == [
        ("ann", "read"),
        ("ann", "write"),
        ("bob", "read"),
        ("bob", "write"),
    ]
    page = history.history_page(rows, {"principal": "ann"})
    assert "<th>asked by</th>" in page and '<td class="principal">ann</td>' in page and ">bob<" not in page
