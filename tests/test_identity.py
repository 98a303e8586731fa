"""Identity at the HTTP front (`auth:`): the proxy as an OAuth resource server, against a real
authorization server (oauth2-mock-server, `tests/oauth.py`) and the MCP SDK's own client.

The backend is the toy's ledger (`record` appends to a file): a refused request ran nothing.
The attacks on the token itself are in `test_identity_attacks.py`.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import patch

import anyio
import httpx
import httpx2
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthToken
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.identity import AuthConfig
from mcp_spec_proxy.config.schema import ProxyConfig, parse_config_text
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.fronts import identity
from mcp_spec_proxy.fronts.asgi import host_names, serve_asgi
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.identity import (
    REFETCH_BURST,
    REFETCH_EVERY_S,
    IssuerKeys,
    JwtVerifier,
    principal_from_claims,
)
from mcp_spec_proxy.fronts.mcp import SESSION_HEADER, McpFront
from mcp_spec_proxy.fronts.probes import Door
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.store.tokens import TokenFile
from tests.fixtures import toy_server
from tests.harness import ERAS, PROXY_COMMAND, proxy_env, recorded, request_meta, text_of, toy, toy_twins
from tests.oauth import AuthServer, TokenMemory, authorization_server

pytestmark = pytest.mark.anyio

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
RECORD = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "toy__record", "arguments": {"value": "v"}},
}


@dataclass
class Front:
    url: str
    ledger: Path
    state: Path

    def audit(self) -> list[dict[str, Any]]:
        """The audit lines (read once the proxy has stopped: reads are written with the next commit)."""
        return list(read_audit(self.state / "audit.jsonl"))

    def principals(self, event: str) -> list[Any]:
        return [line.get("principal") for line in self.audit() if line["event"] == event]


@asynccontextmanager
async def protected(
    tmp_path: Path,
    issuer: str,
    *,
    scopes: tuple[str, ...] = ("mcp",),
    servers: dict[str, Any] | None = None,
    introspection: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
    telemetry: Path | None = None,
) -> AsyncIterator[Front]:
    """The proxy's HTTP front under `auth:`, its audience its own URL (the port is bound first)."""
    ledger = tmp_path / "rec"
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            door = Door(token=None, hosts=host_names("127.0.0.1"))
            port = await tg.start(door.serve, "127.0.0.1", 0)
            url = f"http://127.0.0.1:{port}/mcp"
            raw = {
                "servers": servers or {"toy": toy(ledger)},
                "review": {"default": "allow"},
                "auth": {
                    "issuer": issuer,
                    "audience": url,
                    "scopes": list(scopes),
                    **({"introspection": introspection} if introspection else {}),
                },
            }
            config = ProxyConfig.model_validate(raw)
            state = StatePaths(tmp_path / "state")
            async with running_proxy(
                config, state, telemetry=telemetry, in_process=toy_twins(raw), environ=environ
            ) as proxy:
                front = McpFront(proxy)
                await tg.start(
                    lambda task_status: serve_http(front, "127.0.0.1", port, door=door, task_status=task_status)
                )
                yield Front(url, ledger, tmp_path / "state")
                tg.cancel_scope.cancel()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def client_with(
    url: str, token: str, mode: str, headers: Mapping[str, str] | None = None
) -> AsyncIterator[Client]:
    """The MCP SDK's client, its requests carrying the bearer token (and `headers`)."""
    async with (
        httpx2.AsyncClient(headers={**bearer(token), **(headers or {})}) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as client,
    ):
        yield client


async def alice(auth: AuthServer, front: Front, **claims: Any) -> str:
    return await auth.mint(**{"sub": "alice", "client_id": "cli-a", "aud": front.url, "scope": "mcp", **claims})


async def test_protected_resource_metadata_names_the_issuer_at_both_well_known_paths(tmp_path: Path) -> None:
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front, httpx.AsyncClient() as http:
        origin = front.url.removesuffix("/mcp")
        documents = [(await http.get(f"{origin}/.well-known/oauth-protected-resource{tail}")) for tail in ("/mcp", "")]
    for document in documents:
        assert document.status_code == 200
        body = document.json()
        assert body["resource"] == front.url
        assert body["authorization_servers"] == [auth.issuer]
        assert body["scopes_supported"] == ["mcp"]


async def test_a_request_without_a_token_gets_401_naming_the_resource_metadata(tmp_path: Path) -> None:
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front, httpx.AsyncClient() as http:
        bare = await http.post(front.url, json=INITIALIZE, headers=HEADERS)
        not_bearer = await http.post(front.url, json=INITIALIZE, headers={**HEADERS, "Authorization": "Basic eDp5"})
    origin = front.url.removesuffix("/mcp")
    for refused in (bare, not_bearer):
        assert refused.status_code == 401
        challenge = refused.headers["www-authenticate"]
        assert challenge.startswith("Bearer ")
        assert f'resource_metadata="{origin}/.well-known/oauth-protected-resource/mcp"' in challenge
    assert recorded(front.ledger) == []


