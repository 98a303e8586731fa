"""A remote backend behind an authorization server, reached through a real proxy process that logs in.

`Tracker` is the toy server on streamable HTTP behind its own small authorization server (protected
resource metadata, RFC 8414 metadata, dynamic registration whose scope is the client's ceiling, as
oidc-provider keeps it (tests/test_oidc_login_e2e.py), an authorization endpoint that sends the
browser straight back with a code, a token endpoint whose tokens expire within a second, so a call
a moment after the login refreshes): a double of the kind the conformance suite's authorization
scenarios check the same flow against with their own servers (tests/test_conformance_client.py).
The person's browser is a program (`BROWSER`) that waits for the test to let it go, then follows the
authorization server's redirect to the proxy's loopback, as a browser does.
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import anyio
import mcp_types as types
import pytest
import yaml
from mcp.client.client import Client
from mcp.client.session import IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.fronts.asgi import serve_asgi
from tests.fixtures import toy_server
from tests.harness import PROXY_COMMAND, proxy_env, recorded, toy

pytestmark = pytest.mark.anyio

BROWSER = """\
import pathlib, sys, time, urllib.request, urllib.error
folder = pathlib.Path(sys.argv[1])
(folder / f"url-{time.monotonic_ns()}").write_text(sys.argv[2])
while not (folder / "go").exists():
    time.sleep(0.05)
