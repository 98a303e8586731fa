"""Real clients against the HTTP front under `auth:`, each as a user would run it, against the
real authorization server (oauth2-mock-server, `tests/oauth.py`): the MCP Inspector CLI with a
bearer token on its command line; npm mcp-remote, which logs in by itself through the person's
browser and bridges the front to stdio; and the MCP SDK's `OAuthClientProvider`. The last two
use the authorization code flow with PKCE (the server's /authorize redirects back at once: it
has no login page, its user is `johndoe`). The backend is the toy's ledger: a write that
reached it is on the ledger.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.auth import OAuthClientProvider
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata
from pydantic import AnyUrl

from tests.backends import REPO, inspector_cli, mcp_remote
from tests.harness import ERAS, recorded, text_of
from tests.oauth import TokenMemory, authorization_server
from tests.test_identity import Front, alice, protected

pytestmark = pytest.mark.anyio

JOHNDOE = {"sub": "johndoe", "client_id": "desk"}  # the server's one user, through the client `desk`


async def inspector(front: Front, home: Path, *options: str) -> tuple[int, Any, str]:
    """The Inspector CLI against the front's URL with `options`: (exit status, stdout as JSON, stderr).
    Its state (catalog, stored logins) lives under `home`, never the user's."""
    argv = [*inspector_cli().argv, front.url, "--transport", "http", *options, "--format", "json", "-q"]
    env = {"HOME": str(home), "MCP_CATALOG_PATH": str(home / "mcp.json"), "PATH": "/usr/bin:/bin"}
    done = await anyio.run_process(argv, check=False, env=env)
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    return done.returncode, json.loads(stdout) if stdout.strip() else None, stderr


async def test_the_inspector_cli_with_a_bearer_token_lists_reads_and_writes_as_its_principal(tmp_path: Path) -> None:
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        header = ("--header", f"Authorization: Bearer {await alice(auth, front)}")
        listed = await inspector(front, tmp_path, *header, "--method", "tools/list")
        read = await inspector(
            front, tmp_path, *header, "--method", "tools/call", "--tool-name", "toy__echo", "--tool-arg", "text=hi"
        )
        wrote = await inspector(
            front, tmp_path, *header, "--method", "tools/call", "--tool-name", "toy__record", "--tool-arg", "value=v"
        )
    assert listed[0] == 0, listed[2]
    assert {"toy__echo", "toy__record"} <= {tool["name"] for tool in listed[1]["result"]["tools"]}
    assert read[0] == 0, read[2]
    assert [block["text"] for block in read[1]["result"]["content"]] == ["hi"]
    assert wrote[0] == 0, wrote[2]
    assert recorded(front.ledger) == ['{"value": "v"}']
    alice_ = {"sub": "alice", "client_id": "cli-a"}
    assert front.principals("read") == [alice_] and front.principals("held") == [alice_]


async def test_the_inspector_cli_without_a_token_is_refused_with_401_and_runs_nothing(tmp_path: Path) -> None:
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        status, _, stderr = await inspector(
            front,
            tmp_path,
            "--stored-auth-only",  # no interactive login: the refusal itself is what is checked
            "--method",
            "tools/call",
            "--tool-name",
            "toy__record",
            "--tool-arg",
            "value=v",
        )
    assert status == 3, stderr  # the Inspector's exit status for a connection it could not open
    error = json.loads(stderr)["error"]
    assert error["code"] == "auth_required"  # what it makes of the front's 401 challenge
    assert "invalid_token" in error["message"]
    assert recorded(front.ledger) == []


