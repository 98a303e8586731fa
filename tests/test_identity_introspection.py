"""Opaque tokens at the HTTP front (`auth.introspection`), checked at a real authorization server's
RFC 7662 endpoint: oauth2-mock-server's own `POST /introspect`, which takes only the proxy's client
by HTTP Basic (`tests/oauth.py`, `INTROSPECTION_CLIENT`) and answers what the test made the token.

The backend is the toy's ledger: a refused token ran nothing. The issuer counts its introspection
requests (`stats()["introspect"]`): that shows the cache, and a token refused before any request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcp_spec_proxy.config.identity import AuthConfig
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.fronts.identity import LEEWAY_S, JwtVerifier
from mcp_spec_proxy.fronts.introspection import BearerVerifier, Introspector
from mcp_spec_proxy.proxy import validate
from tests.harness import recorded
from tests.oauth import INTROSPECTION_CLIENT, AuthServer, authorization_server
from tests.test_identity import INITIALIZE, RECORD, Front, alice, bearer, client_with, protected
from tests.test_identity_attacks import open_session, post

pytestmark = pytest.mark.anyio

CLIENT_ID, SECRET = INTROSPECTION_CLIENT
ENVIRON = {"INTROSPECTION_SECRET": SECRET}
INTROSPECTION = {"client_id": CLIENT_ID, "client_secret_env": "INTROSPECTION_SECRET", "timeout_s": 2}

Forge = Callable[[AuthServer, Front], Awaitable[str]]


async def opaque_alice(auth: AuthServer, front: Front, **claims: Any) -> str:
    fields = {"sub": "alice", "client_id": "cli-a", "aud": front.url, "scope": "mcp", "groups": ["eng"]}
    return await auth.opaque(**{**fields, **claims})


async def _inactive(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, active=False)


async def _active_as_text(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, active="true")


async def _revoked(auth: AuthServer, front: Front) -> str:
    token = await opaque_alice(auth, front)
    await auth.revoke(token)
    return token


async def _never_issued(auth: AuthServer, front: Front) -> str:
    return "b3BhcXVlLWJ1dC1tYWRlLXVw"


async def _another_audience(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, aud="https://other.example.com/mcp")


async def _expired(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, exp=int(time.time()) - 600)


async def _no_exp(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, drop=("exp",))


async def _another_issuer(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, iss="https://id.other.example.com")


async def _no_subject(auth: AuthServer, front: Front) -> str:
    return await opaque_alice(auth, front, drop=("sub",))


ATTACKS: dict[str, Forge] = {
    "active-false": _inactive,
    "active-as-text": _active_as_text,
    "revoked": _revoked,
    "never-issued": _never_issued,
    "another-audience": _another_audience,
    "expired": _expired,
    "no-exp": _no_exp,
    "another-issuer": _another_issuer,
    "no-sub": _no_subject,
}


async def test_an_opaque_token_the_issuer_vouches_for_is_served_as_its_principal(tmp_path: Path) -> None:
    async with (
        authorization_server() as auth,
        protected(tmp_path, auth.issuer, introspection=INTROSPECTION, environ=ENVIRON) as front,
    ):
        token = await opaque_alice(auth, front)
        async with client_with(front.url, token, "legacy") as client:
            assert not (await client.call_tool("toy__record", {"value": "one"})).is_error
            assert not (await client.call_tool("toy__record", {"value": "two"})).is_error
        asked = (await auth.stats())["introspect"]
        async with client_with(front.url, await alice(auth, front, sub="bob"), "legacy") as client:
            assert not (await client.call_tool("toy__record", {"value": "a JWT"})).is_error  # checked locally
        asked_after_the_jwt = (await auth.stats())["introspect"]
    assert recorded(front.ledger) == ['{"value": "one"}', '{"value": "two"}', '{"value": "a JWT"}']
    principals = front.principals("held")
    assert principals == [{"sub": "alice", "client_id": "cli-a"}] * 2 + [{"sub": "bob", "client_id": "cli-a"}]
    assert asked == 1  # every request of the session bore it: asked once, then the cached answer
    assert asked_after_the_jwt == asked


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_an_opaque_token_the_issuer_does_not_vouch_for_is_refused_and_runs_nothing(
    tmp_path: Path, attack: str
) -> None:
    async with (
        authorization_server() as auth,
        protected(tmp_path, auth.issuer, introspection=INTROSPECTION, environ=ENVIRON) as front,
        httpx.AsyncClient() as http,
    ):
        honest = await opaque_alice(auth, front)
        forged = await ATTACKS[attack](auth, front)
        session = await open_session(http, front.url, honest)
        on_a_live_session = await post(http, front.url, RECORD, {**session, **bearer(forged)})
        opening = await post(http, front.url, INITIALIZE, bearer(forged))
    for refused in (on_a_live_session, opening):
        assert refused is not None and refused.status_code == 401, (attack, refused)
        assert "resource_metadata=" in refused.headers["www-authenticate"]
    assert recorded(front.ledger) == []


async def test_an_endpoint_that_hangs_refuses_even_a_good_token_then_serves_it_once_back(tmp_path: Path) -> None:
    async with (
        authorization_server() as auth,
        protected(tmp_path, auth.issuer, introspection=INTROSPECTION, environ=ENVIRON) as front,
        httpx.AsyncClient() as http,
    ):
        token = await opaque_alice(auth, front)
        await auth.hang()
        while_hanging = await post(http, front.url, INITIALIZE, bearer(token))
        await auth.hang(False)
        opened = await post(http, front.url, INITIALIZE, bearer(token))
        asked = (await auth.stats())["introspect"]
    assert while_hanging is not None and while_hanging.status_code == 401  # fail closed, never open
    assert opened is not None and opened.status_code == 200
    assert asked == 2  # the refusal was not cached: the token was asked about again


async def test_the_proxy_that_authenticates_wrongly_at_the_endpoint_refuses_every_opaque_token(tmp_path: Path) -> None:
    environ = {"INTROSPECTION_SECRET": "not-the-secret"}
    async with (
        authorization_server() as auth,
        protected(tmp_path, auth.issuer, introspection=INTROSPECTION, environ=environ) as front,
        httpx.AsyncClient() as http,
    ):
        refused = await post(http, front.url, INITIALIZE, bearer(await opaque_alice(auth, front)))
        asked = (await auth.stats())["introspect"]
    assert refused is not None and refused.status_code == 401
    assert asked == 1  # it asked, with the secret it has, and took the endpoint's 401 as a refusal


def _config(issuer: str, **introspection: Any) -> AuthConfig:
    settings = {"url": f"{issuer}/introspect", **INTROSPECTION, **introspection}
    return AuthConfig.model_validate(
        {"issuer": issuer, "audience": "http://127.0.0.1:9/mcp", "scopes": ["mcp"], "introspection": settings}
    )


@pytest.mark.parametrize("tokens", ["opaque", "all"])
async def test_a_megabyte_token_is_refused_before_any_request(tokens: str) -> None:
    async with authorization_server() as auth:
        config = _config(auth.issuer, tokens=tokens)
        verifier = BearerVerifier(config, JwtVerifier(config), Introspector(config, SECRET))
        refused = await verifier.claims("A" * 1_000_000)
        stats = await auth.stats()
    assert isinstance(refused, str) and "more than" in refused
    assert (stats["introspect"], stats["jwks"], stats["discovery"]) == (0, 0, 0)


async def test_tokens_all_sends_a_jwt_to_the_endpoint_too() -> None:
    async with authorization_server() as auth:
        config = _config(auth.issuer, tokens="all")
        verifier = BearerVerifier(config, JwtVerifier(config), Introspector(config, SECRET))
        jwt = await auth.mint(sub="alice", aud="http://127.0.0.1:9/mcp", scope="mcp")
        refused = await verifier.claims(jwt)  # signed by the issuer, but its endpoint never made it
        stats = await auth.stats()
    assert refused == "the issuer says the token is not active"
    assert (stats["introspect"], stats["jwks"]) == (1, 0)


async def test_a_cached_answer_does_not_outlive_the_tokens_exp() -> None:
    clock = [time.time()]
    async with authorization_server() as auth:
        config = _config(auth.issuer, cache_s=3600)
        introspector = Introspector(config, SECRET, clock=lambda: clock[0])
        token = await auth.opaque(sub="alice", aud="http://127.0.0.1:9/mcp", scope="mcp", exp=int(clock[0]) + 100)
        first = await introspector.claims(token)
        second = await introspector.claims(token)
        asked_while_valid = (await auth.stats())["introspect"]
        clock[0] += 100 + LEEWAY_S + 1
        after_exp = await introspector.claims(token)
        asked = (await auth.stats())["introspect"]
    assert isinstance(first, dict) and second == first
    assert asked_while_valid == 1
    assert after_exp == "expired"
    assert asked == 2  # not served from the cache past exp: asked again, and the answer refused


async def test_a_revoked_token_is_refused_once_the_cache_window_has_passed() -> None:
    clock = [time.time()]
    async with authorization_server() as auth:
        config = _config(auth.issuer, cache_s=60)
        introspector = Introspector(config, SECRET, clock=lambda: clock[0])
        token = await auth.opaque(sub="alice", aud="http://127.0.0.1:9/mcp", scope="mcp")
        assert isinstance(await introspector.claims(token), dict)
        await auth.revoke(token)
        within = await introspector.claims(token)
        clock[0] += 61
        after = await introspector.claims(token)
        asked = (await auth.stats())["introspect"]
    assert isinstance(within, dict)  # `cache_s` is how long a revocation may go unseen
    assert after == "the issuer says the token is not active"
    assert asked == 2


async def test_the_endpoint_is_discovered_from_the_issuers_metadata() -> None:
    async with authorization_server() as auth:
        config = _config(auth.issuer, url=None)
        token = await auth.opaque(sub="alice", aud="http://127.0.0.1:9/mcp", scope="mcp")
        claims = await Introspector(config, SECRET).claims(token)
        stats = await auth.stats()
    assert isinstance(claims, dict) and claims["sub"] == "alice"
    assert stats["introspect"] == 1 and stats["discovery"] >= 1


async def test_a_missing_client_secret_is_one_config_error_naming_the_variable() -> None:
    raw = {
        "servers": {},
        "auth": {
            "issuer": "https://id.example.com/",
            "audience": "https://p.example.com/mcp",
            "introspection": INTROSPECTION,
        },
    }
    with pytest.raises(ConfigError) as error:
        await validate(ProxyConfig.model_validate(raw), {}, "servers.yaml")
    assert "\n" not in str(error.value)
    assert "auth.introspection.client_secret_env" in str(error.value) and "INTROSPECTION_SECRET" in str(error.value)


def test_an_http_introspection_url_is_refused_off_loopback() -> None:
    with pytest.raises(ValueError, match="must use https"):
        _config("https://id.example.com", url="http://id.example.com/introspect")
