"""A remote MCP server behind a real authorization server (npm `oidc-provider`), reached through the real
proxy process with `auth: oauth`, logged in to in Chromium through the approval console's card.

One story runs once for the module (`story`): the login card clicked, the authorization server's own
login and consent pages filled in and clicked; three readers at once while the 5-second access token
expires (refreshed, rotated, no call fails); a write that needs the wider scope `write` (the server's 403
`insufficient_scope`), logged in to again from the console, run once after its verdict; then every
refresh token revoked at the authorization server, so the next refresh fails, the console asks for a
login again, and the write is refused in one line that names the login, never run. The tests below read
what the story saw. Ground truth: the protected server's ledger (what ran) and the authorization
server's own list of the tokens it gave. With OTLP traces, the telemetry file, JSON logs at DEBUG, the
audit trail, `/metrics`, the console's pages and the client's answers all captured, none holds a token.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.calls.results import CALL_META
from mcp_spec_proxy.fronts.asgi import serve_asgi
from tests.harness import proxy_env
from tests.oidc_world import OIDC_PROVIDER, Notes, receiving, start_authorization_server
from tests.ops_world import SERVING, serving, until
from tests.test_backend_login_flow import _free_port
from tests.test_console import CHROMIUM, WAIT_MS, playwright
from tests.test_login_where_the_person_is import NOTING_BROWSER

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium: apt-get install chromium (scripts/test.sh does)"),
    pytest.mark.skipif(
        not OIDC_PROVIDER.exists(), reason="oidc-provider not installed: scripts/install-test-backends.sh"
    ),
]

ACCESS_TTL = 5  # seconds: the reads outlive the first access token
READERS = 3  # clients' reads at once while it expires
LOGIN_TIMEOUT = 20  # seconds a login waits for the person: the last one waits in vain


@dataclass
class Seen:
    """What the story saw, for the tests to judge."""

    tmp: Path
    given: dict[str, list[str]] = field(default_factory=dict)
    reads: list[types.CallToolResult] = field(default_factory=list)
    refreshed_during_reads: bool = False
    ledger_before_write: list[str] = field(default_factory=list)
    write: types.CallToolResult | None = None
    refused_scope: int = 0
    after_revocation: str = ""
    after_revocation_was_error: bool = False
    revoked: int = 0
    asked_again: bool = False
    ledger_at_the_end: list[str] = field(default_factory=list)
    login_urls: list[str] = field(default_factory=list)
    pages: list[str] = field(default_factory=list)
    captured: dict[str, bytes] = field(default_factory=dict)
    token_file: bytes = b""
    call_ids: dict[str, str] = field(default_factory=dict)


async def _through_the_login(tab: Any, link: str, seen: Seen) -> None:
    """From the console's card to the authorization server's pages and back to the proxy's redirect."""
    await tab.goto(link)
    card = tab.locator("article.login", has_text="Log in to notes")
    await card.wait_for()
    seen.pages.append(await tab.content())
    await tab.locator("a.login-link").click()
    sign_in = tab.locator("input[name=login]")
    consent = tab.get_by_role("button", name="Continue")
    done = tab.get_by_text("Logged in")
    for _ in range(4):
        await sign_in.or_(consent).or_(done).first.wait_for()
        if await done.count():
            return
        if await sign_in.count():
            await sign_in.fill("alice")
            await tab.locator("input[name=password]").fill("any password")
            await tab.get_by_role("button", name="Sign-in").click()
        else:
            await consent.click()
        await tab.wait_for_load_state()
    await done.wait_for()


def _text(result: types.CallToolResult) -> str:
    return " ".join(getattr(part, "text", "") for part in result.content)


