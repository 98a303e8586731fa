"""A real login from the terminal under `store: postgres`, used by two proxy replicas at once.

`mcp-spec-proxy login remote` runs the whole OAuth flow against the authorization server double of
`tests/test_backend_login_flow.py` (made to rotate its refresh tokens here: each is good once) and
keeps the tokens in the database, encrypted. Two `mcp-spec-proxy --http` processes on that database
then serve the backend's tool with that one login: the login's first access token expires at once,
so both replicas need a refresh as they connect, and between them they spend one refresh token —
neither is locked out, neither asks for a login of its own. Ground truth: the authorization
server's grants, the backend's ledger, and the database's raw rows.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import yaml
from cryptography.fernet import Fernet
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.types import Send

from mcp_spec_proxy.fronts.asgi import serve_asgi
from mcp_spec_proxy.store.migrations import LATEST
from tests.harness import PROXY_COMMAND, proxy_env, recorded
from tests.pg import DSN_ENV, Replica, replica, rows
from tests.test_backend_login_flow import BROWSER, Tracker, _free_port

pytestmark = pytest.mark.anyio

KEY_ENV = "MCP_SPEC_PROXY_TOKEN_KEY"


class RotatingTracker(Tracker):
    """The double, with refresh tokens good once: a refresh rotates the one it spends away; and a
    login is granted the write scope its tool calls need at once (no step-up: one login in all)."""

    refused: list[str]

    async def _token(self, send: Send, form: dict[str, str]) -> None:
        if form.get("grant_type") == "authorization_code":
            self.authorizations[-1]["scope"] = "read write"
        spent = form.get("refresh_token") if form.get("grant_type") == "refresh_token" else None
        if spent is not None and spent not in self.refresh_tokens:
            self.refused.append(spent)
        await super()._token(send, form)
        if spent is not None:
            self.refresh_tokens.pop(spent, None)


async def _record(url: str, value: str) -> bool:
    async with (
        httpx2.AsyncClient(timeout=60) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        with anyio.fail_after(60):
            # The replica's listing is its only word that the backend came.
            while "remote__record" not in [tool.name for tool in (await client.list_tools()).tools]:  # noqa: ASYNC110
                await anyio.sleep(0.1)
            return not (await client.call_tool("remote__record", {"value": value})).is_error


@pytest.fixture
def stacks() -> Iterator[tuple[ExitStack, ExitStack]]:
    """Each replica's process, stopped at the end whatever the test's outcome."""
    with ExitStack() as a, ExitStack() as b:
        yield a, b


async def test_a_terminal_login_kept_in_postgres_serves_two_replicas_that_refresh_it_once(
    tmp_path: Path, pg_dsn: str, stacks: tuple[ExitStack, ExitStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = RotatingTracker(tmp_path / "remote-ledger")
    tracker.refused = []
    browser_dir = tmp_path / "browser"
    browser_dir.mkdir()
    (browser_dir / "go").touch()  # the person is at the browser: the login completes at once
    (tmp_path / "browser.py").write_text(BROWSER)
    key = Fernet.generate_key().decode()
    monkeypatch.setenv(KEY_ENV, key)  # the replicas inherit it, as every replica of a deployment has it
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        remote = {"url": f"{tracker.base}/mcp", "auth": {"callback_port": _free_port()}}
        config: dict[str, Any] = {"servers": {"remote": remote}, "review": {"default": "allow"}}
        config_file = tmp_path / "servers.yaml"
        config_file.write_text(yaml.safe_dump({**config, "store": {"postgres": {"dsn_env": DSN_ENV}}}))
        env = {
            **proxy_env(),
            DSN_ENV: pg_dsn,
            KEY_ENV: key,
            "BROWSER": f"{sys.executable} {tmp_path / 'browser.py'} {browser_dir} %s",
        }
        argv = [PROXY_COMMAND, "login", "remote", "--config", str(config_file), "--state-dir", str(tmp_path / "cli")]
        logged_in = await anyio.run_process(argv, env=env, check=False)
        said = logged_in.stdout.decode() + logged_in.stderr.decode()
        assert logged_in.returncode == 0, said
        assert "remote: logged in" in logged_in.stdout.decode()
        assert tracker.grants == ["authorization_code"]
        kept = rows(pg_dsn, "SELECT server, person, resource, tokens, client FROM backend_tokens")
        assert [(r[0], r[1], r[2]) for r in kept] == [("remote", "", f"{tracker.base}/mcp")]
        raw = b"".join(bytes(v) for v in kept[0][3:]) + repr(kept).encode()
        assert not [t for t in [*tracker.issued, *tracker.refresh_tokens] if t.encode() in raw]
        assert not (tmp_path / "cli" / "oauth").exists()  # nothing went to the terminal's state directory

        # Two replicas start together on the database, each with its own state directory: the login is theirs.
        started: dict[str, Replica] = {}

        async def start(name: str, own: ExitStack) -> None:
            started[name] = await anyio.to_thread.run_sync(own.enter_context, replica(config, tmp_path, pg_dsn, name))

        async with anyio.create_task_group() as starting:
            for name, own in zip("ab", stacks, strict=True):
                starting.start_soon(start, name, own)
        assert await _record(started["a"].url, "from a") and await _record(started["b"].url, "from b")
        for own in stacks:
            await anyio.to_thread.run_sync(own.close)
        tg.cancel_scope.cancel()
    assert rows(pg_dsn, "SELECT max(version) FROM schema_version") == [(LATEST,)]
    assert sorted(recorded(tracker.ledger)) == ['{"value": "from a"}', '{"value": "from b"}']
    assert tracker.refused == []  # no replica spent a refresh token the other had rotated away
    assert tracker.grants == ["authorization_code", "refresh_token"]  # one login, one refresh, for both
    assert len(tracker.authorizations) == 1  # no replica asked for a login of its own
    for running in started.values():
        log = "".join(running.log)
        assert "needs a login" not in log, log[-2000:]
        assert not [t for t in [*tracker.issued, *tracker.refresh_tokens] if t in log]
    argv = [PROXY_COMMAND, "check", "--config", str(config_file), "--state-dir", str(tmp_path / "cli")]
    checked = (await anyio.run_process(argv, env=env, check=False)).stdout.decode()
    assert "remote: logged in, token expires in" in checked and "refreshable" in checked, checked
