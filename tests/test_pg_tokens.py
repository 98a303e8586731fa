"""Remote backends' OAuth tokens in the Postgres store: encrypted rows every replica shares.

Ground truth is the database's own rows (read raw, as a dump would) and a real token endpoint on
loopback that rotates refresh tokens — each one good once — and counts what it was sent. Two
"replicas" are two stores on one database, each with its own OAuth client, as two proxy processes
have: a refresh by one is taken by the other instead of a second refresh that would spend a dead
refresh token; a logout by one is a login needed by the other.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import httpx2
import psycopg
import pytest
import yaml
from cryptography.fernet import Fernet
from mcp.client.auth import OAuthFlowError
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyUrl
from starlette.types import Receive, Scope, Send

from mcp_spec_proxy.backends.oauth import BackendAuth, backend_logins
from mcp_spec_proxy.config.schema import ProxyConfig, parse_config_text
from mcp_spec_proxy.errors import ConfigError, StateError
from mcp_spec_proxy.fronts.asgi import serve_asgi
from mcp_spec_proxy.store import TokenStores, token_stores
from mcp_spec_proxy.store.pg_tokens import PgTokens
from mcp_spec_proxy.store.postgres import migrate_database
from tests.harness import PROXY_COMMAND, proxy_env
from tests.pg import DSN_ENV, rows

pytestmark = pytest.mark.anyio

KEY_ENV = "MCP_SPEC_PROXY_TOKEN_KEY"
URL = "https://tracker.example.com/mcp"


def _config(url: str = URL, **auth: Any) -> ProxyConfig:
    server = {"url": url, "auth": {"login_timeout": 1, **auth} if auth else "oauth"}
    return ProxyConfig.model_validate({"servers": {"tracker": server}, "store": {"postgres": {"dsn_env": DSN_ENV}}})


def _stores(dsn: str, key: str, config: ProxyConfig | None = None) -> TokenStores:
    return token_stores(config or _config(), Path("unused"), {DSN_ENV: dsn, KEY_ENV: key}, "servers.yaml")


def _row(dsn: str, key: str) -> PgTokens:
    tokens = _stores(dsn, key)("tracker", URL)
    assert isinstance(tokens, PgTokens)  # under `store: postgres`, the database's row
    return tokens


@pytest.fixture
def db(pg_dsn: str) -> str:
    """A fresh database with the store's schema, as a replica's start leaves it."""
    anyio.run(migrate_database, pg_dsn, 10)
    return pg_dsn


def _client(secret: str | None = None) -> OAuthClientInformationFull:
    return OAuthClientInformationFull(
        client_id="tracker-client", client_secret=secret, redirect_uris=[AnyUrl("http://127.0.0.1:1/callback")]
    )


async def test_tokens_round_trip_and_the_table_holds_none_of_their_bytes(db: str) -> None:
    key = Fernet.generate_key().decode()
    tokens = _row(db, key)
    secret_words = ["at-" + secrets.token_hex(8), "rt-" + secrets.token_hex(8), "cs-" + secrets.token_hex(8)]
    at, rt, cs = secret_words
    await tokens.set_client_info(_client(cs))
    await tokens.set_tokens(OAuthToken(access_token=at, refresh_token=rt, expires_in=600, scope="read"))
    person = tokens.of_principal("https://id.example.com/", "alice")
    await person.set_tokens(OAuthToken(access_token="alice-at-" + secrets.token_hex(8)))

    again = _stores(db, key)("tracker", URL)  # another replica: the same rows
    kept, expires_at = await again.kept()
    assert kept is not None and (kept.access_token, kept.refresh_token, kept.scope) == (at, rt, "read")
    assert expires_at is not None
    client = await again.get_client_info()
    assert client is not None and client.client_secret == cs
    state = await again.state()
    assert state.logged_in and state.refreshable and "token expires in 10 min" in state.describe()
    assert await again.principals_logged_in() == 1
    hers = await again.of_principal("https://id.example.com/", "alice").get_tokens()
    assert hers is not None and hers.access_token.startswith("alice-at-")
    assert await again.of_principal("https://id.example.com/", "bob").get_tokens() is None
    assert await _stores(db, key)("tracker", "https://evil.example.com/mcp").get_tokens() is None  # another URL's

    raw = rows(db, "SELECT * FROM backend_tokens")
    dumped = rows(db, "SELECT row_to_json(t)::text FROM backend_tokens t")
    assert len(raw) == 2
    seen = repr(raw).encode() + b"".join(bytes(v) for row in raw for v in row if isinstance(v, bytes | memoryview))
    seen += "".join(row[0] for row in dumped).encode()
    assert not [word for word in [*secret_words, "alice"] if word.encode() in seen]
    assert {row[1] for row in raw} == {"", tokens.of_principal("https://id.example.com/", "alice").person}

    assert await again.forget_tokens() and not await again.forget_tokens()
    assert await tokens.get_tokens() is None and await tokens.get_client_info() is not None  # the client stays


async def test_a_row_copied_onto_another_login_is_not_used(db: str) -> None:
    key = Fernet.generate_key().decode()
    alice, bob = _row(db, key).of_principal("iss", "alice"), _row(db, key).of_principal("iss", "bob")
    await alice.set_tokens(OAuthToken(access_token="alices"))
    await bob.set_tokens(OAuthToken(access_token="bobs"))
    # Someone with the database but not the key moves Alice's ciphertext onto Bob's row.
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE backend_tokens b SET tokens = a.tokens FROM backend_tokens a WHERE a.person = %s AND b.person = %s",
            (alice.person, bob.person),
        )
    assert await bob.get_tokens() is None
    kept = await alice.get_tokens()
    assert kept is not None and kept.access_token == "alices"


async def test_a_changed_key_reads_as_log_in_again_in_one_line_and_the_old_key_after_the_new_still_reads(
    db: str, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    await _stores(db, old)("tracker", URL).set_tokens(OAuthToken(access_token="kept-at", refresh_token="kept-rt"))
    caplog.set_level(logging.WARNING)
    rotated = _stores(db, new)("tracker", URL)
    assert await rotated.get_tokens() is None
    assert not (await rotated.state()).logged_in
    lines = [r.getMessage() for r in caplog.records if "cannot be decrypted" in r.getMessage()]
    assert lines and all("\n" not in line and KEY_ENV in line and "log" in line for line in lines), lines
    assert not [r for r in caplog.records if r.exc_info]
    both = _stores(db, f"{new}, {old}")("tracker", URL)
    kept = await both.get_tokens()
    assert kept is not None and kept.access_token == "kept-at"
    await both.set_tokens(kept)  # written again: with the newest key
    kept = await rotated.get_tokens()
    assert kept is not None and kept.refresh_token == "kept-rt"


def test_no_key_or_a_bad_one_is_a_config_error_naming_the_variable_and_how_to_make_one() -> None:
    env = {DSN_ENV: "postgresql://unused/db"}
    with pytest.raises(ConfigError, match=rf"{KEY_ENV} is not set.*mcp-spec-proxy store token-key"):
        token_stores(_config(), Path("unused"), env, "servers.yaml")
    with pytest.raises(ConfigError, match=rf"{KEY_ENV} holds no Fernet key"):
        token_stores(_config(), Path("unused"), {**env, KEY_ENV: "not-a-key"}, "servers.yaml")
    plain = ProxyConfig.model_validate(
        {"servers": {"fs": {"command": "x"}}, "store": {"postgres": {"dsn_env": DSN_ENV}}}
    )
    token_stores(plain, Path("unused"), env, "servers.yaml")  # no `auth:` backend: no key asked for


def _cli(*args: str, config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [PROXY_COMMAND, *args, "--config", str(config), "--state-dir", str(config.parent / "state")]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_check_login_state_and_logout_work_against_the_database(tmp_path: Path, db: str) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(
        yaml.safe_dump(
            {"servers": {"tracker": {"url": URL, "auth": "oauth"}}, "store": {"postgres": {"dsn_env": DSN_ENV}}}
        )
    )
    env = {**proxy_env(), DSN_ENV: db}
    env.pop(KEY_ENV, None)
    refused = _cli("check", config=config, env=env)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if line.strip()]
    assert KEY_ENV in line and "mcp-spec-proxy store token-key" in line, line
    made = subprocess.run([PROXY_COMMAND, "store", "token-key"], capture_output=True, text=True, timeout=60, env=env)
    key = made.stdout.strip()
    Fernet(key.encode())  # a key Fernet takes
    env[KEY_ENV] = key
    checked = _cli("check", config=config, env=env)
    assert checked.returncode == 0, checked.stderr
    assert "tracker: not logged in — run `mcp-spec-proxy login tracker`" in checked.stdout
    anyio.run(_stores(db, key)("tracker", URL).set_tokens, OAuthToken(access_token="secret-at", expires_in=600))
    checked = _cli("check", config=config, env=env)
    assert "tracker: logged in, token expires in 10 min" in checked.stdout, checked.stdout + checked.stderr
    assert "secret-at" not in checked.stdout + checked.stderr
    out = _cli("logout", "tracker", config=config, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "tracker: logged out", out.stderr
    assert rows(db, "SELECT count(*) FROM backend_tokens WHERE tokens IS NOT NULL") == [(0,)]
    assert "tracker: not logged in" in _cli("check", config=config, env=env).stdout
    assert not (tmp_path / "state" / "oauth").exists()  # nothing went to the state directory


@dataclass
class TokenEndpoint:
    """A resource and its authorization server on one loopback origin: each refresh token is good
    once (a refresh rotates it), each access token until the test revokes it."""

    base: str = ""
    access: set[str] = field(default_factory=set)
    refresh: set[str] = field(default_factory=set)
    refreshes: int = 0
    refused: list[str] = field(default_factory=list)  # the refresh tokens spent a second time
    served: list[str] = field(default_factory=list)

    def issue(self) -> OAuthToken:
        at, rt = "at-" + secrets.token_hex(8), "rt-" + secrets.token_hex(8)
        self.access.add(at)
        self.refresh.add(rt)
        return OAuthToken(access_token=at, refresh_token=rt, expires_in=3600)

    def revoke_access(self) -> None:
        self.access.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        status, answer, headers = 404, b"{}", [(b"content-type", b"application/json")]
        if scope["path"] == "/token":
            form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            spent = form.get("refresh_token", "")
            if form.get("grant_type") == "refresh_token" and spent in self.refresh:
                self.refresh.discard(spent)  # rotated: never good again
                self.refreshes += 1
                status, answer = 200, self.issue().model_dump_json(exclude_none=True).encode()
            else:
                self.refused.append(spent)
                status, answer = 400, json.dumps({"error": "invalid_grant"}).encode()
        elif scope["path"] == "/mcp":
            bearer = dict(scope["headers"]).get(b"authorization", b"").decode().removeprefix("Bearer ")
            if bearer in self.access:
                self.served.append(bearer)
                status, answer = 200, b'{"ok": true}'
            else:
                status = 401
                headers.append((b"www-authenticate", b'Bearer error="invalid_token"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def token_endpoint() -> AsyncIterator[TokenEndpoint]:
    endpoint = TokenEndpoint()
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(endpoint, "127.0.0.1", 0, task_status=task_status))
        endpoint.base = f"http://127.0.0.1:{port}"
        yield endpoint
        tg.cancel_scope.cancel()


def _replica(db: str, key: str, url: str) -> BackendAuth:
    """One replica's OAuth client of the backend: its own provider, the shared database's tokens."""
    config = _config(url, callback_port=_free_port())
    environ = {DSN_ENV: db, KEY_ENV: key}
    auth = backend_logins(config.servers, Path("unused"), environ, "servers.yaml", _stores(db, key, config))["tracker"]
    auth._open_browser = lambda url: None  # no person here: a login this test did not expect fails, never waits
    return auth


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def _get(auth: BackendAuth, url: str) -> int:
    async with httpx2.AsyncClient(auth=auth.provider, timeout=30) as http:
        return (await http.get(url)).status_code


async def test_two_replicas_refreshing_a_rotating_token_at_once_both_keep_working(db: str) -> None:
    key = Fernet.generate_key().decode()
    async with token_endpoint() as server:
        url = f"{server.base}/mcp"
        first = server.issue()
        login = _stores(db, key, _config(url))("tracker", url)  # what `login` left in the database
        await login.set_client_info(_client())
        await login.set_tokens(first)
        a, b = _replica(db, key, url), _replica(db, key, url)
        with anyio.fail_after(60):
            assert [await _get(a, url), await _get(b, url)] == [200, 200]  # each holds the first tokens now
            for round_ in range(3):
                server.revoke_access()  # both replicas' access token is refused: each refreshes
                statuses: list[int] = []

                async def call(auth: BackendAuth, statuses: list[int] = statuses) -> None:
                    statuses.append(await _get(auth, url))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(call, a)
                    tg.start_soon(call, b)
                assert statuses == [200, 200], (round_, statuses, server.refused)
            kept = await login.get_tokens()
    assert server.refused == []  # no refresh token was ever spent twice
    assert server.refreshes == 3  # one refresh per revocation, however many replicas needed it
    assert kept is not None and kept.refresh_token in server.refresh and kept.access_token in server.access
    assert server.served[-2:] == [kept.access_token, kept.access_token]  # both replicas use the one login


async def test_a_logout_on_one_replica_is_a_login_needed_on_the_other(db: str) -> None:
    key = Fernet.generate_key().decode()
    async with token_endpoint() as server:
        url = f"{server.base}/mcp"
        login = _stores(db, key, _config(url))("tracker", url)
        await login.set_client_info(_client())
        await login.set_tokens(server.issue())
        a, b = _replica(db, key, url), _replica(db, key, url)
        with anyio.fail_after(60):
            assert [await _get(a, url), await _get(b, url)] == [200, 200]
            assert await a.tokens.forget_tokens()  # `logout` on replica A
            assert await b.tokens.get_tokens() is None
            server.revoke_access()
            served = len(server.served)
            with pytest.raises(OAuthFlowError, match="no login within"):  # B asks for a new login; none comes
                await _get(b, url)
    assert server.refreshes == 0 and server.refused == []  # B spent no refresh token of the dropped login
    assert len(server.served) == served


def test_the_key_variable_the_config_names_is_the_one_asked_for() -> None:
    parsed = parse_config_text(
        yaml.safe_dump(
            {
                "servers": {"tracker": {"url": URL, "auth": "oauth"}},
                "store": {"postgres": {"dsn_env": DSN_ENV, "token_key_env": "TRACKER_TOKENS_KEY"}},
            }
        ),
        {},
    )
    with pytest.raises(ConfigError, match=r"store\.postgres\.token_key_env.*TRACKER_TOKENS_KEY is not set"):
        token_stores(parsed, Path("unused"), {DSN_ENV: "postgresql://unused/db", KEY_ENV: "x"}, "servers.yaml")


async def test_a_database_without_the_tokens_table_says_how_to_make_it(pg_dsn: str) -> None:
    tokens = _row(pg_dsn, Fernet.generate_key().decode())  # a database no replica has migrated yet
    with pytest.raises(StateError, match=r"no table of backend tokens yet: run `mcp-spec-proxy store migrate`"):
        await tokens.get_tokens()
