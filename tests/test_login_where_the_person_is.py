"""A remote backend's login reached where the person is: the approval console's card, or the client's
own URL elicitation, with a real proxy process, the toy behind the authorization server of
tests/test_backend_login_flow.py, and a browser program that only notes the page it was asked to open
(so nothing but the card's link, or the client's answer, can finish the login).
"""

from __future__ import annotations

import html
import json
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import mcp_types as types
import pytest
import yaml
from mcp.client.client import Client
from mcp.client.context import ClientRequestContext
from mcp.client.session import IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from mcp_spec_proxy.fronts.asgi import serve_asgi
from tests.harness import PROXY_COMMAND, proxy_env, recorded, toy
from tests.test_backend_login_flow import Tracker, _appears, _free_port

pytestmark = pytest.mark.anyio

NOTING_BROWSER = """\
import pathlib, sys, time
(pathlib.Path(sys.argv[1]) / f"url-{time.monotonic_ns()}").write_text(sys.argv[2])
"""


def _follow(url: str) -> None:
    """A browser at `url`: the authorization server's page sends it on to the proxy's loopback redirect."""
    urllib.request.urlopen(url, timeout=10).read()


def _get(url: str, cookie: str = "") -> tuple[int, str, str]:
    """A GET that does not follow redirects: status, body, the cookie it sets."""

    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    request = urllib.request.Request(url, headers={"cookie": cookie} if cookie else {})
    try:
        with urllib.request.build_opener(Stay).open(request, timeout=10) as answer:
            return answer.status, answer.read().decode(), ""
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode(), (refused.headers.get("set-cookie") or "").split(";")[0]


def _first_event(url: str, cookie: str) -> Any:
    """The data of the first event of the console's event stream."""
    request = urllib.request.Request(url, headers={"cookie": cookie})
    with urllib.request.urlopen(request, timeout=10) as stream:
        while not (line := stream.readline().decode()).startswith("data: "):
            pass
    return json.loads(line.removeprefix("data: "))


class Listening:
    def __init__(self) -> None:
        self.changed = anyio.Event()
        self.completed: list[str] = []

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changed.set()
        elif isinstance(message, types.ElicitCompleteNotification):
            self.completed.append(message.params.elicitation_id)

    async def tools_of(self, client: Client, name: str) -> list[str]:
        """Waits for list changes until `name` is listed."""
        with anyio.fail_after(60):
            while name not in (listed := [tool.name for tool in (await client.list_tools()).tools]):
                await self.changed.wait()
                self.changed = anyio.Event()
        return listed


def _setup(tmp_path: Path, tracker: Tracker, *extra: str) -> tuple[list[str], dict[str, str], Path]:
    remote = {"url": f"{tracker.base}/mcp", "auth": {"callback_port": _free_port()}}
    config = {"servers": {"toy": toy(tmp_path / "ledger"), "remote": remote}, "review": {"default": "allow"}}
    (tmp_path / "servers.yaml").write_text(yaml.safe_dump(config))
    browser_dir = tmp_path / "browser"
    browser_dir.mkdir()
    (tmp_path / "browser.py").write_text(NOTING_BROWSER)
    env = {**proxy_env(), "BROWSER": f"{sys.executable} {tmp_path / 'browser.py'} {browser_dir} %s"}
    argv = ["--config", str(tmp_path / "servers.yaml"), "--state-dir", str(tmp_path / "state"), *extra]
    return argv, env, browser_dir


