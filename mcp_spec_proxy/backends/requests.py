"""The requests the proxy sends one connected backend: tool calls, prompts, resources, completions,
log levels and subscriptions — each on the proxy's own clock, each failure named as what it was.

`Requests` is the request half of `Backend` (`connection.py` keeps the connection's lifecycle):
a request that arrives while a lost connection is made again waits for it on its own clock, and
nothing is sent to a backend that is not connected. A backend's own JSON-RPC error is raised as
the `MCPError` it sent, whatever its code; only what the proxy observed becomes its own
`BackendError` (its clock, the transport really ending, one HTTP request's connection lost, the
size bound).

A read has one door here, `call_tool_json`: wire JSON, past the SDK client on a stdio backend's
raw channel (`raw.py`) or a handshake-era streamable HTTP session (`lean_http.py`), through it
where progress, a log route or the transport asks for it.
`call_tool` is the SDK client's call, which writes and that fallback use.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mcp_spec_proxy.backends.era import CLIENT_ERA, Era, era_of
from mcp_spec_proxy.backends.http import Lost
from mcp_spec_proxy.backends.lean_http import LeanLeg
from mcp_spec_proxy.backends.listing import Listing
from mcp_spec_proxy.backends.notices import LogRoute, request_logs
from mcp_spec_proxy.backends.other_era import OtherEra
from mcp_spec_proxy.backends.raw import (
    Oversized,
    RawCalls,
    WireResult,
    amount,
    asks_for_input,
    json_size,
    remote_error,
    result_size,
    tool_result,
    without_envelope,
)
from mcp_spec_proxy.backends.relay import CLIENT_ANSWERS, Relay
from mcp_spec_proxy.backends.session_legs import ASKING, CLIENT_SESSION, SessionLegs
from mcp_spec_proxy.backends.transports import WatchedTransport
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.errors import BackendClosed, BackendError, BackendTimeout, BackendUnavailable, ResultTooLarge
from mcp_spec_proxy.sdk import stamp_request
from mcp_spec_proxy.wire_types import RpcRequest


class Requests:
    """What a connected backend is asked; the connection's state is `Backend`'s (declared here)."""

    name: str
    config: ServerConfig
    relay: Relay
    sessions: SessionLegs | None
    status: str
    last_error: str | None
    log_level: types.LoggingLevel | None
    _client: Client | None
    _listing: Listing | None
    other_era: OtherEra
    _raw: RawCalls | None
    _transport: WatchedTransport | None
    _back: anyio.Event
    _watched: set[str]
    _rewatch: anyio.Event
    _heard: frozenset[str]
    _heard_changed: anyio.Event
    _routes: set[LogRoute]

    @property
    def client(self) -> Client:
        """The live connection, for a look at it (requests go out through `_live`)."""
        if self._client is None:
            raise BackendUnavailable(self.name, f"is unavailable ({self.last_error or self.status})")
        return self._client

    async def _live(self, what: str, deadline: float, tool: str | None = None) -> Client:
        """The connection a request goes out on: the leg of the client's era where the server has
        one (`backends/era.py`), else the first. One that arrives while a lost connection is being
        made again waits for it until `deadline` (its tools stay listed meanwhile): nothing is sent
        to a backend that is not connected."""
        with anyio.CancelScope(deadline=deadline):
            while self._client is None and self.status == "reconnecting":
                await self._back.wait()
        if self._client is not None:
            client = self._client
            ref = CLIENT_SESSION.get()
            personal = self.sessions is not None and self.sessions.personal(ASKING.get())
            other = self.other_era.client
            if other is not None and self._wants_other(other, tool) and not personal:
                client = other  # (a person's request stays on their own session of the first leg's era)
            if self.sessions is not None and ref is not None and era_of(client.protocol_version) == "handshake":
                return await self.sessions.client_for(ref, deadline)  # the client's own backend session
            if personal or (self.sessions is None and _logs_in_people(self.config) and ASKING.get() is not None):
                raise BackendUnavailable(
                    self.name,
                    f"keeps one login per person, and {what} would go out on the session every client shares"
                    " (the operator's login); nothing was sent — set `isolation: per_session` on the server",
                )
            return client
        if self.status == "reconnecting":
            raise BackendUnavailable(
                self.name, f"is reconnecting and was not back within {self.config.timeout:g}s; {what} was not sent"
            )
        raise BackendUnavailable(self.name, f"is unavailable ({self.last_error or self.status})")

    async def roots_changed(self) -> None:
        """Tell a handshake-era backend its (one) client's roots changed: it asks for them anew."""
        client = self._client
        if client is not None and era_of(client.protocol_version) == "handshake" and "roots" in self.relay.kinds:
            with anyio.move_on_after(self.config.timeout):
                await client.session.send_notification(types.RootsListChangedNotification())

    def _wants_other(self, other: Client, tool: str | None) -> bool:
        """Whether a request goes down the other era's leg: its client speaks that era, or (no
        client asking: the proxy's own agent) only that leg lists the tool."""
        era = CLIENT_ERA.get()
        if era is not None:
            return era == era_of(other.protocol_version)
        listing, first = self.other_era.listing, self._listing
        if tool is None or listing is None or (first is not None and any(t.name == tool for t in first.tools)):
            return False
        return any(t.name == tool for t in listing.tools)

    def _answers_for(self, tool: str) -> dict[str, Any] | None:
        """The answers the calling client sent with its call of this very tool (`CLIENT_ANSWERS`)."""
        pending = CLIENT_ANSWERS.get()
        return pending[2] if pending is not None and pending[:2] == (self.name, tool) else None

    def _transport_of(self, client: Client) -> WatchedTransport | None:
        if client is self._client:
            return self._transport
        if client is self.other_era.client:
            return self.other_era.transport
        return self.sessions.transport_of(client) if self.sessions is not None else None

    def _relay_of(self, client: Client) -> Relay:
        """The relay of the leg `client` is: a client session's own leg asks that client alone."""
        own = self.sessions.relay_of(client) if self.sessions is not None else None
        return own or self.relay

    def _deadline(self) -> float:
        return anyio.current_time() + self.config.timeout

    @staticmethod
    def _clock(deadline: float) -> AbstractContextManager[anyio.CancelScope]:
        """The proxy's clock on one request: its `timeout`, counted from when it arrived."""
        return anyio.fail_after(max(0.0, deadline - anyio.current_time()))

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], progress: ProgressFnT | None = None
    ) -> types.CallToolResult:
        """The backend's result. Its own JSON-RPC error is raised as the `MCPError` it sent; what
        the proxy saw go wrong (its clock, the connection ending, the size bound) as a `BackendError`."""
        what = f"tools/call {tool}"
        deadline = self._deadline()
        client = await self._live(what, deadline, tool)
        route = request_logs.get()
        answers = self._answers_for(tool) if client.protocol_version in MODERN_PROTOCOL_VERSIONS else None
        if answers is not None:
            CLIENT_ANSWERS.set(None)  # the call's first forward only
        try:
            # The proxy's clock, not the SDK's: the SDK reports its own timeout with the code a
            # backend may send too (-32001), and only a timeout measured here is the proxy's to name.
            with self._clock(deadline) as clock, self._relay_of(client).calling(clock), self._routed(route):
                result = await client.call_tool(
                    tool,
                    arguments,
                    progress_callback=progress,
                    meta=self._log_meta(client, route),
                    input_responses=answers,
                )
        except TimeoutError:
            raise self._timeout(what) from None
        except MCPError as exc:
            raise self._translate(exc, what, client) from exc
        except ValidationError:  # the SDK client's check of the answer: the lean path's `tool_result`
            raise self._no_result(what) from None
        size = result_size(result)
        if size > self.config.max_result_bytes:
            raise self._too_large(tool, amount(size))
        return result

    async def call_tool_json(
        self, tool: str, arguments: dict[str, Any], progress: ProgressFnT | None = None
    ) -> WireResult:
        """A read's result as wire JSON: the one door of every read to this backend. Written and
        read past the SDK client where the transport allows (`backends/raw.py`), through it where
        progress is to be relayed, a log route waits, or the transport has no raw channel. Same
        timeout, size bound and errors either way; a result of another shape is the backend's
        error, and one of the plain shape passes as it came (`raw.tool_result`)."""
        what = f"tools/call {tool}"
        deadline = self._deadline()
        client = await self._live(what, deadline, tool)
        raw: RawCalls | LeanLeg | None = self._raw if client is self._client else None  # the first leg's pipes
        if raw is None and (transport := self._transport_of(client)) is not None:
            raw = LeanLeg.of(transport.guard, client)  # an established handshake-era HTTP session
        answering = self._answers_for(tool) is not None
        sdk = progress is not None or request_logs.get() is not None or answering
        if raw is None or not raw.open or sdk:
            called = await self.call_tool(tool, arguments, progress)
            return cast(WireResult, called.model_dump(by_alias=True, mode="json", exclude_none=True))
        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        request: RpcRequest = {"method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        stamp_request(client, request)
        if (log_meta := self._log_meta(client, None)) is not None:
            request["params"]["_meta"] = {**request["params"].get("_meta", {}), **dict(log_meta)}
        request["jsonrpc"] = "2.0"
        try:
            with self._clock(deadline) as clock, self._relay_of(client).calling(clock):
                answer = await raw.request(request)
                if modern and isinstance(answer, dict) and asks_for_input(answer):  # a backend's question
                    return await self._answer_input_required(client, tool, arguments, answer)
        except TimeoutError:
            raise self._timeout(what) from None
        if answer is None:
            raise self._closed(what)
        if isinstance(answer, Oversized):
            raise self._too_large(tool, amount(answer.size))
        if "error" in answer:
            if isinstance(raw, LeanLeg) and (lost := raw.lost(answer["error"])) is not None:
                raise self._lost(lost, what, client)
            raise remote_error(answer["error"]) or BackendError(
                self.name, f"answered {what} with a malformed JSON-RPC error"
            )
        result = tool_result(answer.get("result"), client.protocol_version)
        if result is None:
            raise self._no_result(what)
        size = json_size(result)
        if size > self.config.max_result_bytes:
            raise self._too_large(tool, amount(size))
        return result

    async def _answer_input_required(
        self, client: Client, tool: str, arguments: dict[str, Any], answer: dict[str, Any]
    ) -> WireResult:
        """The raw path's call that came back `input_required`: its questions relayed, then the
        call resumed through the SDK client (which relays any further rounds itself)."""
        try:
            asked = types.InputRequiredResult.model_validate(answer["result"])
        except ValidationError:
            raise BackendError(self.name, f"answered tools/call {tool} with a malformed input_required") from None
        # All of a round's questions at once, as the SDK client asks them: a 2026-07-28 client of
        # the proxy is then asked them in one round of its own, under the backend's keys.
        responses: dict[str, Any] = {}
        failed: list[Exception] = []  # the first question that failed settles the call, as itself

        async def ask(key: str, request: types.InputRequest, scope: anyio.CancelScope) -> None:
            meta = request.params.meta if request.params else None
            context = ClientRequestContext(session=client.session, request_id=key, meta=meta)
            try:
                response = await client.session.dispatch_input_request(context, request)
            except Exception as exc:  # boundary: raised here, not as the task group's ExceptionGroup
                failed.append(exc)
                scope.cancel()
                return
            if isinstance(response, types.ErrorData):
                failed.append(MCPError.from_error_data(response))
                scope.cancel()  # a refused question settles the call: its siblings are not waited for
            else:
                responses[key] = response

        async with anyio.create_task_group() as questions:
            for key, request in (asked.input_requests or {}).items():
                questions.start_soon(ask, key, request, questions.cancel_scope)
        if failed:
            raise failed[0]
        try:
            result = await client.call_tool(
                tool, arguments, input_responses=responses, request_state=asked.request_state
            )
        except MCPError as exc:
            raise self._translate(exc, f"tools/call {tool}", client) from exc
        dumped = cast(WireResult, result.model_dump(by_alias=True, mode="json", exclude_none=True))
        size = json_size(dumped)
        if size > self.config.max_result_bytes:
            raise self._too_large(tool, amount(size))
        return dumped

    def _too_large(self, tool: str, size: str) -> ResultTooLarge:
        return ResultTooLarge(
            self.name,
            f"returned too much from {tool} ({size}), more than max_result_bytes"
            f" ({amount(self.config.max_result_bytes)}); the result was withheld — ask for less,"
            " or raise max_result_bytes for this server",
        )

    def _no_result(self, what: str) -> BackendError:
        # The same words and code on both paths of a read (`call_tool`, `call_tool_json`).
        return BackendError(self.name, f"answered {what} with something that is not a tool result")

    def _timeout(self, what: str) -> BackendTimeout:
        return BackendTimeout(
            self.name,
            f"did not answer {what} within {self.config.timeout:g}s, this server's `timeout`; the proxy"
            " stopped waiting and asked it to cancel"
            + (", so it may still have run" if what.startswith("tools/call") else ""),
        )

    def _closed(self, what: str) -> BackendClosed:
        ran = ", so it may have run" if what.startswith("tools/call") else ""
        again = "restarts it" if self.config.transport == "stdio" else "reconnects"  # what `run` does next
        return BackendClosed(
            self.name, f"closed its connection during {what}, before answering{ran}; the proxy {again}"
        )

    def _lost(self, lost: Lost, what: str, client: Client) -> BackendError:
        """One HTTP request's connection lost: the session goes on, unless nothing could be sent."""
        if (error := lost.error(self.name, what)) is not None:
            return error
        # No connection could be made: the server may be down or restarted, its session with it.
        if (transport := self._transport_of(client)) is not None:
            transport.ended.set()
        return BackendUnavailable(
            self.name, f"could not be reached ({lost.detail}); {what} was not sent, and the proxy reconnects"
        )

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        what = f"prompts/get {name}"
        deadline = self._deadline()
        client = await self._live(what, deadline)
        try:
            with self._clock(deadline) as clock, self._relay_of(client).calling(clock):
                return await client.get_prompt(name, arguments)
        except TimeoutError:
            raise self._timeout(what) from None
        except MCPError as exc:
            raise self._translate(exc, what, client) from exc

    async def read_resource(self, uri: str) -> types.ReadResourceResult:
        what = f"resources/read {uri}"
        deadline = self._deadline()
        client = await self._live(what, deadline)
        try:
            with self._clock(deadline) as clock, self._relay_of(client).calling(clock):
                return await client.read_resource(uri)
        except TimeoutError:
            raise self._timeout(what) from None
        except MCPError as exc:
            raise self._translate(exc, what, client) from exc

    async def complete(self, params: types.CompleteRequestParams) -> types.CompleteResult:
        """`completion/complete` with the client's params as they are (the ref already the server's own)."""
        what = "completion/complete"
        deadline = self._deadline()
        client = await self._live(what, deadline)
        params = params.model_copy(update={"meta": without_envelope(params.meta)})
        try:
            with self._clock(deadline) as clock, self._relay_of(client).calling(clock):
                return await client.session.send_request(types.CompleteRequest(params=params), types.CompleteResult)
        except TimeoutError:
            raise self._timeout(what) from None
        except MCPError as exc:
            raise self._translate(exc, what, client) from exc

    async def set_logging_level(self, level: types.LoggingLevel) -> None:
        """Remember `level` for this server (applied again on every reconnect) and apply it now.

        A handshake-era server that declares `logging` gets `logging/setLevel`; a 2026-07-28 server
        has no such method: the level rides each forwarded call's `_meta` instead (`_log_meta`)."""
        self.log_level = level
        client = self._client
        if client is not None:
            await self._apply_level(client)

    def _subscription_leg(self, era: Era | None) -> Client | None:
        """The leg a client of `era` (None: no client, the proxy's own) subscribes on: the other era's
        where that is a handshake-era leg and the client speaks the handshake era (the first leg then
        speaks 2026-07-28, where a server may offer no subscriptions at all), else the first."""
        other = self.other_era.client
        if other is not None and era == "handshake" and era_of(other.protocol_version) == "handshake":
            return other
        return self._client

    def subscribable_in(self, era: Era | None) -> bool:
        """Whether the leg a client of `era` subscribes on declares `resources.subscribe`."""
        client = self._subscription_leg(era)
        caps = client.server_capabilities if client is not None else None
        return bool(caps is not None and caps.resources is not None and caps.resources.subscribe)

    def subscribable_to(self, protocol_version: str | None) -> bool:
        """`subscribable_in` for a client that negotiated `protocol_version` (None: one initializing)."""
        return self.subscribable_in(era_of(protocol_version))

    async def subscribe(self, uri: str) -> None:
        """Hear of changes to `uri` from now on (and after every reconnect) until `unsubscribe`, on
        the leg of the asking client's era (`_subscription_leg`)."""
        client = self._subscription_leg(CLIENT_ERA.get())
        on_other = client is not None and client is self.other_era.client
        watched = self.other_era.watched if on_other else self._watched
        watched.add(uri)
        if client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:  # the first leg
            self._rewatch.set()
            # Subscribed once the reopened stream's ack names the URI: an update right after this
            # returns is heard.
            with anyio.move_on_after(self.config.timeout):
                while uri not in self._heard:
                    await self._heard_changed.wait()
        elif client is not None:
            try:
                await self._send_empty(client, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)))
            except MCPError as exc:
                watched.discard(uri)
                raise self._translate(exc, f"resources/subscribe {uri}", client) from exc

    async def unsubscribe(self, uri: str) -> None:
        """Stop hearing of `uri`, on the leg it was subscribed on."""
        on_other = uri in self.other_era.watched
        (self.other_era.watched if on_other else self._watched).discard(uri)
        client = self.other_era.client if on_other else self._client
        if client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._rewatch.set()
        elif client is not None:
            try:
                await self._send_empty(client, types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri)))
            except MCPError as exc:
                raise self._translate(exc, f"resources/unsubscribe {uri}", client) from exc

    async def _send_empty(self, client: Client, request: types.SubscribeRequest | types.UnsubscribeRequest) -> None:
        with self.relay.calling():  # no client waits on it: a question it causes asks nobody
            await client.session.send_request(request, types.EmptyResult)

    async def _apply_level(self, client: Client) -> None:
        caps = client.server_capabilities
        if self.log_level is None or caps.logging is None or client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        try:
            with self.relay.calling():
                await client.session.send_request(
                    types.SetLevelRequest(params=types.SetLevelRequestParams(level=self.log_level)), types.EmptyResult
                )
        except MCPError as exc:
            raise self._translate(exc, "logging/setLevel", client) from exc

    def _log_meta(self, client: Client, route: LogRoute | None) -> types.RequestParamsMeta | None:
        """The log opt-in a 2026-07-28 server needs on a forwarded call: the calling request's own,
        else (for a handshake-era client) the level the handshake-era clients set; None for a
        handshake-era server (its `logging/setLevel` governs), a 2026-07-28 client that did not opt
        in (the server must not log to it), or when nobody asked for logs."""
        level = route.level if route is not None else None
        if level is None and CLIENT_ERA.get() != "modern":
            level = self.log_level
        if level is None or client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return None
        return cast(types.RequestParamsMeta, {LOG_LEVEL_META_KEY: level})  # an open map: the reserved key is not typed

    @contextmanager
    def _routed(self, route: LogRoute | None) -> Iterator[None]:
        if route is None:
            yield
            return
        self._routes.add(route)
        try:
            yield
        finally:
            self._routes.discard(route)

    def _translate(self, exc: MCPError, what: str, client: Client) -> Exception:
        """The SDK's `MCPError` as what it was: the transport's size refusal, the connection really
        ending, or (anything else, whatever its code) the backend's own error, passed on unchanged."""
        if isinstance(exc.data, Oversized):
            return self._too_large(what.removeprefix("tools/call "), amount(exc.data.size))
        transport = self._transport_of(client)
        guard = transport.guard if transport is not None else None
        if guard is not None and (lost := guard.claim(exc.data)) is not None:
            return self._lost(lost, what, client)
        if exc.code == CONNECTION_CLOSED and self._ended(client):
            return self._closed(what)
        return exc

    def _ended(self, client: Client) -> bool:
        """Whether `client`'s connection is really over (its transport ended, or it is no longer
        the connection): a backend that merely answers -32000 is still connected."""
        owned = self.sessions is not None and self.sessions.owns(client)
        if client is not self._client and client is not self.other_era.client and not owned:
            return True
        transport = self._transport_of(client)
        return transport is not None and transport.ended.is_set()


def _logs_in_people(config: ServerConfig) -> bool:
    """Whether the server's `auth:` is a person's login (the authorization code grant), not a machine's."""
    return config.auth is not None and config.auth.grant == "authorization_code"


__all__ = ["Requests"]