async def test_the_sdks_oauth_client_logs_in_by_authorization_code_with_pkce_and_is_served(tmp_path: Path) -> None:
    """`OAuthClientProvider` follows the 401 to the resource metadata and the issuer, sends the
    person to /authorize (here a handler that GETs the URL as a browser would and reads the
    redirect back to the client's callback), redeems the code with its PKCE verifier for a token
    bound to this proxy (RFC 8707 `resource`), and calls as the person who logged in."""
    callback = "http://127.0.0.1:33418/callback"  # never listened on: the handler reads the redirect
    redirected: list[str] = []

    async def follow(url: str) -> None:
        async with httpx.AsyncClient() as browser:
            response = await browser.get(url)
        assert response.status_code in (302, 303), response.text
        redirected.append(response.headers["location"])

    async def callback_handler() -> AuthorizationCodeResult:
        query = parse_qs(urlsplit(redirected[-1]).query)
        return AuthorizationCodeResult(code=query["code"][0], state=query["state"][0])

    redirect_uris = [AnyUrl(callback)]
    metadata = OAuthClientMetadata(redirect_uris=redirect_uris, token_endpoint_auth_method="none", client_name="desk")
    client = OAuthClientInformationFull(
        client_id="desk", redirect_uris=redirect_uris, token_endpoint_auth_method="none"
    )
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        provider = OAuthClientProvider(
            front.url, metadata, TokenMemory(client), redirect_handler=follow, callback_handler=callback_handler
        )
        async with (
            httpx2.AsyncClient(auth=provider) as http,
            Client(streamable_http_client(front.url, http_client=http), mode="legacy") as mcp,
        ):
            echoed = await mcp.call_tool("toy__echo", {"text": "hi"})
            written = await mcp.call_tool("toy__record", {"value": "by johndoe"})
    assert len(redirected) == 1 and redirected[0].startswith(callback + "?")
    assert text_of(echoed) == "hi" and not written.is_error
    assert recorded(front.ledger) == ['{"value": "by johndoe"}']
    assert front.principals("read") == [JOHNDOE] and front.principals("held") == [JOHNDOE]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("mode", ERAS)
async def test_mcp_remote_logs_in_through_the_browser_and_bridges_the_front_to_stdio(tmp_path: Path, mode: str) -> None:
    """mcp-remote meets the front's 401, finds the issuer through the resource metadata, opens the
    person's browser (`$BROWSER`: `tests/fixtures/browser.py`, which follows /authorize's redirect
    to mcp-remote's loopback callback), redeems the code with PKCE for a token bound to this
    proxy, and serves the front to an MCP client on stdio; the audit names the person."""
    visited = tmp_path / "browser.log"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nexec {sys.executable} {REPO / "tests/fixtures/browser.py"} "$1" 2>>{visited}\n')
    browser.chmod(0o755)
    client = json.dumps({"client_id": "desk"})  # pre-registered: the server offers no registration
    callback_port = free_port()
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        bridge = mcp_remote(front.url, str(callback_port), "--host", "127.0.0.1", "--static-oauth-client-info", client)
        # the SDK's default environment: no DISPLAY or desktop session, so `$BROWSER` is what opens
        env = {**get_default_environment(), "BROWSER": str(browser), "MCP_REMOTE_CONFIG_DIR": str(tmp_path / "auth")}
        with (tmp_path / "mcp-remote.log").open("w") as log, anyio.fail_after(60):
            parameters = StdioServerParameters(command=bridge.command, args=bridge.args, env=env)
            async with Client(stdio_client(parameters, errlog=log), mode=mode) as mcp:
                listed = {tool.name for tool in (await mcp.list_tools()).tools}
                echoed = await mcp.call_tool("toy__echo", {"text": "hi"})
                written = await mcp.call_tool("toy__record", {"value": "through mcp-remote"})
    assert [line.split("?")[0] for line in visited.read_text().splitlines()] == [
        f"200 http://127.0.0.1:{callback_port}/oauth/callback"
    ]
    assert {"toy__echo", "toy__record"} <= listed
    assert text_of(echoed) == "hi" and not written.is_error
    assert recorded(front.ledger) == ['{"value": "through mcp-remote"}']
    assert front.principals("read") == [JOHNDOE] and front.principals("held") == [JOHNDOE]
