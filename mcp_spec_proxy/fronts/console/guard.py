"""The approval console's door: a loopback Host, the per-start secret, same-origin POSTs, no framing.

A web page in the user's browser can reach loopback ports, so the console trusts nothing a
browser sends on its own:

* the Host must be a loopback name with the console's port (DNS rebinding gets 421);
* every request but the page's two static files needs the secret: `?token=SECRET` once (the
  link the proxy prints), which is answered with a redirect that drops it from the address bar
  and sets it as an `HttpOnly`, `SameSite=Strict` cookie named for this port (several proxies
  may run side by side on one host), then that cookie; without it, 403;
* a POST (a decision) must carry an `Origin` equal to the console's own origin and a JSON body,
  so neither a cross-site form nor another local page can decide (403 / 415);
* answers never carry CORS headers; they forbid framing (clickjacking an Approve button),
  referrers (the token) and caching, and allow scripts and styles from the console only.
"""

from __future__ import annotations

import hmac
import html
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_spec_proxy.fronts.asgi import LOOPBACK_NAMES

PUBLIC_PATHS = frozenset({"/console.js", "/console.css"})
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}
_LOCKED = """<!doctype html><meta charset="utf-8"><title>Approval console: link needed</title>
<h1>mcp-spec-proxy approval console</h1>
<p>This page shows the changes an AI agent wants to make through mcp-spec-proxy, so you can allow
or refuse them. It opens only with the link the proxy gave you: run <code>{command}</code>,
or look for the line "approval console:" in the proxy's log. (The link is never shown to the AI agent:
a program that had it could approve its own changes.)</p>"""


def cookie_name(port: int) -> str:
    return f"mcp_spec_proxy_console_{port}"


class ConsoleGuard:
    def __init__(self, app: ASGIApp, *, secret: str, port: int, command: str = "mcp-spec-proxy console-url") -> None:
        self._app = app
        self._locked = _LOCKED.format(command=html.escape(command))
        self._secret = secret
        self._port = port
        self._cookie = cookie_name(port)
        self._netlocs = frozenset(f"{name}:{port}" for name in LOOPBACK_NAMES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        response = self._refusal(scope)
        if response is not None:
            await response(scope, receive, _secured(send))
            return
        await self._app(scope, receive, _secured(send))

    def _refusal(self, scope: Scope) -> Response | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "").lower()
        if host not in self._netlocs:
            why = f"refused: the approval console answers only to 127.0.0.1:{self._port} or localhost:{self._port}"
            return PlainTextResponse(why, status_code=421)
        method = scope["method"]
        path = scope["path"]
        if path in PUBLIC_PATHS and method in ("GET", "HEAD"):
            return None
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        token = next((value for key, value in query if key == "token"), None)
        if token is not None and method == "GET":
            if not hmac.compare_digest(token.encode(), self._secret.encode()):
                return HTMLResponse(self._locked, status_code=403)
            rest = urlencode([(key, value) for key, value in query if key != "token"])
            redirect = RedirectResponse(path + (f"?{rest}" if rest else ""), status_code=303)
            redirect.set_cookie(self._cookie, self._secret, httponly=True, samesite="strict", path="/")
            return redirect
        if not self._has_secret(headers):
            return HTMLResponse(self._locked, status_code=403)
        if method in ("GET", "HEAD"):
            return None
        origin = headers.get("origin")
        if origin is None or origin.lower() not in {f"http://{netloc}" for netloc in self._netlocs}:
            why = f"refused: a decision must come from the console's own page (Origin {origin!r} is not it)"
            return PlainTextResponse(why, status_code=403)
        if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            return PlainTextResponse("refused: a decision is sent as application/json", status_code=415)
        return None

    def _has_secret(self, headers: Headers) -> bool:
        cookies: SimpleCookie = SimpleCookie()
        try:
            cookies.load(headers.get("cookie", ""))
        except Exception:  # boundary: a malformed Cookie header is no secret
            return False
        morsel = cookies.get(self._cookie)
        return morsel is not None and hmac.compare_digest(morsel.value.encode(), self._secret.encode())


def _secured(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if not k.lower().startswith(b"access-control-")]
            headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
            message = {**message, "headers": headers}
        await send(message)

    return sending
