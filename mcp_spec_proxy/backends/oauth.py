"""A remote backend's OAuth 2.1 client: the SDK's own provider, its tokens on disk, a login where the person is.

`BackendAuth` holds one backend's `httpx2.Auth`: the SDK's `OAuthClientProvider` (protected resource
and authorization server discovery from the 401, a client by CIMD, DCR or pre-registration, PKCE,
the `state` and `iss` checks, refresh, step-up on `insufficient_scope`), or its
`ClientCredentialsOAuthProvider` for `grant: client_credentials`. Nothing of the flow is written
here; what is here is where the person logs in and where the tokens live:

* the redirect handler binds the loopback listener (`backends/loopback.py`) first, then opens the
  authorization URL with Python's `webbrowser` (`BROWSER` picks the program) and says the URL in one
  line for a person with no browser at hand; the callback handler waits for the code, at most
  `login_timeout` seconds. One login at a time per process: the listener's port is one.
* the tokens and the client registration live in the store's `TokenStore` (`store/tokens.py`: a file
  in the state directory, or under `store: postgres` an encrypted row every replica shares), bound to
  the backend's URL; the access token's expiry is kept with them and handed to each new provider, so a
  token that expired while the proxy was down is refreshed before it is sent; and a token the server
  refuses before its expiry is refreshed once before the provider asks for a new login (`RefreshOn401`).
  A step-up beyond the scope a client was dynamically registered for registers a client anew first:
  an authorization server may keep the registered `scope` as the client's ceiling.
* a refresh is held against every other process sharing the tokens (`TokenStore.hold_refresh`) and
  the kept tokens are read again under the hold: where another replica refreshed first, its new
  tokens are taken instead of spending a refresh token the server has rotated away (which would
  lock this replica out); where the login was dropped meanwhile (`logout`), it needs a login again.
* `on_login(True)` is called as a login begins and `on_login(False)` when it ends, so the
  connection waiting for it stops its own startup clock and lets the other backends start
  (`backends/connection.py`).

Every session a URL backend opens (its first, its other era's, each client session's own) carries
the one provider of its backend (`provider`); a new connection attempt of the first session takes a
fresh one (`renew`), which reads the tokens again (a `login` run from the command line meanwhile).
Where the front knows who asks, a principal's own sessions carry that principal's own client instead
(`for_principal`: its own token file, `oauth/<server>/<digest>.json`): no browser is opened on this
machine for it; its login's URL is said to the principal's call (`backends/session_legs.py`).
No token is ever logged: the provider's own log lines carry none, and nothing here names one.
"""

from __future__ import annotations

import logging
import threading
import time
import webbrowser
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
from mcp.client.auth import OAuthClientProvider, OAuthFlowError, TokenStorage
from mcp.client.auth.utils import extract_field_from_www_auth, extract_scope_from_www_auth, union_scopes
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from pydantic import AnyUrl

from mcp_spec_proxy.backends.loopback import LoginRefused, Redirect
from mcp_spec_proxy.config.backend_auth import OAuthSettings
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.store.tokens import TokenFile, TokenStore

logger = logging.getLogger(__name__)

CLIENT_NAME = "mcp-spec-proxy"
FRESH_FOR_S = 10.0  # kept tokens another process refreshed are taken when they stay valid this long
FORM = "application/x-www-form-urlencoded"


class _Preregistered:
    """The token store, with the client the operator registered in place of any stored one."""

    def __init__(self, tokens: TokenStore, client: OAuthClientInformationFull) -> None:
        self._tokens = tokens
        self._client = client

    async def get_tokens(self) -> OAuthToken | None:
        return await self._tokens.get_tokens()

    async def set_tokens(self, tokens: OAuthToken) -> None:
        await self._tokens.set_tokens(tokens)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self._client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        # A registration of its own (the authorization server moved): kept, but the configured client wins at start.
        await self._tokens.set_client_info(client_info)


