"""Identity at the HTTP front: the proxy as an OAuth 2.1 resource server (the MCP authorization spec).

With `auth:` (`config.AuthConfig`) the front's `/mcp` takes only a bearer JWT that the configured
issuer signed for this proxy. The MCP SDK's own pieces do the HTTP side (`auth_settings`, handed to
`streamable_http_app`): its bearer middleware, its 401 `WWW-Authenticate: Bearer
resource_metadata="…"` and 403 `insufficient_scope`, its RFC 9728 protected resource metadata at
`/.well-known/oauth-protected-resource/<path>` (`metadata_routes` adds the root form), and its
session ownership: a handshake-era session answers only the principal that opened it (any other
token on its `Mcp-Session-Id` gets 404, as if the session did not exist). This module checks
the token (`JwtVerifier`):

* its size (`MAX_TOKEN_BYTES`) and header first, before any key is looked up: only an asymmetric
  `alg` (`ASYMMETRIC`), so `none` and an HMAC signed with the issuer's public key are refused;
* its signature, by PyJWT, with the issuer's key its `kid` names (`IssuerKeys`: the JWKS that the
  issuer's RFC 8414 or OpenID discovery document names, fetched when first needed and again for a
  `kid` it lacks — `REFETCH_BURST` fetches at once, then one per `REFETCH_EVERY_S`, the first
  fetch included, so a flood of made-up `kid`s cannot turn the proxy against its issuer), the
  algorithm bound to the key;
* `iss`, `aud` (the configured audience: a token minted for another resource is refused),
  `exp` and `nbf` with `LEEWAY_S`, and `sub`; the scopes are the SDK's check.

With `auth.introspection` an opaque token is asked of the issuer instead (`introspection.py`,
whose `token_verifier` picks the verifier both doors use); the claims it accepts meet the same
checks, and become a principal the same way (`access_token`).

The gateway takes the same tokens (`ResourceServer`: the SDK's bearer middleware and its 401 and 403
around any ASGI app, the metadata served beside it): a token minted for `audience` works on both doors.

The principal (`principal.Principal`) is made from the verified claims alone; `principal.principal_of`
reads it off a request the middleware authenticated (there, so that a front without `auth:` need not
import this module's HTTP client and JWT library). The token itself is never kept, logged or
forwarded: backends are reached with the proxy's own connections and headers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import jwt
from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend, RequireAuthMiddleware
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from starlette.applications import Starlette
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_spec_proxy.config.identity import AuthConfig
from mcp_spec_proxy.principal import Principal

logger = logging.getLogger(__name__)

ASYMMETRIC = {
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "EC": ("ES256", "ES384", "ES512"),
    "OKP": ("EdDSA",),
}
ALGORITHMS = tuple(alg for family in ASYMMETRIC.values() for alg in family)
MAX_TOKEN_BYTES = 16 * 1024  # a JWT past this is refused unread (real ones are a few kilobytes)
MAX_DOCUMENT_BYTES = 512 * 1024  # a discovery document or a JWKS past this is not read
LEEWAY_S = 30  # clock skew forgiven on `exp` and `nbf`
VERIFIED_TOKENS = 4096  # tokens whose signature was checked, kept (by digest) until they expire
FETCH_TIMEOUT_S = 10.0
REFETCH_BURST = 5  # JWKS fetches an unknown `kid` may cause at once …
REFETCH_EVERY_S = 12.0  # … and one more per this many seconds after
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class IdentityError(Exception):
    """The issuer's documents could not be had, or are not what its configuration says."""