async def test_a_token_without_the_required_scope_gets_403_insufficient_scope(tmp_path: Path) -> None:
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front, httpx.AsyncClient() as http:
        token = await alice(auth, front, scope="profile email")
        refused = await http.post(front.url, json=INITIALIZE, headers={**HEADERS, **bearer(token)})
    assert refused.status_code == 403
    assert 'error="insufficient_scope"' in refused.headers["www-authenticate"]


@pytest.mark.parametrize("mode", ERAS)
async def test_each_call_is_audited_with_the_tokens_principal_and_not_one_the_client_claims(
    tmp_path: Path, mode: str
) -> None:
    """The principal comes from the verified token alone: a header or `_meta` that names another
    is not read, and the audit names the token's subject and client on the read and the write."""
    claims = {"X-Principal": "mallory", "X-Forwarded-User": "mallory", "X-Mcp-Principal-Sub": "mallory"}
    meta = request_meta({"principal": {"sub": "mallory"}, "mcp-spec-proxy/principal": "mallory", "sub": "mallory"})
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        token = await alice(auth, front, groups=["eng"])
        async with client_with(front.url, token, mode, claims) as client:
            echoed = await client.call_tool("toy__echo", {"text": "hi"}, meta=meta)
            written = await client.call_tool("toy__record", {"value": "v"}, meta=meta)
    assert text_of(echoed) == "hi" and not written.is_error
    assert recorded(front.ledger) == ['{"value": "v"}']
    alice_ = {"sub": "alice", "client_id": "cli-a"}
    assert front.principals("read") == [alice_]
    assert front.principals("held") == [alice_] and front.principals("verdict") == [alice_]


async def test_the_sdks_oauth_client_gets_its_token_by_client_credentials_and_is_served(tmp_path: Path) -> None:
    """The MCP SDK's `ClientCredentialsOAuthProvider` follows the 401 to the resource metadata, the
    issuer's metadata and its token endpoint (RFC 8707 `resource`: this proxy), then calls."""

    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        provider = ClientCredentialsOAuthProvider(
            server_url=front.url,
            storage=TokenMemory(),
            client_id="robot",
            client_secret="s",
            scope="mcp",
            issuer=auth.issuer,
        )
        async with (
            httpx2.AsyncClient(auth=provider) as http,
            Client(streamable_http_client(front.url, http_client=http), mode="legacy") as client,
        ):
            written = await client.call_tool("toy__record", {"value": "by robot"})
    assert not written.is_error
    assert recorded(front.ledger) == ['{"value": "by robot"}']
    assert front.principals("held") == [{"sub": "robot", "client_id": "robot"}]