class RefreshOn401(httpx2.Auth):
    """The SDK's provider, with a refresh where it would ask for a new login: a 401 to a request that
    carried a token the provider can refresh (the server revoked or forgot it before its expiry) is
    answered by a refresh and one retry; only a second 401 goes to the provider's own answer, a new
    login. Every refresh is held against the other processes sharing `tokens` (see the module
    docstring). Everything else is the provider's."""

    requires_response_body = True

    def __init__(self, provider: OAuthClientProvider, tokens: TokenStore) -> None:
        self.provider = provider
        self.tokens = tokens
        self._primed = False

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        context = self.provider.context
        if not self._primed:
            # The SDK keeps an expiry only for tokens it got in this process: a kept one's is handed over,
            # so an expired token is refreshed before it is sent rather than refused by the server.
            context.token_expiry_time = (await self.tokens.kept())[1]
            self._primed = True
        flow = self.provider.async_auth_flow(request)
        retried = False
        try:
            outgoing = await flow.__anext__()
            while True:
                spent = _spent_refresh_token(outgoing) if outgoing is not request else None
                if spent is not None:
                    hold = await self.tokens.hold_refresh()
                    try:
                        outgoing, answer = await self._after_others(outgoing, spent)
                        response = answer if answer is not None else (yield outgoing)
                        outgoing = await flow.asend(response)  # the provider keeps its new tokens, still held
                    finally:
                        await hold.release()
                    continue
                response = yield outgoing
                refusing = outgoing is request and response.status_code == 401 and "authorization" in request.headers
                if refusing and not retried and context.can_refresh_token():
                    retried = True
                    await flow.aclose()
                    del request.headers["authorization"]
                    context.token_expiry_time = 1.0  # taken as expired: the provider refreshes it first
                    flow = self.provider.async_auth_flow(request)
                    outgoing = await flow.__anext__()
                    continue
                if outgoing is request and response.status_code == 403:
                    _register_anew_for_wider_scope(self.provider, response)
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        finally:
            await flow.aclose()

    async def _after_others(self, refresh: httpx2.Request, spent: str) -> tuple[httpx2.Request, httpx2.Response | None]:
        """The refresh to send now that it is held, or the answer it gets without being sent: the
        tokens another process kept meanwhile (a refresh of its own), or a refusal (a logout)."""
        kept, expires_at = await self.tokens.kept()
        if kept is not None and kept.refresh_token == spent:
            return refresh, None  # no one refreshed before us: ours to spend
        if kept is None or not kept.access_token:
            logger.info("the login this refresh belongs to was dropped meanwhile: it needs a login again")
            return refresh, httpx2.Response(400, json={"error": "invalid_grant"}, request=refresh)
        if expires_at is None or expires_at > time.time() + FRESH_FOR_S:
            logger.info("another process refreshed these tokens first: using its new ones")
            body = kept.model_dump(mode="json", exclude_none=True)
            if expires_at is not None:
                body["expires_in"] = int(expires_at - time.time())
            return refresh, httpx2.Response(200, json=body, request=refresh)
        if kept.refresh_token:  # refreshed elsewhere and expired since: refreshed again, with the newest
            form = {key: values[0] for key, values in parse_qs(refresh.content.decode()).items()}
            headers = {k: v for k, v in refresh.headers.items() if k.lower() not in ("content-length", "host")}
            data = {**form, "refresh_token": kept.refresh_token}
            return httpx2.Request("POST", refresh.url, data=data, headers=headers), None
        return refresh, httpx2.Response(400, json={"error": "invalid_grant"}, request=refresh)


def _spent_refresh_token(request: httpx2.Request) -> str | None:
    """The refresh token a request to a token endpoint spends, if it is a refresh."""
    if request.method != "POST" or not request.headers.get("content-type", "").startswith(FORM):
        return None
    try:
        form = parse_qs(request.content.decode())
    except (httpx2.RequestNotRead, UnicodeDecodeError):
        return None
    if form.get("grant_type") != ["refresh_token"]:
        return None
    return form.get("refresh_token", [""])[0] or None


def _register_anew_for_wider_scope(provider: OAuthClientProvider, response: httpx2.Response) -> None:
    """A step-up (403 `insufficient_scope`) for scopes outside what the client was registered for:
    the registration is dropped, so the SDK registers a client for the wider scope before it asks
    for it. An authorization server that keeps the registered `scope` as the client's ceiling
    (oidc-provider does) refuses a wider request from the old client with `invalid_scope`; a
    pre-registered or CIMD client, registered with no scope of ours, is never dropped."""
    context = provider.context
    registered = context.client_info.scope if context.client_info is not None else None
    if registered is None or extract_field_from_www_auth(response, "error") != "insufficient_scope":
        return
    granted = context.current_tokens.scope if context.current_tokens is not None else None
    wanted = union_scopes(union_scopes(context.client_metadata.scope, granted), extract_scope_from_www_auth(response))
    if not set((wanted or "").split()) <= set(registered.split()):
        logger.info("the step-up asks for scope %r, beyond the registered client's: registering anew", wanted)
        context.client_info = None


