"""A remote backend's OAuth login: what may be written, where tokens live, the loopback redirect, the CLI.

The flow itself is the SDK's and is measured against the conformance suite's authorization
scenarios (tests/test_conformance_client.py); these tests hold what the proxy adds around it: the
config's one-line errors, the token file (owner-only, written whole, bound to its URL), the loopback
listener that takes the code (only on 127.0.0.1, only with the login's own `state`), and the
`login`/`logout`/`check` commands.
"""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
import yaml
from mcp.client.auth import OAuthFlowError
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl

from mcp_spec_proxy.backends.loopback import LoginRefused, Redirect
from mcp_spec_proxy.backends.oauth import BackendAuth, backend_logins
from mcp_spec_proxy.config.schema import parse_config_text
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.store.tokens import TokenFile
from tests.harness import PROXY_COMMAND

URL = "https://tracker.example.com/mcp"
pytestmark = pytest.mark.anyio


def _config(auth: str) -> str:
    return f"servers:\n  tracker:\n    url: {URL}\n    auth: {auth}\n"


@pytest.mark.parametrize(
    ("auth", "says"),
    [
        ("yes", "True is not a login: write `auth: oauth`"),
        ("oath", "'oath' is not a login"),
        ("{grant: client_credentials, client_id: a, client_secret_env: S}", "needs `issuer`"),
        ("{client_secret_env: S}", "`client_secret_env` without `client_id`"),
        (
            "{grant: client_credentials, client_id: a, client_secret_env: S, private_key_env: K, issuer: 'https://i'}",
            "needs `client_id` and one of `client_secret_env` (a secret) or `private_key_env`",
        ),
        ("{private_key_env: K}", "`private_key_env` signs client credentials: add `grant: client_credentials`"),
        (
            "{grant: client_credentials, client_id: a, private_key_env: K, signing_algorithm: HS256}",
            "signing_algorithm",
        ),
        ("{client_metadata_url: 'http://example.com/c.json'}", "must be the https URL of your client metadata"),
        ("{redirect_uri: 'https://evil.example.com/cb'}", "servers.tracker.auth.redirect_uri: unknown key"),
        ("{callback_port: 0}", "servers.tracker.auth.callback_port"),
    ],
)
def test_a_bad_auth_value_is_one_line_naming_the_key(auth: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(_config(auth), {})
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_auth_on_a_stdio_server_is_refused() -> None:
    with pytest.raises(ConfigError, match="has `auth:` but no `url`"):
        parse_config_text("servers:\n  fs:\n    command: x\n    auth: oauth\n", {})


def test_the_redirect_is_always_the_loopback_address() -> None:
    # No key sets the redirect: a login's code can only ever come back to this machine.
    server = parse_config_text(_config("{callback_port: 40001}"), {}).servers["tracker"]
    assert server.auth is not None
    assert server.auth.redirect_uri == "http://127.0.0.1:40001/callback"


def test_a_client_secret_named_but_not_set_is_a_config_error(tmp_path: Path) -> None:
    config = parse_config_text(_config("{client_id: pre, client_secret_env: TRACKER_SECRET}"), {})
    with pytest.raises(ConfigError, match="environment variable TRACKER_SECRET is not set"):
        backend_logins(config.servers, tmp_path, {})
    logins = backend_logins(config.servers, tmp_path, {"TRACKER_SECRET": "s3"})
    assert set(logins) == {"tracker"}


async def test_the_token_file_is_the_owners_alone_and_written_whole(tmp_path: Path) -> None:
    tokens = TokenFile.of(tmp_path, "tracker", URL)
    await tokens.set_tokens(OAuthToken(access_token="at-1", refresh_token="rt-1", expires_in=3600, scope="read"))
    await tokens.set_client_info(
        OAuthClientInformationFull(client_id="c", redirect_uris=[AnyUrl("http://127.0.0.1:1/callback")])
    )
    assert stat.S_IMODE(tokens.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(tokens.path.parent.stat().st_mode) == 0o700
    assert [p.name for p in tokens.path.parent.iterdir()] == ["tracker.json"]  # no temporary file left behind
    kept = await tokens.get_tokens()
    assert kept is not None and kept.access_token == "at-1" and kept.refresh_token == "rt-1"
    assert (await tokens.get_client_info()) is not None
    state = await tokens.state()
    assert state.logged_in and state.refreshable and "token expires in" in state.describe()
    assert "at-1" not in state.describe() and "rt-1" not in state.describe()
    assert await tokens.forget_tokens()
    assert await tokens.get_tokens() is None
    assert await tokens.get_client_info() is not None  # the registration stays for the next login


async def test_tokens_got_for_one_url_are_never_handed_out_for_another(tmp_path: Path) -> None:
    # An attacker who changes the config's `url` (or a server that moved) gets no token that was got for the old one.
    await TokenFile.of(tmp_path, "tracker", URL).set_tokens(OAuthToken(access_token="for-tracker"))
    elsewhere = TokenFile.of(tmp_path, "tracker", "https://evil.example.com/mcp")
    assert await elsewhere.get_tokens() is None
    assert not (await elsewhere.state()).logged_in
    config = parse_config_text(_config("oauth").replace(URL, "https://evil.example.com/mcp"), {})
    auth = backend_logins(config.servers, tmp_path, {})["tracker"]
    assert await auth.tokens.get_tokens() is None


def _get(port: int, query: str) -> int:
    with httpx2.Client(timeout=10) as http:
        return http.get(f"http://127.0.0.1:{port}/callback?{query}").status_code


async def test_the_loopback_redirect_answers_only_its_own_login() -> None:
    redirect = await Redirect.listen(0)
    try:
        host = redirect._listener.extra(anyio.abc.SocketAttribute.local_address)
        assert host[0] == "127.0.0.1"  # never a wildcard address another machine could reach
        statuses: list[int] = []

        async def browser() -> None:
            # A page in the user's browser can reach the port; it cannot know the state.
            statuses.append(await anyio.to_thread.run_sync(_get, redirect.port, "code=forged&state=guess"))
            statuses.append(await anyio.to_thread.run_sync(_get, redirect.port, "code=real&state=s1&iss=https://as"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(browser)
            with anyio.fail_after(20):
                result = await redirect.wait("s1")
        assert statuses == [400, 200]
        assert (result.code, result.state, result.iss) == ("real", "s1", "https://as")
    finally:
        await redirect.aclose()


async def test_an_authorization_servers_refusal_ends_the_login_with_its_error() -> None:
    redirect = await Redirect.listen(0)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, _get, redirect.port, "error=access_denied&state=s2")
            with anyio.fail_after(20), pytest.raises(LoginRefused, match="access_denied"):
                await redirect.wait("s2")
    finally:
        await redirect.aclose()


async def test_a_login_whose_port_is_taken_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = parse_config_text(_config(f"{{callback_port: {port}}}"), {})
        auth = backend_logins(config.servers, tmp_path, {})["tracker"]
        assert isinstance(auth, BackendAuth)
        with pytest.raises(Exception, match=f"cannot take the login's redirect on 127.0.0.1:{port}"):
            await auth._redirect("https://as.example.com/authorize?state=x")


def _cli(*args: str, config: Path, state: Path) -> subprocess.CompletedProcess[str]:
    argv = [PROXY_COMMAND, *args, "--config", str(config), "--state-dir", str(state)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_check_says_each_login_and_logout_forgets_it(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {"tracker": {"url": URL, "auth": "oauth"}}}))
    state = tmp_path / "state"
    checked = _cli("check", config=config, state=state)
    assert checked.returncode == 0, checked.stderr
    assert "tracker: not logged in — run `mcp-spec-proxy login tracker`" in checked.stdout
    anyio.run(TokenFile.of(state, "tracker", URL).set_tokens, OAuthToken(access_token="secret-at", expires_in=600))
    checked = _cli("check", config=config, state=state)
    assert "tracker: logged in, token expires in 10 min" in checked.stdout
    assert "secret-at" not in checked.stdout + checked.stderr
    out = _cli("logout", "tracker", config=config, state=state)
    assert out.returncode == 0 and out.stdout.strip() == "tracker: logged out"
    assert "not logged in" in _cli("check", config=config, state=state).stdout


def test_login_to_a_server_without_auth_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {"fs": {"command": sys.executable}}}))
    out = _cli("login", "fs", config=config, state=tmp_path / "state")
    assert out.returncode != 0
    assert "server 'fs' has no `auth:`" in out.stderr and "Traceback" not in out.stderr