async def test_a_session_answers_only_the_principal_that_opened_it(tmp_path: Path) -> None:
    """Another principal's valid token on alice's Mcp-Session-Id gets 404, as if the session did
    not exist (the MCP SDK's answer: it tells no one which session ids are live, and a client that
    gets it starts a session of its own), and runs nothing."""
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front, httpx.AsyncClient() as http:
        mine, theirs = await alice(auth, front), await alice(auth, front, sub="bob", client_id="cli-b")
        opened = await http.post(front.url, json=INITIALIZE, headers={**HEADERS, **bearer(mine)})
        session = {"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(front.url, json=note, headers={**HEADERS, **session, **bearer(mine)})
        taken = await http.post(front.url, json=RECORD, headers={**HEADERS, **session, **bearer(theirs)})
        ended = await http.delete(front.url, headers={**HEADERS, **session, **bearer(theirs)})
        still = await http.post(front.url, json=RECORD, headers={**HEADERS, **session, **bearer(mine)})
    assert taken.status_code == 404 and ended.status_code == 404
    assert still.status_code == 200
    assert recorded(front.ledger) == ['{"value": "v"}']  # alice's call alone
    assert front.principals("held") == [{"sub": "alice", "client_id": "cli-a"}]


async def test_a_named_2026_session_is_the_principals_own(tmp_path: Path) -> None:
    """On the 2026-07-28 era a session is named by the client: bob naming alice's session name
    gets a session of his own, never alice's trajectory."""
    async with authorization_server() as auth, protected(tmp_path, auth.issuer) as front:
        mine, theirs = await alice(auth, front), await alice(auth, front, sub="bob", client_id="cli-b")
        for token in (mine, theirs):
            async with client_with(front.url, token, "2026-07-28", {SESSION_HEADER: "shared"}) as client:
                await client.call_tool("toy__echo", {"text": "hi"})
    reads = [line for line in front.audit() if line["event"] == "read"]
    assert [line["principal"]["sub"] for line in reads] == ["alice", "bob"]
    assert reads[0]["session"] != reads[1]["session"]


async def test_the_clients_token_never_reaches_a_backend(tmp_path: Path) -> None:
    """A URL backend (the toy over streamable HTTP) hears the proxy's own requests: none carries
    the client's token, or any Authorization at all."""
    heard: list[dict[bytes, bytes]] = []

    def listening(app: ASGIApp) -> ASGIApp:
        async def recorder(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                heard.append(dict(scope["headers"]))
            await app(scope, receive, send)

        return recorder

    backend = toy_server.build(tmp_path / "rec").streamable_http_app(host="127.0.0.1")
    async with anyio.create_task_group() as tg:
        port = await tg.start(
            lambda task_status: serve_asgi(listening(backend), "127.0.0.1", 0, task_status=task_status)
        )
        servers = {"far": {"url": f"http://127.0.0.1:{port}/mcp"}}
        async with authorization_server() as auth, protected(tmp_path, auth.issuer, servers=servers) as front:
            token = await alice(auth, front)
            async with client_with(front.url, token, "legacy") as client:
                written = await client.call_tool("far__record", {"value": "far"})
        tg.cancel_scope.cancel()
    assert not written.is_error and recorded(tmp_path / "rec") == ['{"value": "far"}']
    assert heard and all(b"authorization" not in headers for headers in heard)
    assert not any(token.encode() in value for headers in heard for value in headers.values())


async def test_a_backend_with_auth_hears_its_own_token_and_never_the_clients(tmp_path: Path) -> None:
    """A URL backend with `auth:` that takes only the tokens its logins kept: the shared session
    carries the operator's, alice's own backend session carries alice's own (never the operator's,
    never the client's), and her call runs."""
    heard: list[tuple[bytes, bool]] = []  # (authorization, whether the request was a tool call)

    def guarded(app: ASGIApp) -> ASGIApp:
        async def guard(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            heard.append((dict(scope["headers"]).get(b"authorization", b""), b'"tools/call"' in body))
            if heard[-1][0] not in (b"Bearer operator-token", b"Bearer alice-token"):
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b""})
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)

        return guard

    backend = toy_server.build(tmp_path / "rec").streamable_http_app(host="127.0.0.1")
    async with anyio.create_task_group() as tg:
        port = await tg.start(lambda task_status: serve_asgi(guarded(backend), "127.0.0.1", 0, task_status=task_status))
        url = f"http://127.0.0.1:{port}/mcp"
        operator = TokenFile.of(tmp_path / "state", "far", url)
        await operator.set_tokens(OAuthToken(access_token="operator-token"))
        servers = {"far": {"url": url, "auth": "oauth"}}
        async with authorization_server() as auth:
            await operator.of_principal(auth.issuer, "alice").set_tokens(OAuthToken(access_token="alice-token"))
            async with protected(tmp_path, auth.issuer, servers=servers) as front:
                token = await alice(auth, front)
                async with client_with(front.url, token, "legacy") as client:
                    written = await client.call_tool("far__record", {"value": "far"})
        tg.cancel_scope.cancel()
    assert not written.is_error and recorded(tmp_path / "rec") == ['{"value": "far"}']
    assert {bearer for bearer, call in heard if call} == {b"Bearer alice-token"}
    assert {bearer for bearer, _ in heard} == {b"Bearer operator-token", b"Bearer alice-token"}
    assert not any(token.encode() in value for value, _ in heard)


@pytest.mark.parametrize("field", ["issuer", "audience"])
def test_an_http_issuer_or_audience_is_refused_off_loopback(field: str) -> None:
    urls = {"issuer": "https://id.example.com/", "audience": "https://proxy.example.com/mcp"}
    text = yaml.safe_dump({"auth": {**urls, field: "http://id.example.com/"}})
    with pytest.raises(ConfigError) as refused:
        parse_config_text(text, {})
    assert f"auth.{field}" in str(refused.value) and "must use https" in str(refused.value)
    loopback = {"issuer": "http://127.0.0.1:9000", "audience": "http://localhost:8765/mcp"}
    assert parse_config_text(yaml.safe_dump({"auth": loopback}), {}).auth is not None  # a test's issuer