class BackendAuth:
    """One backend's OAuth client (see the module docstring)."""

    def __init__(
        self,
        name: str,
        url: str,
        settings: OAuthSettings,
        tokens: TokenStore,
        *,
        secret: str | None = None,  # the client's secret, or its private key under `private_key_env`
        desk: anyio.Semaphore | None = None,
        open_browser: Callable[[str], object] = webbrowser.open,
        person: str | None = None,
    ) -> None:
        self.name = name
        # One principal's login (`for_principal`): the person is not at this machine, so no browser is
        # opened here; the login's URL waits in `asking_url` for the call that needs it to say.
        self.person = person
        self.asking_url: str | None = None
        self.asking = anyio.Event()  # set while `asking_url` waits for its person
        self.url = url
        self.settings = settings
        self.tokens = tokens
        self._secret = secret
        # One login at a time: one loopback port. A semaphore, not a lock: its holder is a login, not a task.
        self._desk = desk if desk is not None else anyio.Semaphore(1)
        self._open_browser = open_browser
        self._pending: tuple[Redirect, str] | None = None
        self.on_login: Callable[[bool], None] | None = None
        # Told `(server, authorization URL)` as a login waits for the person, `(server, None)` as it ends:
        # the approval console's card and the clients' URL elicitation (`fronts/logins.py`).
        self.watchers: list[Callable[[str, str | None], None]] = []
        self.waiting_at: str | None = None  # the authorization URL while a login waits for the person
        self.provider: httpx2.Auth = self._build()

    @property
    def interactive(self) -> bool:
        """Whether logging in needs a person (the authorization code grant)."""
        return self.settings.grant == "authorization_code"

    def for_principal(self, issuer: str, subject: str) -> BackendAuth:
        """The same backend's OAuth client for one principal, with that principal's own tokens (and
        its own client registration); its logins share this one's loopback port."""
        return BackendAuth(
            self.name,
            self.url,
            self.settings,
            self.tokens.of_principal(issuer, subject),
            secret=self._secret,
            desk=self._desk,
            open_browser=self._open_browser,
            person=subject,
        )

    def renew(self) -> None:
        """A fresh provider, which reads the kept tokens again (for a new connection attempt)."""
        self.provider = self._build()

    def _build(self) -> httpx2.Auth:
        settings = self.settings
        scope = " ".join(settings.scopes) or None
        provider: OAuthClientProvider
        if settings.grant == "client_credentials":
            # Imported only for this grant: the SDK's extension loads PyJWT and cryptography, which a
            # proxy without a `client_credentials` backend would otherwise pay for at every start.
            from mcp.client.auth.extensions.client_credentials import (
                ClientCredentialsOAuthProvider,
                PrivateKeyJWTOAuthProvider,
                SignedJWTParameters,
            )
        if settings.grant == "client_credentials" and settings.private_key_env is not None:
            assert settings.client_id is not None and self._secret is not None  # the config validator's
            signed = SignedJWTParameters(
                issuer=settings.client_id,
                subject=settings.client_id,
                signing_key=self._secret,
                signing_algorithm=settings.signing_algorithm,
            )
            provider = PrivateKeyJWTOAuthProvider(
                server_url=self.url,
                storage=self.tokens,
                client_id=settings.client_id,
                assertion_provider=signed.create_assertion_provider(),
                scope=scope,
                issuer=settings.issuer,
            )
        elif settings.grant == "client_credentials":
            assert settings.client_id is not None and self._secret is not None  # the config validator's
            post = settings.token_endpoint_auth_method == "client_secret_post"
            provider = ClientCredentialsOAuthProvider(
                server_url=self.url,
                storage=self.tokens,
                client_id=settings.client_id,
                client_secret=self._secret,
                token_endpoint_auth_method="client_secret_post" if post else "client_secret_basic",
                scope=scope,
                issuer=settings.issuer,
            )
        else:
            redirect = AnyUrl(settings.redirect_uri)
            storage: TokenStorage = self.tokens
            if settings.client_id is not None:
                method = settings.token_endpoint_auth_method or ("client_secret_basic" if self._secret else "none")
                client = OAuthClientInformationFull(
                    client_id=settings.client_id,
                    client_secret=self._secret,
                    redirect_uris=[redirect],
                    token_endpoint_auth_method=method,
                    issuer=settings.issuer,
                )
                storage = _Preregistered(self.tokens, client)
            provider = OAuthClientProvider(
                server_url=self.url,
                client_metadata=OAuthClientMetadata(
                    client_name=CLIENT_NAME,
                    redirect_uris=[redirect],
                    grant_types=["authorization_code", "refresh_token"],
                    response_types=["code"],
                    scope=scope,
                ),
                storage=storage,
                redirect_handler=self._redirect,
                callback_handler=self._callback,
                client_metadata_url=settings.client_metadata_url,
            )
        return RefreshOn401(provider, self.tokens)

    async def _redirect(self, authorization_url: str) -> None:
        """Bind the loopback redirect, then send the person to the authorization server."""
        state = parse_qs(urlsplit(authorization_url).query).get("state", [""])[0]
        await self._drop_pending()
        if self.person is None:
            await self._desk.acquire()
        else:
            try:  # a person's call waits for no one else's login: it is told to come back
                self._desk.acquire_nowait()
            except anyio.WouldBlock:
                raise OAuthFlowError(
                    "needs your own login, and another login holds the login port now: call again in a minute"
                ) from None
        try:
            try:
                redirect = await Redirect.listen(self.settings.callback_port)
            except OSError as exc:
                raise OAuthFlowError(
                    f"cannot take the login's redirect on 127.0.0.1:{self.settings.callback_port}"
                    f" ({exc.strerror or exc}): another program (or another proxy's login) holds that port —"
                    f" finish that login, or set `callback_port` on server {self.name!r}"
                ) from None
        except BaseException:
            self._desk.release()
            raise
        self._pending = (redirect, state)
        if self.on_login is not None:
            self.on_login(True)
        if self.person is not None:
            logger.info(
                "backend %r needs a login of principal %r: the login URL is given to their call", self.name, self.person
            )
            self.asking_url = authorization_url
            self.asking.set()
            return
        self._tell(authorization_url)
        logger.warning(
            "backend %r needs a login: opening the authorization page in a browser; if none opens, visit %s"
            " (or run `mcp-spec-proxy login %s`)",
            self.name,
            authorization_url,
            self.name,
        )
        # Not awaited: a browser program may wait for the redirect this process answers only once
        # the callback handler runs.
        threading.Thread(target=self._open_browser, args=(authorization_url,), daemon=True).start()

    async def _callback(self) -> AuthorizationCodeResult:
        """The code from the loopback redirect, within `login_timeout`."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise OAuthFlowError("no login is waiting for a redirect")
        try:
            redirect, state = pending
            with anyio.move_on_after(self.settings.login_timeout):
                try:
                    return await redirect.wait(state)
                except LoginRefused as exc:
                    raise OAuthFlowError(f"the authorization server refused the login ({exc})") from None
            raise OAuthFlowError(f"no login within {self.settings.login_timeout:g}s (`login_timeout` waits longer)")
        finally:
            with anyio.CancelScope(shield=True):
                await redirect.aclose()
            self._desk.release()
            if self.person is not None:
                self.asking_url, self.asking = None, anyio.Event()
            if self.on_login is not None:
                self.on_login(False)
            self._tell(None)

    def _tell(self, authorization_url: str | None) -> None:
        self.waiting_at = authorization_url
        for watcher in self.watchers:
            try:
                watcher(self.name, authorization_url)
            except Exception:  # boundary: a card or a client that cannot be told must not stop the login
                logger.debug("could not tell of %r's login", self.name, exc_info=True)

    async def _drop_pending(self) -> None:
        """A login whose flow ended between its redirect and its callback: its listener and its
        place at the desk are let go."""
        if self._pending is not None:
            with anyio.CancelScope(shield=True):
                await self._pending[0].aclose()
            self._pending = None
            self._desk.release()
            if self.person is not None:
                self.asking_url, self.asking = None, anyio.Event()
            else:  # a person's login is given to their call, never to the console's card
                self._tell(None)


def login_failure(exc: Exception) -> str:
    """A failed login in words that hold no token: the SDK's message, except what it quotes of a
    token endpoint's answer it could not read (a token may be in it)."""
    text = str(exc) or type(exc).__name__
    head, _, _ = text.partition(":")
    if head.lower().startswith(("invalid token response", "invalid refresh response")):
        return f"{head} (the answer is not repeated: it may hold a token)"
    return text


