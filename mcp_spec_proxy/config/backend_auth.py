"""`auth:` on a server: how the proxy logs in to a remote backend that asks for OAuth 2.1.

`auth: oauth` discovers everything from the server's 401 (protected resource metadata, the
authorization server's metadata, a client by Dynamic Client Registration), logs in with PKCE in the
user's browser and takes the code on a loopback redirect. The long form adds what the operator
knows: a pre-registered client (`client_id`, its secret in `client_secret_env`), a Client ID
Metadata Document the operator hosts (`client_metadata_url`), or the client-credentials grant for a
machine with no person (`grant: client_credentials`, which needs `issuer`, and a secret or a
private key that signs its assertion). The flow itself is the
SDK's (`backends/oauth.py`); this module only says what may be written.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_CALLBACK_PORT = 33418


class OAuthSettings(BaseModel):
    """The long form of a server's `auth:`; `auth: oauth` is this with every field at its default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grant: Literal["authorization_code", "client_credentials"] = "authorization_code"
    client_id: str | None = Field(default=None, min_length=1)  # pre-registered; else CIMD or DCR
    client_secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # Client credentials signed with a private key (private_key_jwt, RFC 7523) instead of a secret:
    # the variable holding the PEM key, and the algorithm it signs with.
    private_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    signing_algorithm: Literal[
        "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"
    ] = "RS256"
    # How a pre-registered client with a secret authenticates at the token endpoint.
    token_endpoint_auth_method: Literal["client_secret_basic", "client_secret_post", "none"] | None = None
    scopes: list[str] = Field(default_factory=list)  # client credentials ask for these; a login asks what the 401 says
    client_metadata_url: str | None = None  # a CIMD document the operator hosts (https, with a path)
    issuer: str | None = None  # the authorization server a pre-registered client's credentials belong to
    # The loopback redirect: http://127.0.0.1:PORT/callback, the same on every login (a registered
    # client's redirect_uris name it).
    callback_port: int = Field(default=DEFAULT_CALLBACK_PORT, ge=1, le=65535)
    login_timeout: float = Field(default=300.0, gt=0)  # seconds one login waits for the person

    @field_validator("client_metadata_url")
    @classmethod
    def _cimd(cls, url: str | None) -> str | None:
        if url is None:
            return None
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname or parts.path in ("", "/"):
            raise ValueError(
                f"{url!r} must be the https URL of your client metadata document, with a path"
                " (such as https://example.com/oauth/client.json)"
            )
        return url

    @field_validator("issuer")
    @classmethod
    def _issuer(cls, url: str | None) -> str | None:
        if url is not None and urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"{url!r} must be the authorization server's http(s) issuer URL")
        return url

    @model_validator(mode="after")
    def _complete(self) -> OAuthSettings:
        if self.grant == "client_credentials":
            if self.client_id is None or (self.client_secret_env is None) == (self.private_key_env is None):
                raise ValueError(
                    "`grant: client_credentials` needs `client_id` and one of `client_secret_env` (a secret)"
                    " or `private_key_env` (a signing key)"
                )
            if self.issuer is None:
                raise ValueError(
                    "`grant: client_credentials` needs `issuer`, the authorization server these credentials"
                    " belong to (they are sent nowhere else)"
                )
        if self.private_key_env is not None and self.grant != "client_credentials":
            raise ValueError("`private_key_env` signs client credentials: add `grant: client_credentials`, or drop it")
        if self.client_secret_env is not None and self.client_id is None:
            raise ValueError("`client_secret_env` without `client_id`: add the client's id, or drop the secret")
        return self

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.callback_port}/callback"


def oauth_settings(value: object) -> object:
    """A server's `auth:` as written, made ready for `OAuthSettings`: `oauth` is every default."""
    if value == "oauth":
        return {}
    if value is None or isinstance(value, dict | OAuthSettings):
        return value
    raise ValueError(
        f"{value!r} is not a login: write `auth: oauth`, or a mapping such as {{client_id: ID, scopes: [...]}}"
    )


__all__ = ["DEFAULT_CALLBACK_PORT", "OAuthSettings", "oauth_settings"]
