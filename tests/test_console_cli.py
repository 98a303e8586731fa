"""The console as a Claude Desktop user meets it: the real command on stdio, no model configured.

The shipped `servers.yaml`'s review section (`human`, `fallback: console`) with a client that cannot elicit: the
write waits, `mcp-spec-proxy console-url` prints the link, the person approves on the page, the
client gets the result. The console's options fail in one line when misused.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anyio
import httpx
import pytest
import yaml
from click.testing import CliRunner

from mcp_spec_proxy.cli import main
from tests.harness import PROXY_COMMAND, recorded, spawned, text_of, toy

REPO = Path(__file__).resolve().parent.parent


def console_url(config: Path, state: Path) -> subprocess.CompletedProcess[str]:
    command = [PROXY_COMMAND, "console-url", "--config", str(config), "--state-dir", str(state)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.anyio
async def test_a_stdio_client_that_cannot_ask_gets_its_write_approved_on_the_console(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    shipped = yaml.safe_load((REPO / "servers.yaml").read_text())["review"]  # as a new user has it
    assert "models" not in shipped and shipped["fallback"] == "console"
    config = {"servers": {"toy": toy(ledger)}, "review": shipped}
    result: list[str] = []
    async with spawned(config, tmp_path) as client, anyio.create_task_group() as tg:

        async def call() -> None:
            answer = await client.call_tool("toy__record", {"value": "from desktop", "intent": "note it"})
            result.append(("error: " if answer.is_error else "") + text_of(answer))

        tg.start_soon(call)
        printed = await anyio.to_thread.run_sync(console_url, tmp_path / "servers.yaml", tmp_path / "state")
        assert printed.returncode == 0, printed.stderr
        url = printed.stdout.strip()
        origin = url.split("/?", 1)[0]
        async with httpx.AsyncClient(base_url=origin, follow_redirects=True) as browser:
            assert (await browser.get(url)).status_code == 200  # the link opens the page and sets the cookie
            with anyio.fail_after(60):
                async with browser.stream("GET", "/events") as events:  # as the page hears of it
                    async for line in events.aiter_lines():
                        if line.startswith("data:") and (ids := json.loads(line[5:])["ids"]):
                            break
            card = (await browser.get(f"/pending/{ids[0]}")).text
            item = card.split('data-id="', 1)[1].split('"', 1)[0]
            digest = card.split('data-digest="', 1)[1].split('"', 1)[0]
            answer = await browser.post(
                f"/decide/{item}",
                content=json.dumps({"action": "approve", "digest": digest}),
                headers={"origin": origin, "content-type": "application/json"},
            )
            assert answer.status_code == 200, answer.text
    assert result and not result[0].startswith("error"), result
    assert [json.loads(line)["value"] for line in recorded(ledger)] == ["from desktop"]
    assert console_url(tmp_path / "servers.yaml", tmp_path / "state").returncode != 0  # the link left with it


def test_console_url_without_a_running_console_says_what_to_do(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {}}))
    result = CliRunner().invoke(main, ["console-url", "--config", str(config), "--state-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "no approval console is running" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--console", "0.0.0.0:8080"], "loopback only"),
        (["--console", "127.0.0.1:8080", "--no-console"], "contradict"),
        (["--console", "nonsense"], "HOST:PORT"),
    ],
)
def test_console_options_fail_in_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {}}))
    result = CliRunner().invoke(main, ["--config", str(config), "--state-dir", str(tmp_path), *args])
    assert result.exit_code != 0
    assert says in result.output and "Traceback" not in result.output