class IssuerKeys:
    """The issuer's signing keys by `kid`, from the JWKS its discovery document names."""

    def __init__(
        self, issuer: str, *, client: httpx.AsyncClient | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._issuer = issuer
        self._client = client
        self._clock = clock
        self._keys: dict[str, dict[str, Any]] = {}
        self._jwks_uri: str | None = None
        self._lock = anyio.Lock()  # one fetch at a time; a waiter finds the keys it brought
        self._allowance = float(REFETCH_BURST)
        self._allowance_at = clock()

    async def key(self, kid: str | None) -> dict[str, Any] | None:
        """The JWK `kid` names (a token without one: the only key, if there is one), or None."""
        found = self._find(kid)
        if found is not None or not self._may_refetch():
            return found
        async with self._lock:
            found = self._find(kid)
            if found is None:
                try:
                    await self._fetch()
                except (IdentityError, httpx.HTTPError) as exc:
                    logger.warning("could not fetch the signing keys of issuer %s: %s", self._issuer, exc)
                    return None
                found = self._find(kid)
        return found

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        if kid is None:
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    def _may_refetch(self) -> bool:
        """Take one fetch from the allowance, if one is left (it refills one per `REFETCH_EVERY_S`)."""
        now = self._clock()
        self._allowance = min(REFETCH_BURST, self._allowance + (now - self._allowance_at) / REFETCH_EVERY_S)
        self._allowance_at = now
        if self._allowance < 1:
            return False
        self._allowance -= 1
        return True

    async def _fetch(self) -> None:
        async with _client(self._client) as client:
            if self._jwks_uri is None:
                self._jwks_uri = await self._discover(client)
            jwks = await _json(client, self._jwks_uri)
        keys = jwks.get("keys")
        if not isinstance(keys, list):
            raise IdentityError(f"the JWKS at {self._jwks_uri} has no `keys` list")
        usable = {}
        for jwk in keys:
            if isinstance(jwk, dict) and jwk.get("kty") in ASYMMETRIC and jwk.get("use", "sig") == "sig":
                usable[str(jwk.get("kid", ""))] = jwk
        self._keys = usable
        logger.info("signing keys of issuer %s: %s", self._issuer, ", ".join(sorted(usable)) or "none")

    async def _discover(self, client: httpx.AsyncClient) -> str:
        """The `jwks_uri` of the issuer's RFC 8414 document, else of its OpenID one."""
        url, document = await issuer_document(client, self._issuer)
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not secure_url(jwks_uri):
            raise IdentityError(f"{url} names no https jwks_uri ({jwks_uri!r})")
        return jwks_uri


async def issuer_document(client: httpx.AsyncClient, issuer: str) -> tuple[str, dict[str, Any]]:
    """The issuer's RFC 8414 metadata, else its OpenID one, and where it was read; it must name `issuer`."""
    problems = []
    for url in discovery_urls(issuer):
        try:
            document = await _json(client, url)
        except (IdentityError, httpx.HTTPError) as exc:
            problems.append(f"{url}: {exc}")
            continue
        if _same_url(str(document.get("issuer", "")), issuer) is False:
            raise IdentityError(
                f"{url} names issuer {document.get('issuer')!r}, not {issuer!r} — set auth.issuer"
                " to the issuer exactly as its tokens name it"
            )
        return url, document
    raise IdentityError("no discovery document: " + "; ".join(problems))


class JwtVerifier:
    """The MCP SDK's `TokenVerifier` for the issuer's JWTs: an `AccessToken`, or None when refused."""

    def __init__(self, config: AuthConfig, keys: IssuerKeys | None = None) -> None:
        self._config = config
        self._keys = keys or IssuerKeys(config.issuer)
        slashless = config.audience.rstrip("/")
        self._audiences = [slashless, slashless + "/"]  # one resource, whichever way a trailing slash is spelt
        # A client sends the same token with every request: its signature is checked once, and its
        # claims kept (by the token's digest, with the key that verified it) until it expires; a
        # key the issuer no longer publishes verifies nothing from the cache.
        self._verified: OrderedDict[str, tuple[dict[str, Any], dict[str, Any]]] = OrderedDict()
        self._keyed: dict[tuple[str, str | None], tuple[dict[str, Any], jwt.PyJWK]] = {}  # (alg, kid): its key

    async def verify_token(self, token: str) -> AccessToken | None:
        return access_token(await self.claims(token), self._config)

    async def claims(self, token: str) -> dict[str, Any] | str:
        """The token's claims once every check passed, or why it was refused (no secret in it)."""
        if len(token) > MAX_TOKEN_BYTES:
            return f"{len(token)} bytes, more than {MAX_TOKEN_BYTES}"
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            return f"not a JWT ({exc})"
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            return f"alg {str(alg)[:20]!r} is not an asymmetric signature this proxy accepts"
        kid = header.get("kid")
        jwk = await self._keys.key(kid if isinstance(kid, str) else None)
        if jwk is None:
            return f"the issuer has no key {str(kid)[:64]!r}"
        if jwk.get("alg", alg) != alg or alg not in ASYMMETRIC[jwk["kty"]]:
            return f"alg {alg!r} does not match the key {str(kid)[:64]!r}"
        digest = hashlib.sha256(token.encode()).hexdigest()
        known = self._verified.get(digest)
        if known is not None and known[1] is jwk and time.time() < known[0]["exp"] + LEEWAY_S:
            self._verified.move_to_end(digest)
            return known[0]
        try:
            made = self._keyed.get((alg, kid if isinstance(kid, str) else None))
            if made is not None and made[0] is jwk:  # the very key the issuer publishes now
                key = made[1]
            else:
                key = jwt.PyJWK(jwk, algorithm=alg)
                self._keyed[(alg, kid if isinstance(kid, str) else None)] = (jwk, key)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self._audiences,
                issuer=[self._config.issuer.rstrip("/"), self._config.issuer.rstrip("/") + "/"],
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            return str(exc)
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            return "its `sub` is not a string"
        if isinstance(claims.get("exp"), int | float):
            self._verified[digest] = (claims, jwk)
            while len(self._verified) > VERIFIED_TOKENS:
                self._verified.popitem(last=False)
        return claims


def access_token(claims: Mapping[str, Any] | str, config: AuthConfig) -> AccessToken | None:
    """The SDK's `AccessToken` for a token whose `claims` passed every check (its own, or introspected);
    None, logged, for one refused (`claims` is then why, which holds no secret)."""
    if isinstance(claims, str):
        logger.info("bearer token refused: %s", claims)
        return None
    principal = principal_from_claims(claims, config.groups_claim)
    return AccessToken(
        token="",  # not kept: nothing after this point needs it, and nothing may forward it
        client_id=principal.client_id or "",
        scopes=list(principal.scopes),
        expires_at=int(claims["exp"]) + LEEWAY_S,  # the SDK refuses past it: the same skew forgiven
        resource=config.audience,
        subject=principal.sub,
        claims={"iss": principal.issuer, "groups": list(principal.groups)},
    )


def principal_from_claims(claims: Mapping[str, Any], groups_claim: str) -> Principal:
    """The principal a verified token's claims name; a claim of the wrong shape counts as absent."""
    client = claims.get("client_id", claims.get("azp"))
    scope = claims.get("scope", claims.get("scp", ""))
    scopes = scope.split() if isinstance(scope, str) else [s for s in scope if isinstance(s, str)]
    groups = claims.get(groups_claim, [])
    groups = [groups] if isinstance(groups, str) else groups if isinstance(groups, list) else []
    return Principal(
        issuer=str(claims["iss"]),
        sub=str(claims["sub"]),
        client_id=client if isinstance(client, str) else None,
        scopes=tuple(scopes),
        groups=tuple(group for group in groups if isinstance(group, str)),
    )


def auth_settings(config: AuthConfig) -> AuthSettings:
    """The SDK's resource-server settings for `config`: the verifier checks the audience itself."""
    return AuthSettings.model_validate(
        {
            "issuer_url": config.issuer,
            "resource_server_url": config.audience,
            "required_scopes": list(config.scopes) or None,
            "validate_token_resource": False,
        }
    )


def metadata_routes(config: AuthConfig) -> list[Route]:
    """RFC 9728's root form, `/.well-known/oauth-protected-resource`, beside the path form the SDK serves."""
    if urlsplit(config.audience).path.strip("/") == "":
        return []  # the SDK's route is the root form already
    settings = auth_settings(config)  # its URLs keep their spelling (no slash added to an empty path)
    assert settings.resource_server_url is not None
    routes = create_protected_resource_routes(
        resource_url=settings.resource_server_url,
        authorization_servers=[settings.issuer_url],
        scopes_supported=settings.required_scopes,
    )
    root = "/.well-known/oauth-protected-resource"
    return [Route(root, route.endpoint, methods=["GET", "OPTIONS"]) for route in routes]


class ResourceServer:
    """`app` behind `auth:`, as the MCP front is: every HTTP request must bear a token `verifier` takes
    (else 401 with `WWW-Authenticate: Bearer … resource_metadata="…"`, naming the metadata of the
    resource its tokens are for, `audience`; a missing scope is 403), and the protected resource
    metadata is served beside it, in its path and its root form. A request that passes carries
    its principal (`principal.principal_of`). The lifespan goes to `app` untouched."""

    def __init__(self, app: ASGIApp, config: AuthConfig, verifier: TokenVerifier) -> None:
        settings = auth_settings(config)
        assert settings.resource_server_url is not None
        metadata = create_protected_resource_routes(
            resource_url=settings.resource_server_url,
            authorization_servers=[settings.issuer_url],
            scopes_supported=settings.required_scopes,
        )
        routes = [*metadata, *metadata_routes(config)]
        self._paths = {route.path for route in routes}
        self._metadata = Starlette(routes=routes)
        metadata_url = build_resource_metadata_url(settings.resource_server_url)
        required = RequireAuthMiddleware(app, list(config.scopes), metadata_url)
        self._guarded = AuthenticationMiddleware(required, backend=BearerAuthBackend(verifier))
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self._paths:
            await self._metadata(scope, receive, send)
        elif scope["type"] in ("http", "websocket"):
            await self._guarded(scope, receive, send)
        else:
            await self._app(scope, receive, send)


def discovery_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata is: RFC 8414's well-known URL (inserted before the path), then
    OpenID Connect Discovery's (appended to it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    origin = f"{parts.scheme}://{parts.netloc}"
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


def secure_url(url: str) -> bool:
    """https, or http on loopback (a test's issuer)."""
    parts = urlsplit(url)
    loopback = parts.scheme == "http" and parts.hostname in _LOOPBACK
    return bool(parts.hostname) and (parts.scheme == "https" or loopback)


def _same_url(a: str, b: str) -> bool | None:
    """Whether two issuer names match (a trailing slash aside); None when `a` is empty."""
    return None if not a else a.rstrip("/") == b.rstrip("/")


class _client:
    """The client to fetch with: the one handed in, else one made (and closed) for the fetch."""

    def __init__(self, given: httpx.AsyncClient | None) -> None:
        self._given = given
        self._made: httpx.AsyncClient | None = None

    async def __aenter__(self) -> httpx.AsyncClient:
        if self._given is not None:
            return self._given
        self._made = httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=False)
        return self._made

    async def __aexit__(self, *exc: object) -> None:
        if self._made is not None:
            await self._made.aclose()


async def _json(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    """A JSON object from `url`, read to at most `MAX_DOCUMENT_BYTES`."""
    if not secure_url(url):
        raise IdentityError(f"{url} is not https")
    async with client.stream("GET", url, headers={"Accept": "application/json"}) as response:
        return await read_json(response)


async def read_json(response: httpx.Response) -> dict[str, Any]:
    """The JSON object a 200 `response` streams, read to at most `MAX_DOCUMENT_BYTES`."""
    if response.status_code != 200:
        raise IdentityError(f"HTTP {response.status_code}")
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_DOCUMENT_BYTES:
            raise IdentityError(f"more than {MAX_DOCUMENT_BYTES} bytes")
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise IdentityError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise IdentityError("not a JSON object")
    return data


__all__ = [
    "IdentityError",
    "IssuerKeys",
    "JwtVerifier",
    "ResourceServer",
    "access_token",
    "auth_settings",
    "discovery_urls",
    "issuer_document",
    "metadata_routes",
    "principal_from_claims",
    "read_json",
    "secure_url",
]