async def _tell(seen: Seen) -> None:
    browser_dir = seen.tmp / "browser"
    browser_dir.mkdir()
    (seen.tmp / "browser.py").write_text(NOTING_BROWSER)
    port = _free_port()
    notes = Notes(seen.tmp / "ledger", f"http://127.0.0.1:{port}", "")
    async with anyio.create_task_group() as tg:
        authorization, as_process = await start_authorization_server(tg, notes.resource, ACCESS_TTL)
        notes.issuer = authorization.issuer
        await tg.start(lambda task_status: serve_asgi(notes.app(), "127.0.0.1", port, task_status=task_status))
        with receiving() as receiver:
            remote = {"url": notes.resource, "auth": {"callback_port": _free_port(), "login_timeout": LOGIN_TIMEOUT}}
            telemetry = {"otlp": receiver.url, "file": str(seen.tmp / "state" / "telemetry.jsonl")}
            config = {"servers": {"notes": remote}, "review": {"default": "allow"}, "telemetry": telemetry}
            env = {**proxy_env(), "BROWSER": f"{sys.executable} {seen.tmp / 'browser.py'} {browser_dir} %s"}
            console = ["--console", f"127.0.0.1:{_free_port()}", "--log-format", "json", "--log-level", "DEBUG"]
            async with (
                serving(config, seen.tmp, *console, env=env) as proxy,
                playwright.async_playwright() as p,
            ):
                url = (await proxy.line(SERVING)).group(1)
                browser = await p.chromium.launch(executable_path=CHROMIUM)
                try:
                    tab = await (await browser.new_context()).new_page()
                    tab.set_default_timeout(WAIT_MS)
                    with anyio.fail_after(60):
                        await until(lambda: (seen.tmp / "state" / "console-url").exists())
                    link = (seen.tmp / "state" / "console-url").read_text().strip()
                    await _through_the_login(tab, link, seen)
                    async with (
                        httpx2.AsyncClient(timeout=120) as http,
                        Client(streamable_http_client(url, http_client=http)) as client,
                        Client(streamable_http_client(url, http_client=http), mode="legacy") as legacy,
                    ):
                        await _story(seen, notes, authorization, (client, legacy), tab, link)
                    seen.captured["metrics"] = (await proxy.get("/metrics")).content
                    proxy.terminate()
                    await proxy.wait()
                finally:
                    await browser.close()
                    (seen.tmp / "proxy.log").write_text("".join(proxy.lines))
                seen.captured["proxy stderr"] = "".join(proxy.lines).encode()
        seen.given = await authorization.given()
        seen.captured["otlp"] = b"".join(receiver.bodies)
        as_process.terminate()
        tg.cancel_scope.cancel()
    seen.refused_scope = notes.refused_scope
    seen.login_urls = [path.read_text() for path in sorted(browser_dir.glob("url-*"))]
    for path in sorted((seen.tmp / "state").rglob("*")):
        if path.is_file() and "oauth" not in path.relative_to(seen.tmp / "state").parts:
            seen.captured[str(path.relative_to(seen.tmp))] = path.read_bytes()
    answers = [*seen.reads, *([seen.write] if seen.write else [])]
    seen.captured["the client's answers"] = "\n".join([*map(_text, answers), seen.after_revocation]).encode()
    for number, page in enumerate(seen.pages):
        seen.captured[f"console page {number}"] = page.encode()


async def _story(
    seen: Seen, notes: Notes, authorization: Any, clients: tuple[Client, Client], tab: Any, link: str
) -> None:
    client, legacy = clients  # a 2026-07-28 client, and a handshake-era one on a backend session of its own
    with anyio.fail_after(60):
        while "notes__read" not in [tool.name for tool in (await client.list_tools()).tools]:  # noqa: ASYNC110 -- the catalog is the sign
            await anyio.sleep(0.05)
    # Reads while the access token expires: three readers at once (one of them a handshake-era client),
    # each call after its last, until the authorization server has answered a refresh and each reader has
    # read three times since.
    numbers = iter(range(10_000))

    async def reader(client: Client) -> None:
        after_refresh = 0
        while after_refresh < 3:
            seen.reads.append(await client.call_tool("notes__read", {"n": next(numbers)}))
            if any(grant == "refresh_token ok" for grant in (await authorization.given())["grants"]):
                seen.refreshed_during_reads = True
                after_refresh += 1

    with anyio.fail_after(90):
        async with anyio.create_task_group() as readers:
            for reading in [legacy, *[client] * (READERS - 1)]:
                readers.start_soon(reader, reading)
    seen.ledger_before_write = list(notes.lines)
    # The write needs scope `write`: the server refuses the token it has, and a login for the wider scope
    # waits on the console's card while the write waits.
    results: list[types.CallToolResult] = []

    async def write(value: str) -> None:
        results.append(await client.call_tool("notes__write", {"value": value}))

    async with anyio.create_task_group() as calling:
        calling.start_soon(write, "once")
        await _through_the_login(tab, link, seen)
    [seen.write] = results
    if seen.write.meta is not None:
        seen.call_ids["write"] = seen.write.meta[CALL_META]
    seen.token_file = (seen.tmp / "state" / "oauth" / "notes.json").read_bytes()
    # Every refresh token revoked; once the access token has expired, the next refresh is refused.
    seen.revoked = await authorization.revoke_refresh_tokens()
    await anyio.sleep(ACCESS_TTL + 1)  # the access token the proxy holds expires

    async def write_after_the_revocation() -> None:
        try:
            refused = await client.call_tool("notes__write", {"value": "after the revocation"})
            seen.after_revocation, seen.after_revocation_was_error = _text(refused), refused.is_error
        except MCPError as error:
            seen.after_revocation, seen.after_revocation_was_error = error.error.message, True

    with anyio.fail_after(2 * LOGIN_TIMEOUT + 60):
        async with anyio.create_task_group() as calling:
            calling.start_soon(write_after_the_revocation)
            # The refused refresh leads back to a login: the console's card again, which nobody follows.
            await tab.goto(link)
            await tab.locator("article.login", has_text="Log in to notes").wait_for()
            seen.pages.append(await tab.content())
            seen.asked_again = True
    seen.ledger_at_the_end = list(notes.lines)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Seen:
    seen = Seen(tmp_path_factory.mktemp("oidc"))
    anyio.run(_tell, seen)
    return seen


