"""A console tab kept open while the client restarts the proxy, as the README tells a desktop user to.

The real command on stdio, twice with one state directory (a client restart); the tab is Debian's
Chromium. The old tab must not go on saying that nothing waits: it says the proxy is gone, then that
a new run serves here with a new key and the command that prints its link; once that link is opened
(in another tab of the same browser) the old tab follows and shows the new run's held call, which
the person approves there. The toy backend's ledger says what ran.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.harness import PROXY_COMMAND, recorded, spawned, toy
from tests.test_console import CHROMIUM, WAIT_MS, playwright

pytestmark = pytest.mark.anyio
NO_CHROMIUM = "no system Chromium: apt-get install chromium (scripts/test.sh does)"


def console_url(tmp: Path) -> str:
    command = [PROXY_COMMAND, "console-url", "--state-dir", str(tmp / "state")]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert printed.returncode == 0, printed.stderr
    return printed.stdout.strip()


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
async def test_a_tab_kept_open_across_a_restart_says_so_and_follows_to_the_new_console(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "console", "timeout": 60}}
    async with playwright.async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM)
        try:
            context = await browser.new_context()
            tab = await context.new_page()
            tab.set_default_timeout(WAIT_MS)
            async with spawned(config, tmp_path):
                first = await anyio.to_thread.run_sync(console_url, tmp_path)
                await tab.goto(first)
                await tab.get_by_text("Nothing is waiting").wait_for()
            # The client restarted the proxy: the first run is gone.
            stopped = tab.locator('#lost p[data-why="stopped"]')
            await stopped.wait_for()
            assert await tab.locator("#empty").is_hidden()  # no "Nothing is waiting" for a proxy that is gone
            async with spawned(config, tmp_path) as client, anyio.create_task_group() as tg:
                result: list[Any] = []
                answered = anyio.Event()

                async def call() -> None:
                    result.append(await client.call_tool("toy__record", {"value": "after restart", "intent": "x"}))
                    answered.set()

                tg.start_soon(call)
                second = await anyio.to_thread.run_sync(console_url, tmp_path)
                assert second != first  # a new key each run
                assert second.split("/?")[0] == first.split("/?")[0]  # the same address: the port is kept
                replaced = tab.locator('#lost p[data-why="replaced"]')
                await replaced.wait_for()  # the new run answers here, and refuses the old key
                text = await replaced.inner_text()
                assert "console-url" in text and "--state-dir" in text  # the command that prints the new link
                assert second.split("token=")[1] not in await tab.content()  # no key on the page
                other = await context.new_page()
                await other.goto(second)  # the person opens the new link, in another tab
                card = tab.locator("article.call:not(.done)")
                await card.wait_for()  # the old tab followed by itself
                assert "after restart" in await card.inner_text()
                assert await tab.locator("#lost").is_hidden()
                await card.get_by_role("button", name="Approve: let it run").click()
                with anyio.fail_after(30):
                    await answered.wait()
        finally:
            await browser.close()
    assert not result[0].is_error
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["after restart"]


async def test_a_console_whose_port_is_taken_serves_on_another_and_the_link_says_where(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    config = {"servers": {"toy": toy(ledger)}, "review": {"default": "console", "timeout": 60}}
    async with spawned(config, tmp_path):
        first = await anyio.to_thread.run_sync(console_url, tmp_path)
        # A second proxy on the same state directory (another client) while the first holds the port.
        async with spawned(config, tmp_path):
            second = await anyio.to_thread.run_sync(console_url, tmp_path)
    assert second.split("/?")[0] != first.split("/?")[0]
    assert int((tmp_path / "state" / "console-port").read_text()) == int(first.split(":")[2].split("/")[0])


async def test_a_console_whose_port_is_taken_as_it_binds_serves_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two proxies starting at once on one state directory: both see the port free, one binds it first.
    import socket

    from mcp_spec_proxy.fronts import console as console_front
    from mcp_spec_proxy.review.console import ConsoleQueue

    async def no_audit() -> list[dict[str, Any]]:
        return []

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        (tmp_path / "console-port").write_text(f"{taken}\n")
        monkeypatch.setattr(console_front, "_free", lambda host, port: True)
        site = console_front.Console(ConsoleQueue(60), no_audit)
        async with anyio.create_task_group() as tg:
            port_file = tmp_path / "console-port"
            url = await tg.start(
                lambda task_status: console_front.serve_console(
                    site, "127.0.0.1", 0, port_file=port_file, task_status=task_status
                )
            )
            tg.cancel_scope.cancel()
    assert f":{taken}/" not in url  # it serves, elsewhere
    assert int((tmp_path / "console-port").read_text()) == taken  # and the port the others look for is kept
