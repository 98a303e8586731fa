"""Each principal logs in to a remote backend for themselves, and their calls carry their own tokens.

The proxy's HTTP front is a resource server (`auth:` at the top, a real authorization server for the
clients' tokens); behind it, `Tracker` (tests/test_backend_login_flow.py) is a remote MCP server behind
its own small authorization server, which records the bearer of every request it hears. The operator
logged in once (the shared session's token); alice and bob each log in through the URL their first
call is refused with, racing each other for the one loopback port, as a person's browser would.
"""

from __future__ import annotations

import json
import logging
import re
import stat
from pathlib import Path

import anyio
import httpx
import pytest
from mcp.shared.auth import OAuthToken
from mcp.shared.exceptions import MCPError
from starlette.types import Scope, Send

from mcp_spec_proxy.cli.login import login_lines
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.asgi import serve_asgi
from mcp_spec_proxy.store.tokens import TokenFile
from tests.harness import recorded
from tests.oauth import authorization_server
from tests.test_backend_login_flow import Tracker, _free_port
from tests.test_identity import Front, client_with, protected

pytestmark = pytest.mark.anyio

LOGIN_URL = re.compile(r"needs your own login: open (\S+) in a browser")


class Heard(Tracker):
    """The tracker, remembering which bearer each tool call it ran carried."""

    def __init__(self, ledger: Path) -> None:
        super().__init__(ledger)
        self.calls: list[tuple[str, str]] = []  # (bearer, the value written)

    async def _resource(self, scope: Scope, body: bytes, send: Send, toy_app: object) -> None:
        message = json.loads(body) if body.startswith(b"{") else {}
        if message.get("method") == "tools/call":
            bearer = dict(scope["headers"]).get(b"authorization", b"").decode().removeprefix("Bearer ")
            self.calls.append((bearer, message["params"]["arguments"].get("value", "")))
        given = dict(scope["headers"]).get(b"authorization", b"").decode().removeprefix("Bearer ")
        if given not in self.issued:  # asks for the scope a call needs at once: no step-up here
            metadata = f'resource_metadata="{self.base}/.well-known/oauth-protected-resource/mcp"'
            challenge = f'Bearer {metadata}, scope="read write"'.encode()
            await send({"type": "http.response.start", "status": 401, "headers": [(b"www-authenticate", challenge)]})
            await send({"type": "http.response.body", "body": b""})
            return
        await super()._resource(scope, body, send, toy_app)  # type: ignore[arg-type]


async def browse(url: str) -> None:
    """A person's browser: the authorization server sends it straight back to the proxy's loopback."""
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.get(url)
        assert answer.status_code == 302, answer.text
        assert (await http.get(answer.headers["location"])).status_code == 200


async def served(front: Front, token: str, value: str, *, log_in: bool = True) -> tuple[bool, list[str]]:
    """Call `far__record` as the token's principal until it is served, logging in through each URL a
    refusal names (a step-up is a second login); whether it was served, and every refusal."""
    refusals: list[str] = []
    async with client_with(front.url, token, "legacy") as client:
        with anyio.fail_after(90):
            while len(refusals) < 20:
                try:
                    result = await client.call_tool("far__record", {"value": value})
                    text = " ".join(getattr(part, "text", "") for part in result.content)
                    if not result.is_error:
                        return True, refusals
                except MCPError as exc:
                    text = str(exc)
                refusals.append(text)
                found = LOGIN_URL.search(text)
                if found is not None and log_in:
                    await browse(found.group(1))
                elif "another login holds the login port" in text:
                    await anyio.sleep(0.3)
                else:
                    return False, refusals
    return False, refusals