class Stay(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None
try:
    urllib.request.build_opener(Stay).open(sys.argv[2], timeout=10)
except urllib.error.HTTPError as redirected:
    urllib.request.urlopen(redirected.headers["location"], timeout=10).read()
"""


@dataclass
class Tracker:
    """The toy behind an authorization server; what each endpoint saw."""

    ledger: Path
    base: str = ""
    grants: list[str] = field(default_factory=list)
    authorizations: list[dict[str, str]] = field(default_factory=list)
    issued: dict[str, str] = field(default_factory=dict)  # access token -> its scope
    refresh_tokens: dict[str, str] = field(default_factory=dict)  # refresh token -> its scope
    token_type: str = "Bearer"  # what its token endpoint says it gives (anything else: no token this client uses)
    revoked: set[str] = field(default_factory=set)
    bearers: list[str] = field(default_factory=list)
    # Each registered client's scope, which its authorization requests may not exceed (as oidc-provider
    # holds them: tests/test_oidc_login_e2e.py), and the requests refused for it.
    clients: dict[str, str | None] = field(default_factory=dict)
    beyond_registration: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> ASGIApp:
        toy_app = toy_server.build(self.ledger).streamable_http_app(host="127.0.0.1")

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await toy_app(scope, receive, send)
                return
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            path = scope["path"]
            if path.startswith("/.well-known/oauth-protected-resource"):
                await _json(send, 200, {"resource": f"{self.base}/mcp", "authorization_servers": [self.base]})
            elif path == "/.well-known/oauth-authorization-server":
                await _json(send, 200, self._metadata())
            elif path == "/register":
                asked = json.loads(body)
                client_id = f"tracker-client-{len(self.clients) + 1}"
                self.clients[client_id] = asked.get("scope")
                await _json(send, 201, {**asked, "client_id": client_id, "token_endpoint_auth_method": "none"})
            elif path == "/authorize":
                query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
                registered = self.clients.get(query.get("client_id", ""))
                if registered is not None and not set(query.get("scope", "").split()) <= set(registered.split()):
                    self.beyond_registration.append(query)
                    back = urlencode({"error": "invalid_scope", "state": query["state"]})
                    await _respond(send, 302, b"", [(b"location", f"{query['redirect_uri']}?{back}".encode())])
                    return
                self.authorizations.append(query)
                back = urlencode({"code": f"code-{len(self.authorizations)}", "state": query["state"]})
                await _respond(send, 302, b"", [(b"location", f"{query['redirect_uri']}?{back}".encode())])
            elif path == "/token":
                await self._token(send, {k: v[0] for k, v in parse_qs(body.decode()).items()})
            else:
                await self._resource(scope, body, send, toy_app)

        return app

    def _metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.base,
            "authorization_endpoint": f"{self.base}/authorize",
            "token_endpoint": f"{self.base}/token",
            "registration_endpoint": f"{self.base}/register",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
        }

    async def _token(self, send: Send, form: dict[str, str]) -> None:
        self.grants.append(form["grant_type"])
        if form["grant_type"] == "refresh_token":
            if form.get("refresh_token") not in self.refresh_tokens:
                await _json(send, 400, {"error": "invalid_grant"})
                return
            scope = self.refresh_tokens[form["refresh_token"]]
        else:
            scope = self.authorizations[-1].get("scope", "")
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        lifetime = 1 if not self.issued else 3600  # the first expires at once: the next call refreshes it
        self.issued[access] = scope
        self.refresh_tokens[refresh] = scope
        token = {
            "access_token": access,
            "token_type": self.token_type,
            "expires_in": lifetime,
            "refresh_token": refresh,
        }
        await _json(send, 200, {**token, "scope": scope})

    def revoke_access_tokens(self) -> None:
        """The server forgets every access token before its expiry; refresh tokens still work."""
        self.revoked.update(self.issued)

    async def _resource(self, scope: Scope, body: bytes, send: Send, toy_app: ASGIApp) -> None:
        given = dict(scope["headers"]).get(b"authorization", b"").decode()
        self.bearers.append(given)
        token = given.removeprefix("Bearer ")
        metadata = f'resource_metadata="{self.base}/.well-known/oauth-protected-resource/mcp"'
        if token not in self.issued or token in self.revoked:
            await _respond(send, 401, b"", [(b"www-authenticate", f'Bearer {metadata}, scope="read"'.encode())])
            return
        method = json.loads(body).get("method") if body.startswith(b"{") else None
        if method == "tools/call" and "write" not in self.issued[token].split():
            challenge = f'Bearer error="insufficient_scope", scope="read write", {metadata}'
            await _respond(send, 403, b"", [(b"www-authenticate", challenge.encode())])
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                await anyio.sleep_forever()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await toy_app(scope, replay, send)


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, value: object) -> None:
    await _respond(send, status, json.dumps(value).encode(), [(b"content-type", b"application/json")])


async def _appears(folder: Path, pattern: str, count: int) -> list[Path]:
    with anyio.fail_after(60):
        while len(found := sorted(folder.glob(pattern))) < count:  # noqa: ASYNC110 -- another process's file is the only sign
            await anyio.sleep(0.05)
    return found


async def test_a_login_holds_up_no_other_backend_and_its_tools_come_when_it_is_done(tmp_path: Path) -> None:
    """The person is away: the toy's tools serve at once and the remote's startup clock stands still;
    once the browser comes back the remote's tools arrive (a list change), a call goes through on a
    refreshed token, a wider scope is asked for in a second login, a token the server revoked is
    refreshed rather than logged in again, and no token reaches the log."""
    tracker = Tracker(tmp_path / "remote-ledger")
    browser_dir = tmp_path / "browser"
    browser_dir.mkdir()
    (tmp_path / "browser.py").write_text(BROWSER)
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        remote = {"url": f"{tracker.base}/mcp", "auth": {"callback_port": _free_port()}, "startup_timeout": 1}
        config = {"servers": {"toy": toy(tmp_path / "ledger"), "remote": remote}, "review": {"default": "allow"}}
        (tmp_path / "servers.yaml").write_text(yaml.safe_dump(config))
        env = {**proxy_env(), "BROWSER": f"{sys.executable} {tmp_path / 'browser.py'} {browser_dir} %s"}
        argv = ["--config", str(tmp_path / "servers.yaml"), "--state-dir", str(tmp_path / "state"), "--no-console"]
        changed = anyio.Event()

        async def on_message(message: IncomingMessage) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        log = tmp_path / "proxy.log"
        with log.open("w") as errlog:
            params = StdioServerParameters(command=PROXY_COMMAND, args=argv, env=env)
            async with Client(stdio_client(params, errlog=errlog), mode="legacy", message_handler=on_message) as client:
                [url_file] = await _appears(browser_dir, "url-*", 1)
                served = [tool.name for tool in (await client.list_tools()).tools]
                assert "toy__record" in served and not any(name.startswith("remote__") for name in served)
                await anyio.sleep(2)  # the remote's 1 s startup deadline passes while the person is away
                (browser_dir / "go").touch()
                with anyio.fail_after(60):
                    while "remote__record" not in [tool.name for tool in (await client.list_tools()).tools]:
                        await changed.wait()
                        changed = anyio.Event()
                await anyio.sleep(1.5)  # the access token expires: the call refreshes it first
                with anyio.fail_after(60):
                    result = await client.call_tool("remote__record", {"value": "through the login"})
                grants_before = len(tracker.grants)
                tracker.revoke_access_tokens()
                with anyio.fail_after(60):
                    again = await client.call_tool("remote__record", {"value": "after a revocation"})
        tg.cancel_scope.cancel()
    assert not result.is_error and not again.is_error, (result, again)
    assert recorded(tracker.ledger) == ['{"value": "through the login"}', '{"value": "after a revocation"}']
    assert tracker.grants[grants_before:] == ["refresh_token"]  # a refused token is refreshed, no new login
    first = parse_qs(urlsplit(url_file.read_text()).query)
    assert first["redirect_uri"][0].startswith("http://127.0.0.1:") and first["redirect_uri"][0].endswith("/callback")
    assert first["code_challenge_method"] == ["S256"] and first["resource"] == [f"{tracker.base}/mcp"]
    assert [a.get("scope") for a in tracker.authorizations] == ["read", "read write"]  # step-up: a new login
    # ... from a client registered anew for the wider scope: the first one's registration is its ceiling.
    assert list(tracker.clients.values()) == ["read", "read write"] and not tracker.beyond_registration
    assert "refresh_token" in tracker.grants  # the token expired: refreshed, not logged in again
    said = log.read_text()
    assert "backend 'remote' needs a login" in said and "waiting for a login: remote" in said
    assert not [token for token in [*tracker.issued, *tracker.refresh_tokens] if token in said]
    assert [a.get("scope") for a in tracker.authorizations] == ["read", "read write"]  # still two logins


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_a_token_endpoint_answer_the_client_cannot_use_is_one_line_that_quotes_no_token(tmp_path: Path) -> None:
    """A hostile or broken authorization server answers the code with a token of another type: the
    login fails, the proxy says so in one line, and neither that line nor anything else in the log
    (the SDK's own traceback quotes the answer) holds the token it sent."""
    tracker = Tracker(tmp_path / "remote-ledger", token_type="MAC")
    browser_dir = tmp_path / "browser"
    browser_dir.mkdir()
    (browser_dir / "go").touch()
    (tmp_path / "browser.py").write_text(BROWSER)
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        remote = {"url": f"{tracker.base}/mcp", "auth": {"callback_port": _free_port()}}
        (tmp_path / "servers.yaml").write_text(yaml.safe_dump({"servers": {"remote": remote}}))
        env = {**proxy_env(), "BROWSER": f"{sys.executable} {tmp_path / 'browser.py'} {browser_dir} %s"}
        argv = ["--config", str(tmp_path / "servers.yaml"), "--state-dir", str(tmp_path / "state"), "--no-console"]
        log = tmp_path / "proxy.log"
        with log.open("w") as errlog:
            params = StdioServerParameters(command=PROXY_COMMAND, args=argv, env=env)
            async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
                with anyio.fail_after(60):
                    while "could not log in" not in log.read_text():  # noqa: ASYNC110 -- the proxy's log is its only word
                        await anyio.sleep(0.05)
                assert not (await client.list_tools()).tools
        tg.cancel_scope.cancel()
    said = log.read_text()
    assert tracker.issued, "the authorization server sent no token"
    assert "could not log in: Invalid token response (the answer is not repeated" in said
    assert "Traceback" not in said.split("could not log in", 1)[0].split("needs a login", 1)[1]
    assert not [token for token in [*tracker.issued, *tracker.refresh_tokens] if token in said]
