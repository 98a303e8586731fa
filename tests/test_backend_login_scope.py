"""What a real authorization server taught the remote backend's login (tests/test_oidc_login_e2e.py has the
whole story against npm `oidc-provider`; these pin each lesson in process):

* a step-up beyond the scope a client was dynamically registered for registers a client anew, since the
  authorization server may keep the registered scope as the client's ceiling (oidc-provider answers a
  wider request from the old client `invalid_scope`); a client the operator registered is kept;
* a request whose login fails (nobody logged in, the server refused) is answered with an error of its
  own, marked `unauthorized` (the server ran nothing), instead of ending the whole session; a handshake's
  failed login still ends its connection attempt, in the login's words.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import cast

import httpx2
import pytest
from mcp.client.auth import OAuthClientProvider, OAuthFlowError
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from mcp_spec_proxy.backends.http import LOST_KEY, GuardedClient
from mcp_spec_proxy.backends.oauth import RefreshOn401
from mcp_spec_proxy.store.tokens import TokenStore

pytestmark = pytest.mark.anyio

REDIRECT = [AnyUrl("http://127.0.0.1:33418/callback")]
STEP_UP = 'Bearer error="insufficient_scope", scope="read write", resource_metadata="http://rs/.well-known/oauth-protected-resource/mcp"'


class Kept:
    """The token storage: a token for `read offline_access`, and the client registered as given."""

    def __init__(self, client: OAuthClientInformationFull) -> None:
        self.client = client

    async def get_tokens(self) -> OAuthToken | None:
        return OAuthToken(access_token="at", token_type="Bearer", scope="read offline_access")

    async def kept(self) -> tuple[OAuthToken | None, float | None]:
        return await self.get_tokens(), None  # no expiry kept: the step-up is what is asked, not a refresh

    async def set_tokens(self, tokens: OAuthToken) -> None:
        pass

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


async def _step_up(registered_scope: str | None) -> OAuthClientInformationFull | None:
    """The client registration the provider holds once the server has answered 403 `insufficient_scope`
    (the SDK's flow goes on to its discovery request, which is not sent here)."""
    client = OAuthClientInformationFull(client_id="registered", redirect_uris=REDIRECT, scope=registered_scope)
    metadata = OAuthClientMetadata(redirect_uris=REDIRECT, scope="read offline_access")
    kept = Kept(client)
    provider = OAuthClientProvider("http://rs/mcp", metadata, kept)
    flow = RefreshOn401(provider, cast(TokenStore, kept)).async_auth_flow(httpx2.Request("POST", "http://rs/mcp"))
    try:
        request = await flow.__anext__()
        assert request.headers["authorization"] == "Bearer at"
        after = await flow.asend(httpx2.Response(403, headers={"www-authenticate": STEP_UP}, request=request))
        assert after.url.path == "/.well-known/oauth-protected-resource/mcp"  # the SDK goes on to its step-up
    finally:
        await flow.aclose()
    return provider.context.client_info


async def test_a_step_up_beyond_the_registered_scope_registers_a_client_anew() -> None:
    assert await _step_up("read offline_access") is None  # the SDK registers anew for `read offline_access write`


@pytest.mark.parametrize("registered", [None, "read write offline_access"], ids=["operator's client", "wide enough"])
async def test_a_client_the_operator_registered_or_one_wide_enough_is_kept(registered: str | None) -> None:
    kept = await _step_up(registered)
    assert kept is not None and kept.client_id == "registered"


class NoLogin(httpx2.Auth):
    """The server refuses the request; the login that would let it in fails."""

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        response = yield request
        assert response.status_code == 401
        raise OAuthFlowError("no login within 20s (`login_timeout` waits longer)")


def _refusing(seen: list[str]) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content)["method"])
        return httpx2.Response(401, headers={"www-authenticate": 'Bearer resource_metadata="http://rs/x"'})

    return httpx2.MockTransport(handle)


async def test_a_request_whose_login_fails_is_answered_with_its_own_marked_error() -> None:
    seen: list[str] = []
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "write", "arguments": {}}}
    async with GuardedClient(limit=1 << 20, transport=_refusing(seen), auth=NoLogin()) as http:
        answer = await http.post("http://rs/mcp", json=call)
        error = answer.json()["error"]
        lost = http.claim(error["data"])
    assert seen == ["tools/call"] and answer.json()["id"] == 7
    assert set(error["data"]) == {LOST_KEY}
    assert lost is not None and lost.kind == "unauthorized"
    assert lost.detail == "no login within 20s (`login_timeout` waits longer)"


@pytest.mark.parametrize("method", ["initialize", "server/discover"])
async def test_a_handshake_whose_login_fails_still_fails_its_connection(method: str) -> None:
    seen: list[str] = []
    async with GuardedClient(limit=1 << 20, transport=_refusing(seen), auth=NoLogin()) as http:
        with pytest.raises(OAuthFlowError, match="no login within"):
            await http.post("http://rs/mcp", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
    assert seen == [method]