async def test_a_desktop_client_is_told_where_to_go_and_the_consoles_card_logs_in(tmp_path: Path) -> None:
    """No terminal, no URL elicitation: the call is refused with one line naming the console (not its
    key); the console's guarded page shows 'Log in to remote' with the authorization link; a browser
    following that link finishes the login; the client hears list_changed and the tools serve."""
    tracker = Tracker(tmp_path / "remote-ledger")
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        argv, env, browser_dir = _setup(tmp_path, tracker, "--console", f"127.0.0.1:{_free_port()}")
        listening = Listening()
        with (tmp_path / "proxy.log").open("w") as errlog:
            params = StdioServerParameters(command=PROXY_COMMAND, args=argv, env=env)
            async with Client(stdio_client(params, errlog=errlog), mode="legacy", message_handler=listening) as client:
                [opened] = await _appears(browser_dir, "url-*", 1)
                listed = [tool.name for tool in (await client.list_tools()).tools]
                assert "toy__record" in listed and not any(name.startswith("remote__") for name in listed)
                try:
                    refused = await client.call_tool("remote__record", {"value": "too early"})
                    said = " ".join(getattr(part, "text", "") for part in refused.content)
                    assert refused.is_error
                except MCPError as error:
                    said = error.error.message
                link = (tmp_path / "state" / "console-url").read_text().strip()
                key = re.search(r"token=([^&\s]+)", link)
                assert key is not None
                origin = link.split("/?", 1)[0].rstrip("/")
                assert f"waits for a login: open the proxy's approval console at {origin}" in said, said
                assert "\n" not in said and key.group(1) not in said

                status, unguarded, _ = await anyio.to_thread.run_sync(_get, f"{origin}/")
                assert status == 403 and "Log in to" not in unguarded and opened.read_text() not in unguarded
                status, _, cookie = await anyio.to_thread.run_sync(_get, link)
                assert status in (302, 303, 307) and cookie
                status, page, _ = await anyio.to_thread.run_sync(_get, f"{origin}/", cookie)
                assert status == 200 and "<h2>Log in to remote</h2>" in page
                found = re.search(r'class="login-link" href="([^"]+)"', page)
                assert found is not None
                authorize = html.unescape(found.group(1))
                # A page opened earlier learns of it from its event stream and fetches the cards.
                event = await anyio.to_thread.run_sync(_first_event, f"{origin}/events", cookie)
                assert event["logins"] == ["remote"]
                status, cards, _ = await anyio.to_thread.run_sync(_get, f"{origin}/logins", cookie)
                assert status == 200 and f'href="{found.group(1)}"' in cards
                assert (await anyio.to_thread.run_sync(_get, f"{origin}/logins"))[0] == 403
                assert authorize == opened.read_text() and key.group(1) not in authorize
                assert authorize.startswith(f"{tracker.base}/authorize?")

                await anyio.to_thread.run_sync(_follow, authorize)
                listed = await listening.tools_of(client, "remote__record")
                results: list[types.CallToolResult] = []

                async def call() -> None:
                    results.append(await client.call_tool("remote__record", {"value": "after the card"}))

                async with anyio.create_task_group() as calling:  # the write asks a wider scope: a second card
                    calling.start_soon(call)
                    await _appears(browser_dir, "url-*", 2)
                    status, page, _ = await anyio.to_thread.run_sync(_get, f"{origin}/", cookie)
                    found = re.search(r'class="login-link" href="([^"]+)"', page)
                    assert found is not None
                    assert parse_qs(urlsplit(html.unescape(found.group(1))).query)["scope"] == ["read write"]
                    await anyio.to_thread.run_sync(_follow, html.unescape(found.group(1)))
                    with anyio.fail_after(60):
                        while not results:  # noqa: ASYNC110 -- the call's answer is the sign
                            await anyio.sleep(0.05)
                [result] = results
                status, page, _ = await anyio.to_thread.run_sync(_get, f"{origin}/", cookie)
                assert status == 200 and "Log in to remote" not in page  # the card goes with the login
                assert (await anyio.to_thread.run_sync(_first_event, f"{origin}/events", cookie))["logins"] == []
        tg.cancel_scope.cancel()
    assert not result.is_error, result
    assert recorded(tracker.ledger) == ['{"value": "after the card"}']
    assert [a.get("scope") for a in tracker.authorizations] == ["read", "read write"]
    assert not [token for token in [*tracker.issued, *tracker.refresh_tokens] if token in page]


async def test_a_client_that_takes_url_elicitation_is_asked_to_log_in_through_it(tmp_path: Path) -> None:
    """A client declaring URL elicitation gets `elicitation/create` with `mode: "url"` and the
    authorization link; it answers by following the link, the login completes, the client is told
    the elicitation is complete, and the server's tools arrive and serve."""
    tracker = Tracker(tmp_path / "remote-ledger")
    asked: list[types.ElicitRequestURLParams] = []

    async def elicit(context: ClientRequestContext, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams), params
        asked.append(params)
        await anyio.to_thread.run_sync(_follow, params.url)
        return types.ElicitResult(action="accept")

    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        argv, env, browser_dir = _setup(tmp_path, tracker, "--no-console")
        listening = Listening()
        with (tmp_path / "proxy.log").open("w") as errlog:
            params = StdioServerParameters(command=PROXY_COMMAND, args=argv, env=env)
            transport = stdio_client(params, errlog=errlog)
            asking = Client(transport, mode="legacy", message_handler=listening, elicitation_callback=elicit)
            async with asking as client:
                listed = await listening.tools_of(client, "remote__record")
                with anyio.fail_after(60):
                    result = await client.call_tool("remote__record", {"value": "after the elicitation"})
                with anyio.fail_after(30):
                    while len(listening.completed) < 2:  # noqa: ASYNC110 -- the notification is the only sign
                        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    opened = [path.read_text() for path in sorted(browser_dir.glob("url-*"))]
    assert "toy__record" in listed and len(opened) == 2  # the first login, then the write's wider scope
    assert [a.url for a in asked] == opened and all(url.startswith(f"{tracker.base}/authorize?") for url in opened)
    assert "'remote'" in asked[0].message and listening.completed == [a.elicitation_id for a in asked]
    assert not result.is_error and recorded(tracker.ledger) == ['{"value": "after the elicitation"}']
    assert [a.get("scope") for a in tracker.authorizations] == ["read", "read write"]  # the write's step-up too


def test_the_card_makes_only_an_http_link_and_escapes_what_a_server_names() -> None:
    """A hostile authorization server's metadata may name any URL: only an http(s) one becomes a link,
    and nothing it holds reaches the page as markup."""
    from mcp_spec_proxy.fronts.console.pages import login_cards

    page = login_cards({"evil": "javascript:alert(1)", "odd": 'https://id.example/a?x="><script>'})
    assert 'href="javascript:' not in page and "<code>javascript:alert(1)</code>" in page
    assert "<script>" not in page and 'href="https://id.example/a?x=&quot;&gt;&lt;script&gt;"' in page