async def test_unknown_key_ids_refetch_the_jwks_in_a_burst_then_one_per_interval() -> None:
    """`IssuerKeys` against an in-memory issuer (the flood test runs the real one): the burst,
    then nothing until the allowance refills, then one fetch per `REFETCH_EVERY_S`."""
    fetched: list[str] = []

    def issuer(request: httpx.Request) -> httpx.Response:
        fetched.append(request.url.path)
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(
                200, json={"issuer": "https://id.example.com", "jwks_uri": "https://id.example.com/k"}
            )
        return httpx.Response(200, json={"keys": [{"kty": "RSA", "kid": "real", "n": "AQAB", "e": "AQAB"}]})

    now = [0.0]
    async with httpx.AsyncClient(transport=httpx.MockTransport(issuer)) as client:
        keys = IssuerKeys("https://id.example.com", client=client, clock=lambda: now[0])
        assert await keys.key("real") is not None  # the first fetch: discovery, then the JWKS
        for n in range(3 * REFETCH_BURST):
            assert await keys.key(f"made-up-{n}") is None
        burst = fetched.count("/k")
        now[0] += REFETCH_EVERY_S
        await keys.key("made-up-again")
        await keys.key("made-up-once-more")
        assert await keys.key("real") is not None  # a known key costs no fetch, allowance or not
    assert burst == REFETCH_BURST
    assert fetched.count("/k") == REFETCH_BURST + 1
    assert fetched.count("/.well-known/oauth-authorization-server") == 1  # discovery is done once


def test_the_command_refuses_a_shared_token_beside_auth(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    auth = {"issuer": "https://id.example.com/", "audience": "https://proxy.example.com/mcp"}
    config.write_text(yaml.safe_dump({"servers": {}, "auth": auth}))
    argv = [PROXY_COMMAND, "-c", str(config), "--state-dir", str(tmp_path / "s"), "--http", "127.0.0.1:0"]
    ran = subprocess.run([*argv, "--token-env", "SHARED"], env={**proxy_env(), "SHARED": "s3cret"}, capture_output=True)
    assert ran.returncode != 0
    assert "--token-env" in ran.stderr.decode() and "drop --token-env" in ran.stderr.decode()


def test_the_principal_is_read_from_the_claims_each_issuer_spells_its_own_way() -> None:
    """`scope` (a string) or `scp` (a list: Entra, Okta); `client_id` or `azp`; groups under the
    configured claim, a lone string taken as one group and anything not a string dropped."""
    okta = {"iss": "https://id.example.com", "sub": "u1", "scp": ["mcp", "read"], "azp": "app", "roles": "admins"}
    plain = {"iss": "https://id.example.com", "sub": "u2", "scope": "mcp", "client_id": "c", "groups": ["a", 7, "b"]}
    assert principal_from_claims(okta, "roles") == Principal(
        "https://id.example.com", "u1", "app", ("mcp", "read"), ("admins",)
    )
    assert principal_from_claims(plain, "groups") == Principal(
        "https://id.example.com", "u2", "c", ("mcp",), ("a", "b")
    )
    assert principal_from_claims({"iss": "i", "sub": "s"}, "groups") == Principal("i", "s")


async def test_a_verified_token_is_trusted_only_until_it_expires_and_while_its_key_is_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The verifier checks a token's signature once (clients send the same token with every request),
    then answers from what it verified — never past the token's `exp`, never once the issuer no
    longer publishes the key that verified it."""
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key(), as_dict=True)
    published: list[dict[str, Any]] = [{**public, "kid": "k1", "alg": "RS256", "use": "sig"}]

    def issuer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/.well-known/oauth-authorization-server":
            return httpx.Response(
                200, json={"issuer": "https://id.example.com", "jwks_uri": "https://id.example.com/k"}
            )
        return httpx.Response(200, json={"keys": [dict(key) for key in published]})

    now = [time.time()]
    monkeypatch.setattr(identity, "LEEWAY_S", 0)  # expiry as it is: the test waits out a 2 s token
    config = AuthConfig(issuer="https://id.example.com", audience="https://proxy.example.com/mcp")
    expires = int(now[0]) + 2
    claims = {"iss": "https://id.example.com", "aud": config.audience, "sub": "ann", "exp": expires}
    token = jwt.encode(claims, private, algorithm="RS256", headers={"kid": "k1"})
    async with httpx.AsyncClient(transport=httpx.MockTransport(issuer)) as client:
        keys = IssuerKeys(config.issuer, client=client, clock=lambda: now[0])
        verifier = JwtVerifier(config, keys)
        with patch("mcp_spec_proxy.fronts.identity.jwt.decode", wraps=jwt.decode) as decode:
            assert (await verifier.verify_token(token)) is not None
            assert (await verifier.verify_token(token)) is not None
            assert decode.call_count == 1  # the second request costs no signature check
            await anyio.sleep(max(0.0, expires + 1 - time.time()))  # past its exp
            assert await verifier.verify_token(token) is None
        fresh = jwt.encode({**claims, "exp": int(time.time()) + 60}, private, algorithm="RS256", headers={"kid": "k1"})
        assert await verifier.verify_token(fresh) is not None
        published.clear()  # the issuer withdraws the key; an unknown kid refetches the JWKS
        now[0] += REFETCH_EVERY_S * (REFETCH_BURST + 1)  # the JWKS may be fetched again
        await keys.key("not-there")
        assert await verifier.verify_token(fresh) is None  # its key is gone: nothing cached speaks for it
