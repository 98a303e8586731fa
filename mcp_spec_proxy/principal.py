"""Who asks: the principal an HTTP front authenticated, as a value every layer below may read.

A `Principal` is made only from a token the front verified (`fronts/identity.py`): its issuer's
signature, audience and expiry checked. Nothing a client writes about itself becomes one — not a
header, not `_meta`. It rides on the client's session (`barrier.Session.principal`) and on each
call to the gate, which names it (`who`) on every audit line it caused: each line of a call, and
prompts, resources, completions, subscriptions, log levels, replays and relayed requests. The
approval console's card names it, and the call's spans by its subject alone; LEASH counts its
labels by `key`. A front that authenticates nobody (stdio, the shared `--token-env` token) gives none.
`principal_of` reads it off a request here, not in `fronts/identity.py`, so that a front without `auth:`
never loads the resource server's HTTP client and JWT library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser


@dataclass(frozen=True)
class Principal:
    """The subject of a verified access token, and the client that holds it."""

    issuer: str
    sub: str
    client_id: str | None = None
    scopes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """One string per principal (a subject is unique only within its issuer): what LEASH and
        the session's owner check compare. The client is part of it: one person through two
        clients is two principals, as the MCP SDK's session ownership counts them."""
        return f"{self.issuer}#{self.sub}#{self.client_id or ''}"

    def audit_fields(self) -> dict[str, str | None]:
        """What an audit line says of it: the subject and the client, never the token."""
        return {"sub": self.sub, "client_id": self.client_id}


def who(principal: Principal | None) -> dict[str, Any]:
    """What an audit line says of who caused it: `{"principal": {sub, client_id}}`, or nothing where
    the front identified nobody."""
    return {"principal": principal.audit_fields()} if principal is not None else {}


def principal_of(request: object) -> Principal | None:
    """The principal the bearer middleware authenticated for `request` (a Starlette request), if any.
    Only the verified token counts: no header or `_meta` the client writes is read."""
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, Mapping) else None
    if not isinstance(user, AuthenticatedUser):
        return None
    token = user.access_token
    claims = token.claims or {}
    groups = claims.get("groups")
    return Principal(
        issuer=str(claims.get("iss", "")),
        sub=token.subject or "",
        client_id=token.client_id or None,
        scopes=tuple(token.scopes),
        groups=tuple(groups) if isinstance(groups, list) else (),
    )


__all__ = ["Principal", "principal_of", "who"]
