"""What an opaque token costs at the HTTP front (`auth.introspection`), side by side in one run:
the first request of a token (one POST to a real introspection endpoint, oauth2-mock-server's,
on loopback), the same token again (the cached answer), and a JWT checked locally (`JwtVerifier`,
its signature verified once, then its cached claims).

    python -m bench.introspection [--tokens 200] [--rounds 10]

Needs the test backends (scripts/install-test-backends.sh: the authorization server). Prints the
median per token of each, and each one's ratio to the cached introspection answer.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from bench.measure import machine_line
from mcp_spec_proxy.config.identity import AuthConfig
from mcp_spec_proxy.fronts.identity import JwtVerifier
from mcp_spec_proxy.fronts.introspection import Introspector
from tests.oauth import INTROSPECTION_CLIENT, authorization_server

AUDIENCE = "http://127.0.0.1:9/mcp"


async def per_token(check: Callable[[str], Awaitable[dict[str, Any] | str]], tokens: list[str]) -> float:
    started = time.perf_counter()
    for token in tokens:
        assert isinstance(await check(token), dict)
    return (time.perf_counter() - started) / len(tokens)


async def main(count: int, rounds: int) -> None:
    async with authorization_server() as auth:
        client_id, secret = INTROSPECTION_CLIENT
        settings = {"url": f"{auth.issuer}/introspect", "client_id": client_id, "client_secret_env": "UNUSED"}
        config = AuthConfig.model_validate({"issuer": auth.issuer, "audience": AUDIENCE, "introspection": settings})
        fields: dict[str, Any] = {"sub": "alice", "aud": AUDIENCE, "scope": "mcp"}
        opaque = [await auth.opaque(**fields) for _ in range(count)]
        jwts = [await auth.mint(**fields) for _ in range(count)]
        introspector, verifier = Introspector(config, secret), JwtVerifier(config)
        asked = await per_token(introspector.claims, opaque)
        first_jwt = await per_token(verifier.claims, jwts)
        cached = statistics.median([await per_token(introspector.claims, opaque) for _ in range(rounds)])
        cached_jwt = statistics.median([await per_token(verifier.claims, jwts) for _ in range(rounds)])
        requests = (await auth.stats())["introspect"]
    print(machine_line())
    print(f"{count} tokens, {rounds} rounds of the cached checks; {requests} introspection requests in all")
    for name, seconds in (
        ("opaque, asked of the endpoint", asked),
        ("opaque, cached answer", cached),
        ("JWT, signature verified", first_jwt),
        ("JWT, cached claims", cached_jwt),
    ):
        print(f"{name:32} {seconds * 1e6:10.1f} us/token  {seconds / cached:8.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=10)
    arguments = parser.parse_args()
    anyio.run(main, arguments.tokens, arguments.rounds)
