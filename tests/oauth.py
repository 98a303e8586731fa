"""A real authorization server for the HTTP front's identity tests, and the tokens it mints.

`authorization_server()` starts oauth2-mock-server (`tests/fixtures/oauth_server.mjs`, installed
by scripts/install-test-backends.sh) on a free loopback port: its discovery document, JWKS and
token endpoint are real, and the test drives it (`AuthServer.mint`, `rotate`, `stats`). The
attacks' forged tokens are made here too (`unsigned`, `hmac_with_public_key`, `self_signed`): no
key of the issuer's signs them.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

from tests import backends

INTROSPECTION_CLIENT = ("mcp-proxy", "s3cret:with/odd chars&=")  # the one client its /introspect answers


@dataclass
class AuthServer:
    issuer: str
    http: httpx.AsyncClient

    async def mint(self, *, drop: tuple[str, ...] = (), kid: str | None = None, **claims: Any) -> str:
        """A token the issuer signs (its newest key, or `kid`), with `claims` over its defaults."""
        body: dict[str, Any] = {"claims": claims, "drop": list(drop)}
        if kid is not None:
            body["kid"] = kid
        response = await self.http.post(f"{self.issuer}/test/mint", json=body)
        response.raise_for_status()
        return str(response.json()["token"])

    async def client_credentials(self, client_id: str, resource: str, scope: str = "mcp") -> str:
        """A token from the token endpoint, as a client gets it (RFC 8707 `resource` becomes `aud`)."""
        form = {"grant_type": "client_credentials", "client_id": client_id, "scope": scope, "resource": resource}
        response = await self.http.post(f"{self.issuer}/token", data=form)
        response.raise_for_status()
        return str(response.json()["access_token"])

    async def rotate(self) -> str:
        """A new signing key, published and used from now on; its kid."""
        response = await self.http.post(f"{self.issuer}/test/rotate")
        return str(response.json()["kid"])

    async def opaque(self, *, drop: tuple[str, ...] = (), **claims: Any) -> str:
        """An opaque token: what the server's `/introspect` answers for it is `claims` over its defaults."""
        response = await self.http.post(f"{self.issuer}/test/opaque", json={"claims": claims, "drop": list(drop)})
        response.raise_for_status()
        return str(response.json()["token"])

    async def revoke(self, token: str) -> None:
        """From now on `/introspect` answers `token` with `{"active": false}`."""
        (await self.http.post(f"{self.issuer}/test/revoke", json={"token": token})).raise_for_status()

    async def hang(self, on: bool = True) -> None:
        """`/introspect` holds its requests unanswered (or answers again)."""
        (await self.http.post(f"{self.issuer}/test/hang", json={"on": on})).raise_for_status()

    async def stats(self) -> dict[str, int]:
        """How many times the JWKS (`jwks`) and the discovery documents (`discovery`) were fetched,
        and how many introspection requests came (`introspect`)."""
        return dict((await self.http.get(f"{self.issuer}/test/stats")).json())

    async def public_key_pem(self) -> bytes:
        """The issuer's (first) public signing key, as the world can read it from the JWKS."""
        jwks = (await self.http.get(f"{self.issuer}/jwks")).json()
        key = jwt.PyJWK(jwks["keys"][0]).key
        pem: bytes = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        return pem


class TokenMemory:
    """The SDK's OAuth token storage, in memory; `client`: a client registered beforehand."""

    def __init__(self, client: OAuthClientInformationFull | None = None) -> None:
        self.tokens: OAuthToken | None = None
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


@asynccontextmanager
async def authorization_server() -> AsyncIterator[AuthServer]:
    command = backends.authorization_server()
    process = await anyio.open_process(command.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    async with process:
        assert process.stdout is not None and process.stdin is not None
        with anyio.fail_after(30):
            line = b""
            async for chunk in process.stdout:
                line += chunk
                if b"\n" in line:
                    break
        issuer = json.loads(line.split(b"\n")[0])["issuer"]
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                yield AuthServer(issuer, http)
        finally:
            with anyio.CancelScope(shield=True):
                await process.stdin.aclose()  # the driver stops when its stdin ends
                with anyio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segments(header: dict[str, Any], claims: dict[str, Any]) -> str:
    return _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())


def unsigned(claims: dict[str, Any]) -> str:
    """`alg: none`: a token that carries no signature at all."""
    return _segments({"alg": "none", "typ": "JWT"}, claims) + "."


def hmac_with_public_key(claims: dict[str, Any], public_pem: bytes, kid: str | None = None) -> str:
    """HS256 keyed with the issuer's public key: what a verifier that lets the token pick the
    algorithm would accept. (PyJWT itself refuses to make one, so the HMAC is done here.)"""
    header = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
    signing_input = _segments(header, claims)
    signature = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64(signature)


def self_signed(claims: dict[str, Any], kid: str = "not-the-issuers") -> str:
    """RS256 with a key of the attacker's own, under a `kid` the issuer never published."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})
