"""Opaque bearer tokens at the HTTP front, checked at the issuer's introspection endpoint (RFC 7662).

With `auth.introspection:` (`config.IntrospectionConfig`) the front's verifier is `BearerVerifier`:
a token that is not a JWT (or every token, with `tokens: all`) is POSTed to the endpoint
(`Introspector`), the proxy authenticating as its own client with HTTP Basic (RFC 7662 §2.1, the
id and secret form-encoded first as RFC 6749 §2.3.1 says). The endpoint is `url`, else the
`introspection_endpoint` of the issuer's discovery document. An answer is taken only when:

* `active` is `true` (the JSON boolean: nothing else counts);
* `iss` names the configured issuer, `aud` the configured audience, `sub` is a string, `exp` is in
  the future and `nbf` (if any) is not, with `identity.LEEWAY_S` — the checks a JWT meets; the
  scopes are the SDK's check, from `scope` as for JWTs.

Before any request: the token's size (`identity.MAX_TOKEN_BYTES`). A taken answer is kept (by the
token's digest, never the token) for `cache_s` and never past its `exp`, at most `ANSWERS_KEPT` of
them; a refusal is not kept. At most `ASKING_AT_ONCE` requests go to the endpoint at once, and each
(the wait for its turn included) ends after `timeout_s`. An endpoint that fails, answers other than
200, answers more than `identity.MAX_DOCUMENT_BYTES` or does not answer in time refuses the token
(401, one warning line in the log): the front fails closed, never open.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import jwt
from mcp.server.auth.provider import AccessToken, TokenVerifier

from mcp_spec_proxy.config.identity import AuthConfig, IntrospectionConfig
from mcp_spec_proxy.fronts.identity import (
    LEEWAY_S,
    MAX_TOKEN_BYTES,
    IdentityError,
    JwtVerifier,
    access_token,
    issuer_document,
    read_json,
    secure_url,
)

logger = logging.getLogger(__name__)

ANSWERS_KEPT = 4096  # introspection answers kept (by the token's digest) until `cache_s` or `exp`
ASKING_AT_ONCE = 8  # requests to the endpoint at once: a flood of made-up tokens queues, then times out


class Introspector:
    """The issuer's verdict on a token: its claims once every check passed, or why it was refused."""

    def __init__(
        self,
        config: AuthConfig,
        secret: str,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        assert config.introspection is not None
        self._config = config
        self._settings: IntrospectionConfig = config.introspection
        self._basic = httpx.BasicAuth(quote(self._settings.client_id, safe=""), quote(secret, safe=""))
        self._client = client
        self._clock = clock
        self._url = self._settings.url
        self._tls: ssl.SSLContext | None = None
        self._answers: OrderedDict[str, tuple[dict[str, Any], float]] = OrderedDict()  # digest: claims, until
        self._turns = anyio.CapacityLimiter(ASKING_AT_ONCE)
        slashless = config.audience.rstrip("/")
        self._audiences = {slashless, slashless + "/"}

    async def claims(self, token: str) -> dict[str, Any] | str:
        if len(token) > MAX_TOKEN_BYTES:
            return f"{len(token)} bytes, more than {MAX_TOKEN_BYTES}"
        digest = hashlib.sha256(token.encode()).hexdigest()
        kept = self._answers.get(digest)
        if kept is not None and self._clock() < kept[1]:
            self._answers.move_to_end(digest)
            return kept[0]
        self._answers.pop(digest, None)
        timeout = self._settings.timeout_s
        try:
            with anyio.fail_after(timeout):
                async with self._turns:
                    answer = await self._ask(token)
        except TimeoutError:
            logger.warning("the introspection endpoint did not answer within %ss: token refused", timeout)
            return f"the introspection endpoint did not answer within {timeout}s"
        except (IdentityError, httpx.HTTPError) as exc:
            logger.warning("the introspection endpoint failed (%s): token refused", str(exc) or type(exc).__name__)
            return f"the introspection endpoint failed: {str(exc) or type(exc).__name__}"
        now = self._clock()
        claims = self._check(answer, now)
        if isinstance(claims, str):
            return claims
        until = min(now + self._settings.cache_s, float(claims["exp"]))
        if until > now:
            self._answers[digest] = (claims, until)
            while len(self._answers) > ANSWERS_KEPT:
                self._answers.popitem(last=False)
        return claims

    async def _ask(self, token: str) -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            client = self._client
            if client is None:
                if self._tls is None:  # made once: loading the CA bundle costs more than the request itself
                    self._tls = httpx.create_ssl_context()
                made = httpx.AsyncClient(verify=self._tls, timeout=self._settings.timeout_s, follow_redirects=False)
                client = await stack.enter_async_context(made)
            url = await self._endpoint(client)
            form = {"token": token, "token_type_hint": "access_token"}
            headers = {"Accept": "application/json"}
            async with client.stream("POST", url, data=form, auth=self._basic, headers=headers) as response:
                return await read_json(response)

    async def _endpoint(self, client: httpx.AsyncClient) -> str:
        if self._url is None:
            where, document = await issuer_document(client, self._config.issuer)
            url = document.get("introspection_endpoint")
            if not isinstance(url, str) or not secure_url(url):
                raise IdentityError(f"{where} names no https introspection_endpoint ({url!r})")
            self._url = url
        return self._url

    def _check(self, answer: Mapping[str, Any], now: float) -> dict[str, Any] | str:
        """The answer's claims when they are what a JWT's must be, else why not."""
        if answer.get("active") is not True:
            return "the issuer says the token is not active"
        issuer = answer.get("iss")
        if not isinstance(issuer, str) or issuer.rstrip("/") != self._config.issuer.rstrip("/"):
            return f"issued by {str(issuer)[:80]!r}, not the configured issuer"
        audience = answer.get("aud")
        audiences = [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []
        if not self._audiences.intersection(a for a in audiences if isinstance(a, str)):
            return "its audience is not this proxy's (auth.audience)"
        expires = answer.get("exp")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            return "the issuer's answer has no `exp`"
        if now >= expires + LEEWAY_S:
            return "expired"
        not_before = answer.get("nbf")
        if isinstance(not_before, int | float) and not isinstance(not_before, bool) and now < not_before - LEEWAY_S:
            return "not yet valid"
        if not isinstance(answer.get("sub"), str) or not answer["sub"]:
            return "its `sub` is not a string"
        return dict(answer)


class BearerVerifier:
    """The SDK's `TokenVerifier` under `auth.introspection`: a JWT as `JwtVerifier` checks it, any
    other token (or, with `tokens: all`, every token) at the introspection endpoint."""

    def __init__(self, config: AuthConfig, jwts: JwtVerifier, introspector: Introspector) -> None:
        assert config.introspection is not None
        self._config = config
        self._every = config.introspection.tokens == "all"
        self._jwts = jwts
        self._introspector = introspector

    async def verify_token(self, token: str) -> AccessToken | None:
        return access_token(await self.claims(token), self._config)

    async def claims(self, token: str) -> dict[str, Any] | str:
        if len(token) > MAX_TOKEN_BYTES:
            return f"{len(token)} bytes, more than {MAX_TOKEN_BYTES}"
        if not self._every and is_jwt(token):
            return await self._jwts.claims(token)
        return await self._introspector.claims(token)


def is_jwt(token: str) -> bool:
    """Whether `token` parses as a JWS (its signature unchecked): a JWT is checked locally."""
    try:
        jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        return False
    return True


def token_verifier(config: AuthConfig, secret: str | None) -> TokenVerifier:
    """The front's verifier: `JwtVerifier`, or `BearerVerifier` under `auth.introspection`."""
    jwts = JwtVerifier(config)
    if config.introspection is None:
        return jwts
    if secret is None:
        raise ValueError("auth.introspection needs its client's secret (config.identity.introspection_secret)")
    return BearerVerifier(config, jwts, Introspector(config, secret))


__all__ = ["ANSWERS_KEPT", "ASKING_AT_ONCE", "BearerVerifier", "Introspector", "is_jwt", "token_verifier"]