def test_the_login_is_pkce_with_the_resource_and_the_authorization_server_issued_jwts_for_it(story: Seen) -> None:
    first = parse_qs(urlsplit(story.login_urls[0]).query)
    assert first["code_challenge_method"] == ["S256"] and first["response_type"] == ["code"]
    assert first["resource"][0].endswith("/mcp")
    assert first["scope"] == ["read offline_access"]  # the challenge's scope, and refreshes (the server offers them)
    assert story.given["grants"][0] == "authorization_code ok"
    assert all(token.count(".") == 2 for token in story.given["access"])  # JWTs, checked against the JWKS


def test_reads_outlive_the_access_token_by_a_refresh_and_none_fails(story: Seen) -> None:
    assert story.refreshed_during_reads and len(story.reads) >= 3 * READERS + 1
    assert [r.is_error for r in story.reads] == [False] * len(story.reads), [_text(r) for r in story.reads]
    # Each read ran once, by the protected server's ledger: none lost, none sent twice.
    assert sorted(story.ledger_before_write) == sorted(f"read {n}" for n in range(len(story.reads)))
    refreshes = [grant for grant in story.given["grants"] if grant.startswith("refresh_token")]
    assert "refresh_token ok" in refreshes
    assert len(set(story.given["refresh"])) == len(story.given["refresh"])  # rotated: a new one each time


def test_the_write_steps_up_to_the_wider_scope_through_the_console_and_runs_once_after_its_verdict(
    story: Seen,
) -> None:
    assert story.write is not None and not story.write.is_error, _text(story.write) if story.write else None
    assert story.refused_scope >= 1  # the server's 403 insufficient_scope came first
    first, second = (parse_qs(urlsplit(url).query) for url in story.login_urls[:2])
    assert set(second["scope"][0].split()) == {"read", "offline_access", "write"}
    # The client was registered for `read offline_access`, which oidc-provider keeps as its ceiling: the
    # wider login comes from a client registered anew for it.
    assert first["client_id"] != second["client_id"]
    assert story.ledger_at_the_end.count("write once") == 1
    audit = read_audit(story.tmp / "state" / "audit.jsonl")
    events = [row["event"] for row in audit if row.get("call") == story.call_ids["write"]]
    assert events == ["held", "verdict", "forwarded"]


def test_a_revoked_refresh_token_leads_back_to_the_login_in_one_line_and_the_write_does_not_run(story: Seen) -> None:
    assert story.revoked >= 1 and story.asked_again  # the console asked for a login again while the write waited
    assert "refresh_token invalid_grant" in story.given["grants"]  # the authorization server refused the refresh
    said = story.after_revocation
    assert story.after_revocation_was_error and "\n" not in said and "Traceback" not in said, said
    assert "it was not run" in said and "`mcp-spec-proxy login notes`" in said and "'Log in to notes'" in said, said
    assert "write after the revocation" not in story.ledger_at_the_end
    audit = read_audit(story.tmp / "state" / "audit.jsonl")
    writes = [row["call"] for row in audit if row["event"] == "held" and row.get("tool") == "notes__write"]
    assert len(writes) == 2 and writes[0] == story.call_ids["write"]
    assert [row["event"] for row in audit if row.get("call") == writes[1]] == ["held", "verdict", "unsent"]


def test_no_token_is_in_the_logs_audit_spans_metrics_telemetry_or_console_pages(story: Seen) -> None:
    tokens = [*story.given["access"], *story.given["refresh"]]
    assert tokens and story.given["refresh"][0] and story.captured["otlp"] and story.captured["metrics"]
    assert any(t.encode() in story.token_file for t in story.given["refresh"])  # the grep finds one where it is kept
    assert {"proxy stderr", "state/audit.jsonl", "state/telemetry.jsonl", "console page 0"} <= set(story.captured)
    leaks = [
        (where, n) for where, data in story.captured.items() for n, token in enumerate(tokens) if token.encode() in data
    ]
    signatures = [token.rsplit(".", 1)[-1].encode() for token in story.given["access"]]
    leaks += [(where, -1) for where, data in story.captured.items() for s in signatures if s in data]
    assert leaks == []
    json.loads(story.captured["proxy stderr"].decode().splitlines()[0])  # JSON logs were on