async def test_two_principals_racing_one_login_each_call_with_their_own_tokens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """alice and bob log in at once through the one loopback port: each ends with a token file of
    their own (0600, named by no one's name), every call of alice's reaches the backend with a token of
    hers, bob's with his, neither with the operator's; carol, who has not logged in, is refused in one
    line naming the login URL and no token is kept for her; no token reaches the logs, the audit
    trail, the telemetry file, the state directory outside the token files, or the metrics."""
    caplog.set_level(logging.DEBUG)
    tracker = Heard(tmp_path / "remote-ledger")
    tracker.issued["operator-token"] = "read write"
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        url = f"{tracker.base}/mcp"
        operator = TokenFile.of(tmp_path / "state", "far", url)
        await operator.set_tokens(OAuthToken(access_token="operator-token", expires_in=3600))
        servers = {"far": {"url": url, "auth": {"callback_port": _free_port()}}}
        telemetry = tmp_path / "telemetry.jsonl"
        async with (
            authorization_server() as auth,
            protected(tmp_path, auth.issuer, servers=servers, telemetry=telemetry) as front,
        ):
            tokens = {
                who: await auth.mint(sub=who, client_id=f"cli-{who}", aud=front.url, scope="mcp")
                for who in ("alice", "bob", "carol")
            }
            outcome: dict[str, tuple[bool, list[str]]] = {}

            async def run(who: str) -> None:
                outcome[who] = await served(front, tokens[who], f"{who}-1")

            async with anyio.create_task_group() as race:
                race.start_soon(run, "alice")
                race.start_soon(run, "bob")
            again = {who: await served(front, tokens[who], f"{who}-2") for who in ("alice", "bob")}
            carol = await served(front, tokens["carol"], "carol-1", log_in=False)
            async with httpx.AsyncClient(timeout=30) as http:
                metrics = await http.get(front.url.removesuffix("/mcp") + "/metrics")
        tg.cancel_scope.cancel()

    assert outcome["alice"][0] and outcome["bob"][0], outcome
    assert again == {"alice": (True, []), "bob": (True, [])}  # logged in: served at once
    assert not carol[0] and len(carol[1]) == 1 and LOGIN_URL.search(carol[1][0]), carol
    files = {who: operator.of_principal(auth.issuer, who) for who in ("alice", "bob", "carol")}
    assert not (await files["carol"].state()).logged_in  # only the client registration her login began with
    kept = {who: await files[who].state() for who in ("alice", "bob")}
    assert all(state.logged_in for state in kept.values()), kept
    [said_by_check] = await login_lines(ProxyConfig.model_validate({"servers": servers}), tmp_path / "state")
    assert said_by_check.endswith("; 2 principals logged in for themselves"), said_by_check
    for who in ("alice", "bob"):
        assert stat.S_IMODE(files[who].path.stat().st_mode) == 0o600 and who not in files[who].path.name
        assert stat.S_IMODE(files[who].path.parent.stat().st_mode) == 0o700
    hers = {bearer for bearer, value in tracker.calls if value.startswith("alice")}
    his = {bearer for bearer, value in tracker.calls if value.startswith("bob")}
    assert hers and his and not hers & his and "operator-token" not in hers | his
    assert not any(value.startswith("carol") for _, value in tracker.calls)
    for who, bearers in (("alice", hers), ("bob", his)):
        last = await files[who].get_tokens()
        assert last is not None and last.access_token in bearers  # the calls carried the file's own token
    assert sorted(recorded(tracker.ledger)) == [f'{{"value": "{v}"}}' for v in ("alice-1", "alice-2", "bob-1", "bob-2")]
    secrets = [*tracker.issued, *tracker.refresh_tokens]
    assert len(secrets) >= 5
    assert not [token for token in secrets if token in caplog.text]
    outside = [p for p in (tmp_path / "state").rglob("*") if p.is_file() and "oauth" not in p.parts]
    assert outside and not [p for p in outside for token in secrets if token.encode() in p.read_bytes()]
    assert metrics.status_code == 200 and not [token for token in secrets if token in metrics.text]
    said = telemetry.read_text()
    assert "far__record" in said and not [token for token in secrets if token in said]


async def test_a_principals_call_never_rides_the_session_everyone_shares(tmp_path: Path) -> None:
    """`isolation: shared` on a backend a person logs in to: the one session carries the operator's
    login, so a principal's call is refused in one line naming the fix, and the backend hears no call."""
    tracker = Heard(tmp_path / "remote-ledger")
    tracker.issued["operator-token"] = "read write"
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(tracker.app(), "127.0.0.1", 0, task_status=task_status))
        tracker.base = f"http://127.0.0.1:{port}"
        url = f"{tracker.base}/mcp"
        await TokenFile.of(tmp_path / "state", "far", url).set_tokens(OAuthToken(access_token="operator-token"))
        servers = {"far": {"url": url, "auth": "oauth", "isolation": "shared"}}
        async with authorization_server() as auth, protected(tmp_path, auth.issuer, servers=servers) as front:
            token = await auth.mint(sub="alice", client_id="cli-alice", aud=front.url, scope="mcp")
            outcome = await served(front, token, "alice-1", log_in=False)
        tg.cancel_scope.cancel()
    assert not outcome[0] and len(outcome[1]) == 1, outcome
    assert "keeps one login per person" in outcome[1][0] and "isolation: per_session" in outcome[1][0]
    assert tracker.calls == [] and recorded(tracker.ledger) == []