async def test_a_login_abandoned_after_its_redirect_neither_blocks_the_next_nor_keeps_its_port(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = parse_config_text(_config(f"{{callback_port: {port}}}"), {}).servers["tracker"].auth
    assert settings is not None
    opened: list[str] = []
    auth = BackendAuth("tracker", URL, settings, TokenFile.of(tmp_path, "tracker", URL), open_browser=opened.append)
    with anyio.fail_after(20):
        await auth._redirect("https://as.example.com/authorize?state=first")
        await auth._redirect("https://as.example.com/authorize?state=second")  # the first flow ended early
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, _get, port, "code=c2&state=second")
            result = await auth._callback()
    assert result.code == "c2" and result.state == "second"
    assert len(opened) == 2
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, not past a listener
        again.bind(("127.0.0.1", port))
        again.listen()  # the login's listener is gone with it


async def test_a_login_nobody_finishes_ends_in_one_line_and_lets_its_port_go(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = parse_config_text(_config(f"{{callback_port: {port}, login_timeout: 0.2}}"), {}).servers["tracker"].auth
    assert settings is not None
    auth = BackendAuth("tracker", URL, settings, TokenFile.of(tmp_path, "tracker", URL), open_browser=lambda url: None)
    with anyio.fail_after(20):
        await auth._redirect("https://as.example.com/authorize?state=s")
        with pytest.raises(OAuthFlowError, match=r"^no login within 0.2s \(`login_timeout` waits longer\)$"):
            await auth._callback()
        await auth._redirect("https://as.example.com/authorize?state=t")  # the next login gets the port
        await auth._drop_pending()
