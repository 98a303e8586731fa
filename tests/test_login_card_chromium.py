"""A console tab kept open while a remote server waits for its login, in Debian's Chromium: the page
follows the login cards by itself, and a click on one logs in (tests/test_login_where_the_person_is.py
has the same world without a browser)."""

from __future__ import annotations

from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcp_spec_proxy.fronts.asgi import serve_asgi
from tests.harness import PROXY_COMMAND, recorded
from tests.test_backend_login_flow import Tracker, _appears, _free_port
from tests.test_console import CHROMIUM, WAIT_MS, playwright
from tests.test_login_where_the_person_is import Listening, _follow, _setup

pytestmark = pytest.mark.anyio


@pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium: apt-get install chromium (scripts/test.sh does)")
async def test_an_open_console_tab_follows_the_logins_and_its_card_logs_in_in_chromium(tmp_path: Path) -> None:
    """In Chromium: the tab shows the first login's card and drops it once that login is done elsewhere;
    the write's wider scope brings a new card to the same tab by itself; a click on it logs in, and the
    held write goes through."""
    tracker = Tracker(tmp_path / "remote-ledger")
    async with anyio.create_task_group() as tg, playwright.async_playwright() as p:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        argv, env, browser_dir = _setup(tmp_path, tracker, "--console", f"127.0.0.1:{_free_port()}")
        listening = Listening()
        browser = await p.chromium.launch(executable_path=CHROMIUM)
        try:
            tab = await (await browser.new_context()).new_page()
            tab.set_default_timeout(WAIT_MS)
            with (tmp_path / "proxy.log").open("w") as errlog:
                params = StdioServerParameters(command=PROXY_COMMAND, args=argv, env=env)
                async with Client(stdio_client(params, errlog=errlog), mode="legacy", message_handler=listening) as c:
                    [opened] = await _appears(browser_dir, "url-*", 1)
                    await tab.goto((tmp_path / "state" / "console-url").read_text().strip())
                    card = tab.locator("article.login", has_text="Log in to remote")
                    await card.wait_for()
                    await anyio.to_thread.run_sync(_follow, opened.read_text())
                    await card.wait_for(state="detached")  # the page follows: the login is done
                    await listening.tools_of(c, "remote__record")
                    results: list[types.CallToolResult] = []

                    async def call() -> None:
                        results.append(await c.call_tool("remote__record", {"value": "clicked in chromium"}))

                    async with anyio.create_task_group() as calling:
                        calling.start_soon(call)
                        await card.wait_for()  # the step-up's card, in the tab opened before it began
                        await tab.locator("a.login-link").click()
                        await tab.get_by_text("Logged in").wait_for()
                        with anyio.fail_after(60):
                            while not results:  # noqa: ASYNC110 -- the call's answer is the sign
                                await anyio.sleep(0.05)
        finally:
            await browser.close()
        tg.cancel_scope.cancel()
    assert not results[0].is_error and recorded(tracker.ledger) == ['{"value": "clicked in chromium"}']
    assert [a.get("scope") for a in tracker.authorizations] == ["read", "read write"]