def backend_logins(
    servers: Mapping[str, ServerConfig],
    state_root: Path,
    environ: Mapping[str, str],
    source: str = "config",
    tokens: Callable[[str, str], TokenStore] | None = None,
) -> dict[str, BackendAuth]:
    """Each URL backend's OAuth client, by server name; its secret read from `environ` (a
    `ConfigError` when the variable it names is not set). One login at a time across them. Its
    tokens live where `tokens` (the store's `token_stores`) says: by default, files under `state_root`."""
    desk = anyio.Semaphore(1)
    logins: dict[str, BackendAuth] = {}
    for name, server in servers.items():
        settings = server.auth
        if settings is None or server.url is None:
            continue
        secret = None
        for key, variable, what in (
            (
                "client_secret_env",
                settings.client_secret_env,
                "the client's secret, or drop client_secret_env for a public client",
            ),
            ("private_key_env", settings.private_key_env, "the client's PEM private key"),
        ):
            if variable is None:
                continue
            secret = environ.get(variable)
            if not secret:
                raise ConfigError(
                    source,
                    f"servers.{name}.auth.{key}",
                    f"environment variable {variable} is not set",
                    f"export it with {what}",
                )
        kept = tokens(name, server.url) if tokens is not None else TokenFile.of(state_root, name, server.url)
        logins[name] = BackendAuth(name, server.url, settings, kept, secret=secret, desk=desk)
    return logins


__all__ = ["BackendAuth", "RefreshOn401", "backend_logins", "login_failure"]
