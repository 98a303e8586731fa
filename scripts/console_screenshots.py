"""Screenshots of the approval console for the README: docs/console-pending.png, docs/console-history.png.

    .venv/bin/python scripts/console_screenshots.py [--out docs]

Runs the proxy in this process over a small in-memory notes server (`fs`: read_file, a read;
write_file, a write), serves the console on a free loopback port, makes an agent's calls
through the proxy as a client that cannot ask its user would, and photographs the page with the
system Chromium (`apt-get install chromium`) driven by Playwright. Nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.server import Server
from playwright.async_api import async_playwright

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.console import Console, serve_console
from mcp_spec_proxy.fronts.console.overwrite import OldContent
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.review.console import ConsoleQueue, Decision

NOTES = {
    "todo.md": "# This week\n- [ ] send the invoice to ACME\n- [x] book the train\n- [ ] renew the domain\n",
    "invoices/acme.md": "ACME Corp — invoice 2026-117, 3 days of consulting, 2,400 EUR, due 2026-12-15\n",
}
NEW_TODO = (
    "# This week\n- [x] send the invoice to ACME (sent 2026-12-01, 2,400 EUR)\n- [x] book the train\n"
    "- [ ] renew the domain\n\n## Notes\n"
    + "".join(f"- call log {n}: discussed the invoice schedule and the next milestone\n" for n in range(1, 9))
)


def notes_server() -> Server[Any]:
    files = dict(NOTES)
    path_only = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    write = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    }
    tools = [
        types.Tool(
            name="read_file",
            title="Read a note",
            description="Read a note from the notes folder.",
            input_schema=path_only,
            annotations=types.ToolAnnotations(read_only_hint=True),
        ),
        types.Tool(
            name="write_file",
            title="Write a note",
            description="Create a note or replace its whole content.",
            input_schema=write,
            annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
        ),
    ]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        if params.name == "read_file":
            text = files.get(args["path"], f"no such note: {args['path']}")
        else:
            files[args["path"]] = args["content"]
            text = f"wrote {len(args['content'])} characters to {args['path']}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("fs", on_list_tools=list_tools, on_call_tool=call_tool)


async def waiting(queue: ConsoleQueue, count: int) -> None:
    with anyio.fail_after(30):
        version = queue.version
        while len(queue.pending()) < count:
            version = await queue.changed_since(version)


async def shoot(out: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("console_screenshots: no chromium on PATH — install it (Debian: apt-get install chromium)")
    config = ProxyConfig.model_validate(
        {"servers": {"fs": {"command": "in-process"}}, "review": {"default": "human", "fallback": "console"}}
    )
    with tempfile.TemporaryDirectory() as state_dir:
        state = StatePaths(Path(state_dir))
        async with running_proxy(config, state, in_process={"fs": notes_server()}) as proxy:
            queue = proxy.console
            assert queue is not None
            async with Client(McpFront(proxy).server, mode="legacy") as client, anyio.create_task_group() as tg:
                site = Console(queue, proxy.store.read_audit, proxy.leash, OldContent(proxy.gate, proxy.catalog))
                url = await tg.start(lambda task_status: serve_console(site, "127.0.0.1", 0, task_status=task_status))
                await history_of_earlier_calls(client, queue, tg)
                await client.call_tool("fs__read_file", {"path": "todo.md"})
                await client.call_tool("fs__read_file", {"path": "invoices/acme.md"})
                intent = (
                    "The user asked me to mark the ACME invoice as sent in their to-do list and keep my call notes."
                )
                tg.start_soon(
                    client.call_tool, "fs__write_file", {"path": "todo.md", "content": NEW_TODO, "intent": intent}
                )
                await waiting(queue, 1)
                async with async_playwright() as p:
                    browser = await p.chromium.launch(executable_path=chromium)
                    page = await browser.new_page(viewport={"width": 1100, "height": 1250}, device_scale_factor=1)
                    await page.goto(url)
                    await page.locator("article.call").wait_for()
                    await page.screenshot(path=str(out / "console-pending.png"), full_page=True)
                    await page.get_by_role("button", name="Approve: let it run").click()
                    await page.locator(".status.ok").wait_for()
                    await page.goto(url.split("?")[0] + "history")
                    await page.screenshot(path=str(out / "console-history.png"), full_page=False)
                    await browser.close()
                tg.cancel_scope.cancel()
    print(f"wrote {out / 'console-pending.png'} and {out / 'console-history.png'}")


async def history_of_earlier_calls(client: Client, queue: ConsoleQueue, tg: anyio.abc.TaskGroup) -> None:
    """A few decided calls, so the history has something to show: one denied, one edited."""
    for arguments, decision in (
        ({"path": "todo.md", "content": "", "intent": "clean up the list"}, Decision("deny", "never empty my list")),
        (
            {"path": "draft.md", "content": "Dear ACME, plese find", "intent": "start the cover letter"},
            Decision("edit", arguments={"path": "drafts/acme-letter.md", "content": "Dear ACME, please find"}),
        ),
    ):
        tg.start_soon(client.call_tool, "fs__write_file", arguments)
        await waiting(queue, 1)
        [item] = queue.pending()
        queue.decide(item.id, item.digest, decision)
        with anyio.fail_after(30):
            while queue.pending():
                await queue.changed_since(queue.version)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    anyio.run(shoot, args.out)


if __name__ == "__main__":
    main()
