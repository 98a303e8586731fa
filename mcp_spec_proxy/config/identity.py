"""Who asks and what they may see: the `auth:` and `access:` sections of servers.yaml.

`config/schema.py` holds the whole file's model and validates these with it; the rules that decide a
call's reviewer (`rules:`) stay there, beside the review modes they name. An `access:` rule's
`when` is CEL over `principal`, `server` and `tool`, compiled when the file loads (`calls/access.py`
evaluates it), so a rule that does not compile is a config error at its line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mcp_spec_proxy.errors import ConfigError

OWN_SERVER = "mcp-spec-proxy"
"""The `server` an `access:` rule sees for the proxy's own tools (`delegate`, `report_outcome`, search
mode's `search_tools` and `call_tool`): the name the proxy gives itself in `serverInfo`, which no
backend may take (`config/schema.py` refuses it)."""


def _secure(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"{url!r} is not an https URL without query or fragment, such as https://id.example.com/")
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{url!r} must use https (http only on loopback: 127.0.0.1, localhost, [::1])")
    return url


class IntrospectionConfig(BaseModel):
    """`auth.introspection:`: tokens checked at the issuer's RFC 7662 endpoint (`fronts/introspection.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None  # else the `introspection_endpoint` of the issuer's discovery document
    client_id: str = Field(min_length=1)  # the proxy's own client at the issuer (HTTP Basic, RFC 7662 §2.1)
    client_secret_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # the variable holding its secret
    tokens: Literal["opaque", "all"] = "opaque"  # opaque: JWTs are still checked locally; all: every token asks
    cache_s: float = Field(default=60.0, ge=0, le=3600)  # an answer is trusted this long (never past its `exp`)
    timeout_s: float = Field(default=5.0, gt=0, le=60)  # an endpoint slower than this refuses the token

    @field_validator("url")
    @classmethod
    def _https(cls, url: str | None) -> str | None:
        return None if url is None else _secure(url)


class AuthConfig(BaseModel):
    """`auth:`: the HTTP front as an OAuth 2.1 resource server (`fronts/identity.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str  # as its tokens' `iss` names it; its RFC 8414 / OpenID discovery document names the JWKS
    audience: str  # this proxy's canonical URL (RFC 8707): a token must name it in `aud`
    scopes: list[str] = Field(default_factory=list)  # every token must carry all of them (else 403)
    groups_claim: str = Field(default="groups", min_length=1)  # the claim listing the principal's groups
    introspection: IntrospectionConfig | None = None  # opaque tokens (or all) asked of the issuer (RFC 7662)

    @field_validator("issuer", "audience")
    @classmethod
    def _https(cls, url: str) -> str:
        return _secure(url)


class AccessRule(BaseModel):
    """One of `access:` (`calls/access.py`): when its CEL `when` holds for a principal and a tool (or a
    server's prompts and resources), `hide` says whether that principal sees it. First match wins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    when: str
    hide: bool  # true: the principal does not see it; false: it does (an exception before a broader rule)
    name: str | None = Field(default=None, min_length=1, max_length=80)  # what the log calls it (else its number)

    @field_validator("when")
    @classmethod
    def _compiles(cls, when: str) -> str:
        from mcp_spec_proxy.calls.access import compile_access  # CEL loads only for a file that has access rules

        compile_access(when)  # its RuleError is a ValueError: a config error at this rule's line
        return when


def introspection_secret(config: AuthConfig | None, environ: Mapping[str, str], source: str) -> str | None:
    """The introspection client's secret from `environ` (None without `auth.introspection`)."""
    if config is None or config.introspection is None:
        return None
    variable = config.introspection.client_secret_env
    secret = environ.get(variable)
    if not secret:
        raise ConfigError(
            source,
            "auth.introspection.client_secret_env",
            f"environment variable {variable} is not set",
            "export the proxy's client secret at the issuer, or remove auth.introspection",
        )
    return secret


__all__ = ["OWN_SERVER", "AccessRule", "AuthConfig", "IntrospectionConfig", "introspection_secret"]
