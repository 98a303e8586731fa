"""One supervised connection to one wrapped MCP server.

`Backend.run()` connects — in the handshake era (`protocol: legacy`, the default: a server's own
requests to the client, which the proxy relays, need its back-channel, and so do servers written
for it), or in 2026-07-28 where the server offers it (`protocol: auto`, and a server that refuses
the handshake) — lists its tools, prompts and resources, publishes them
through `on_listing`, and then waits for the connection to end. When it ends (the process exited,
the HTTP session died) calls in flight fail with `BackendClosed` and it reconnects (a stdio server
is started again): its listing stays published meanwhile, and a call that arrives waits for the
new connection on its own clock, so a reconnect is no window of "unknown tool". When an attempt
fails (it would not start, refused the handshake, timed out) the listing is withdrawn and it
tries again with exponential backoff. A backend never raises into its siblings: every failure is
logged with the fix and turned into "unavailable". A streamable HTTP request whose own connection
was lost fails alone, and the session goes on (`backends/http.py`).

Errors: a backend's own JSON-RPC error is raised as the `MCPError` it sent, whatever its code
(a backend may well answer -32000 or -32001 itself). Only what the proxy observed becomes its
own `BackendError`: its own clock running out (`anyio.fail_after` around the call — the SDK's
read timeout is not used, since it reports with the same code a backend may send), the
transport really ending or one HTTP request's connection lost (`http.GuardedClient`'s mark), the
transport's size bound (`raw.Oversized`): marks no backend can send.

Shutdown contract: cancelling `run()` closes the client, which closes the child's stdin, waits,
terminates and kills its process tree, all bounded and shielded inside the SDK's stdio
transport, so no child outlives the proxy.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, TextIO, cast

import anyio
import mcp_types as types
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.subscriptions import ListenNotSupportedError, Subscription, SubscriptionLost
from mcp.server.lowlevel import Server
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import ResourceUpdated
from mcp_types import (
    CONNECTION_CLOSED,
    LOG_LEVEL_META_KEY,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from mcp_spec_proxy.backends.http import Lost
from mcp_spec_proxy.backends.listing import Listing, OnListing, list_all
from mcp_spec_proxy.backends.notices import LogMessage, LogRoute, OnNotice, ResourceUpdate, admits, request_logs
from mcp_spec_proxy.backends.raw import (
    Oversized,
    RawCalls,
    amount,
    asks_for_input,
    json_size,
    remote_error,
    result_size,
    tool_result,
    without_envelope,
)
from mcp_spec_proxy.backends.relay import Relay
from mcp_spec_proxy.backends.transports import WatchedTransport, open_transport
from mcp_spec_proxy.config import ServerConfig
from mcp_spec_proxy.errors import (
    BackendClosed,
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ResultTooLarge,
)
from mcp_spec_proxy.sdk import stamp_request
from mcp_spec_proxy.stderr_log import StderrLog

logger = logging.getLogger(__name__)

BACKOFF_START = 0.5
REFRESH_INTERVAL_S = 0.25
BACKOFF_MAX = 30.0
BACKOFF_MAX_UNCHANGED = 300.0
"""The retry interval's cap once attempts keep failing the same way (a command that does not
exist): such a backend is retried every few minutes, not every 30 s for ever."""


class Backend:
    """A wrapped server, kept connected. Build with `Backend(name, config, ...)`, then `run()`."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        on_listing: OnListing,
        *,
        log_dir: Path | None = None,
        in_process: Server[Any] | None = None,
        on_notice: OnNotice | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._on_listing = on_listing
        self._log_dir = log_dir
        self._in_process = in_process  # the in-memory twin: tests hand a Server instead of a command
        self._no_handshake = False  # it refused `initialize`: reached in the 2026-07-28 era from then on
        self.relay = Relay(name, config.relay.kinds())  # its requests to the client, to the calling client
        self._client: Client | None = None
        self._raw: RawCalls | None = None  # the fast path's channel while a stdio connection is up
        self._transport: WatchedTransport | None = None  # the current connection's, when not in-process
        self._wake = anyio.Event()  # set by a list_changed notification or the end of the stream
        self.connected = anyio.Event()
        self.first_attempt = anyio.Event()  # set once the first connect has succeeded or failed
        self.status = "starting"  # then "connected", "reconnecting" (it was, and will be) or "unavailable"
        self._back = anyio.Event()  # set when a reconnect settles: connected again, or the attempt failed
        self._served = False  # whether the current attempt connected (its end is then no failed attempt)
        self.last_error: str | None = None
        self.restarts = 0
        self._exit_code: int | None = None  # of the last stdio process, once it has ended
        self._log_start = 0  # where the current attempt's stderr begins in its log file
        self._on_notice = on_notice
        # Kept across reconnects and applied to each new connection: the clients' last
        # logging/setLevel, and the URIs clients are subscribed to here.
        self.log_level: types.LoggingLevel | None = None
        self._watched: set[str] = set()
        self._rewatch = anyio.Event()  # set when `_watched` changes: a 2026-07-28 listen stream reopens
        self._heard: frozenset[str] = frozenset()  # the URIs the open listen stream's ack honoured
        self._heard_changed = anyio.Event()
        self._routes: set[LogRoute] = set()  # 2026-07-28 requests in flight here that opted in to logs

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What the connected server declared; None while it is not connected."""
        return self._client.server_capabilities if self._client is not None else None

    @property
    def instructions(self) -> str | None:
        """The connected server's own `instructions` (initialize or server/discover result)."""
        return self._client.instructions if self._client is not None else None

    @property
    def subscribable(self) -> bool:
        caps = self.capabilities
        return bool(caps is not None and caps.resources is not None and caps.resources.subscribe)

    # -- calls -------------------------------------------------------------------------------

    @property
    def client(self) -> Client:
        """The live connection, for a look at it (requests go out through `_live`)."""
        if self._client is None:
            raise BackendUnavailable(self.name, f"is unavailable ({self.last_error or self.status})")
        return self._client

    async def _live(self, what: str, deadline: float) -> Client:
        """The connection a request goes out on. One that arrives while a lost connection is being
        made again waits for it until `deadline` (its tools stay listed meanwhile): nothing is sent
        to a backend that is not connected."""
        with anyio.CancelScope(deadline=deadline):
            while self._client is None and self.status == "reconnecting":
                await self._back.wait()
        if self._client is not None:
            return self._client
        if self.status == "reconnecting":
            raise BackendUnavailable(
                self.name, f"is reconnecting and was not back within {self.config.timeout:g}s; {what} was not sent"
            )
        raise BackendUnavailable(self.name, f"is unavailable ({self.last_error or self.status})")

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
        client = await self._live(what, deadline)
        route = request_logs.get()
        try:
            # The proxy's clock, not the SDK's: the SDK reports its own timeout with the code a
            # backend may send too (-32001), and only a timeout measured here is the proxy's to name.
            with self._clock(deadline) as clock, self.relay.calling(clock), self._routed(route):
                result = await client.call_tool(
                    tool, arguments, progress_callback=progress, meta=self._log_meta(client, route)
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

    async def call_tool_json(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A read's result as wire JSON, for the fast path: written and read past the SDK client
        where the transport allows (`backends/raw.py`), through it elsewhere. Same timeout, size
        bound and errors as `call_tool`; a result of another shape is the backend's error."""
        what = f"tools/call {tool}"
        deadline = self._deadline()
        client = await self._live(what, deadline)
        raw = self._raw
        if raw is None or not raw.open or request_logs.get() is not None:  # a log route needs the SDK's path
            dumped: dict[str, Any] = (await self.call_tool(tool, arguments)).model_dump(
                by_alias=True, mode="json", exclude_none=True
            )
            return dumped
        modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
        request: dict[str, Any] = {"method": "tools/call", "params": {"name": tool, "arguments": arguments}}
        stamp_request(client, request)
        if (log_meta := self._log_meta(client, None)) is not None:
            request["params"]["_meta"] = {**request["params"].get("_meta", {}), **dict(log_meta)}
        request["jsonrpc"] = "2.0"
        try:
            with self._clock(deadline) as clock, self.relay.calling(clock):
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
    ) -> dict[str, Any]:
        """The raw path's call that came back `input_required`: its questions relayed, then the
        call resumed through the SDK client (which relays any further rounds itself)."""
        try:
            asked = types.InputRequiredResult.model_validate(answer["result"])
        except ValidationError:
            raise BackendError(self.name, f"answered tools/call {tool} with a malformed input_required") from None
        responses: dict[str, Any] = {}
        for key, request in (asked.input_requests or {}).items():
            context = ClientRequestContext(session=client.session, request_id=key, meta=None)
            response = await client.session.dispatch_input_request(context, request)
            if isinstance(response, types.ErrorData):
                raise MCPError.from_error_data(response)
            responses[key] = response
        try:
            result = await client.call_tool(
                tool, arguments, input_responses=responses, request_state=asked.request_state
            )
        except MCPError as exc:
            raise self._translate(exc, f"tools/call {tool}", client) from exc
        dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
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
        if lost.kind == "dropped":
            ran = ", so it may have run; the proxy did not send it again" if what.startswith("tools/call") else ""
            return BackendClosed(
                self.name, f"lost the HTTP connection carrying {what} before answering ({lost.detail}){ran}"
            )
        # No connection could be made: the server may be down or restarted, its session with it.
        if self._client is client and self._transport is not None:
            self._transport.ended.set()
        return BackendUnavailable(
            self.name, f"could not be reached ({lost.detail}); {what} was not sent, and the proxy reconnects"
        )

    async def get_prompt(self, name: str, arguments: dict[str, str] | None) -> types.GetPromptResult:
        what = f"prompts/get {name}"
        deadline = self._deadline()
        client = await self._live(what, deadline)
        try:
            with self._clock(deadline) as clock, self.relay.calling(clock):
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
            with self._clock(deadline) as clock, self.relay.calling(clock):
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
            with self._clock(deadline) as clock, self.relay.calling(clock):
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

    async def subscribe(self, uri: str) -> None:
        """Hear of changes to `uri` from now on (and after every reconnect) until `unsubscribe`."""
        self._watched.add(uri)
        client = self._client
        if client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._rewatch.set()
            # Subscribed once the reopened stream's ack names the URI: an update right after this
            # returns is heard.
            with anyio.move_on_after(self.config.timeout):
                while uri not in self._heard:
                    await self._heard_changed.wait()
        elif client is not None:
            try:
                with self.relay.calling():  # no client waits on it: a question it causes asks nobody
                    await client.session.send_request(
                        types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult
                    )
            except MCPError as exc:
                self._watched.discard(uri)
                raise self._translate(exc, f"resources/subscribe {uri}", client) from exc

    async def unsubscribe(self, uri: str) -> None:
        self._watched.discard(uri)
        client = self._client
        if client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS:
            self._rewatch.set()
        elif client is not None:
            try:
                with self.relay.calling():
                    await client.session.send_request(
                        types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri)), types.EmptyResult
                    )
            except MCPError as exc:
                raise self._translate(exc, f"resources/unsubscribe {uri}", client) from exc

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
        else the level the handshake-era clients set; None for a handshake-era server (its
        `logging/setLevel` governs) or when nobody asked for logs."""
        level = route.level if route is not None else self.log_level
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
        guard = self._transport.guard if self._transport is not None and self._client is client else None
        if guard is not None and (lost := guard.claim(exc.data)) is not None:
            return self._lost(lost, what, client)
        if exc.code == CONNECTION_CLOSED and self._ended(client):
            return self._closed(what)
        return exc

    def _ended(self, client: Client) -> bool:
        """Whether `client`'s connection is really over (its transport ended, or it is no longer
        the connection): a backend that merely answers -32000 is still connected."""
        transport = self._transport
        if self._client is not client:
            return True
        return transport is not None and transport.ended.is_set()

    # -- supervision -------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the backend connected until cancelled."""
        failures = 0
        told: str | None = None  # the failure last logged as a warning: a repeat is not logged again
        while True:
            self._served = False
            unchanged = False
            try:
                await self._session()
            except Exception as exc:  # boundary: any failure of one backend stays with that backend
                if self._served:  # it ran and its connection ended: its listing stays, calls wait
                    self.last_error = self._explain(exc)
                    logger.warning("%s — reconnecting; calls wait for it", self.last_error)
                else:
                    message = self._explain(exc)
                    unchanged = message == told
                    self._down(message, quiet=unchanged)
                    told = message
                    await self._on_listing(self.name, None)
            if self._served:
                failures = 0  # it ran; a later crash starts the backoff afresh
                told = None
            cap = BACKOFF_MAX_UNCHANGED if unchanged else BACKOFF_MAX
            delay = min(cap, BACKOFF_START * math.pow(2, failures))
            failures = min(failures + 1, 64)  # past the cap anyway; 2.0 ** 1024 overflows a float
            self.restarts += 1
            logger.info("backend %r: reconnecting in %.1fs", self.name, delay)
            await anyio.sleep(delay)

    def request_refresh(self) -> None:
        self._wake.set()

    async def _session(self) -> None:
        # The handshake's deadline lives on a scope around the whole connection (lifted once
        # connected), because the client's own task groups must nest inside it.
        with anyio.CancelScope(deadline=anyio.current_time() + self.config.startup_timeout) as startup:
            async with AsyncExitStack() as stack:
                transport: WatchedTransport | None = None
                if self._in_process is not None:
                    target: Any = self._in_process
                else:
                    errlog = self._errlog(stack)
                    self._exit_code = None
                    transport = open_transport(
                        self.name, self.config, errlog, on_end=lambda: self._wake.set(), on_exit=self._exited
                    )
                    target = transport
                mode = "auto" if self._no_handshake else self.config.protocol
                client = Client(target, mode=mode, message_handler=self._on_message, **self.relay.callbacks())
                try:
                    await stack.enter_async_context(client)
                except MCPError as exc:
                    if mode != "legacy" or exc.code == CONNECTION_CLOSED:
                        raise
                    # A server with no initialize handshake (2026-07-28 only) is reached in its era.
                    self._no_handshake = True
                    raise BackendError(
                        self.name, f"refused the initialize handshake ({exc}); reconnecting in the 2026-07-28 era"
                    ) from None
                listing = await list_all(client)
                startup.deadline = math.inf
                await self._serve(client, transport, listing)
        if startup.cancelled_caught:
            raise BackendError(
                self.name,
                f"did not finish its handshake within {self.config.startup_timeout:g}s"
                f" — check that it starts by hand, or raise `startup_timeout`{self._log_hint()}",
            )

    async def _serve(self, client: Client, transport: WatchedTransport | None, listing: Listing) -> None:
        """Publish the listing, then keep it fresh until the connection ends; the listing outlives
        it (`run` withdraws it when an attempt to connect again fails)."""
        self._served = True
        self._client = client
        self._transport = transport
        self._raw = transport.raw if transport is not None else None
        self.status = "connected"
        self.last_error = None
        self.connected.set()
        self.first_attempt.set()
        logger.info(
            "backend %r connected (%s, protocol %s, %d tools)",
            self.name,
            self.config.transport,
            client.protocol_version,
            len(listing.tools),
        )
        try:
            await self._on_listing(self.name, listing)
            await self._restore(client)
            self._back.set()  # calls that waited for this connection go out on it
            async with anyio.create_task_group() as tg:
                if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                    tg.start_soon(self._listen, client)
                last_refresh = -math.inf
                while True:
                    await self._wake.wait()
                    if transport is not None and transport.ended.is_set():
                        raise BackendError(self.name, f"exited or closed its connection{self._log_hint()}")
                    # A flood of list_changed notifications becomes at most a few refreshes a second.
                    pause = last_refresh + REFRESH_INTERVAL_S - anyio.current_time()
                    if pause > 0:
                        with anyio.move_on_after(pause):
                            await (transport.ended.wait() if transport is not None else anyio.sleep_forever())
                    self._wake = anyio.Event()
                    if transport is not None and transport.ended.is_set():
                        raise BackendError(self.name, f"exited or closed its connection{self._log_hint()}")
                    last_refresh = anyio.current_time()
                    with anyio.fail_after(self.config.timeout):
                        listing = await list_all(client, refresh=True)
                    await self._on_listing(self.name, listing)
        finally:
            self._client = None
            self._transport = None
            self._raw = None
            self.connected = anyio.Event()
            self.status = "reconnecting"
            self._back = anyio.Event()

    async def _restore(self, client: Client) -> None:
        """Give a fresh connection the log level and the handshake-era subscriptions the clients
        asked for before it (a 2026-07-28 server's subscriptions ride `_listen`'s stream)."""
        try:
            await self._apply_level(client)
            if client.protocol_version not in MODERN_PROTOCOL_VERSIONS and self.subscribable:
                for uri in sorted(self._watched):
                    await client.session.send_request(
                        types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult
                    )
        except MCPError as exc:
            logger.warning("backend %r: could not restore its log level or subscriptions: %s", self.name, exc)

    async def _listen(self, client: Client) -> None:
        """2026-07-28 servers announce list changes and resource updates on a listen stream
        instead of notifications: one stream, reopened whenever the watched URIs change."""
        lists = _announces_changes(client)
        while True:
            rewatch = self._rewatch = anyio.Event()
            uris = sorted(self._watched) if self.subscribable else []
            if not lists and not uris:
                await rewatch.wait()
                continue
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_cancel_on, rewatch, tg.cancel_scope)
                    async with client.listen(
                        tools_list_changed=lists,
                        prompts_list_changed=lists,
                        resources_list_changed=lists,
                        resource_subscriptions=uris,
                    ) as subscription:
                        self._heard = frozenset(subscription.honored.resource_subscriptions or ())
                        self._heard_changed.set()
                        self._heard_changed = anyio.Event()
                        await self._hear(subscription)
                    tg.cancel_scope.cancel()
            except (MCPError, SubscriptionLost, ListenNotSupportedError, TimeoutError) as exc:
                logger.info("backend %r: no change subscription (%s); its lists refresh on reconnect", self.name, exc)
            if not rewatch.is_set():
                await rewatch.wait()  # the stream ended by itself: reopen only when there is something new

    async def _hear(self, subscription: Subscription) -> None:
        async for event in subscription:
            if not isinstance(event, ResourceUpdated):  # updates arrive as notifications too (`_on_message`)
                self._wake.set()

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(
            message,
            types.ToolListChangedNotification
            | types.PromptListChangedNotification
            | types.ResourceListChangedNotification,
        ):
            logger.info("backend %r: %s", self.name, message.method)
            self._wake.set()
        elif isinstance(message, types.LoggingMessageNotification):
            log = LogMessage(self.name, message.params)
            for route in list(self._routes):
                if admits(route.level, log.params.level):
                    await route.deliver(log)
            if self._on_notice is not None:
                await self._on_notice(log)
        elif isinstance(message, types.ResourceUpdatedNotification) and self._on_notice is not None:
            await self._on_notice(ResourceUpdate(self.name, message.params.uri))
        await anyio.lowlevel.checkpoint()

    def _explain(self, exc: BaseException) -> str:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]  # the SDK's task groups wrap the one failure that matters
        if isinstance(exc, BackendError):
            return str(exc)
        if isinstance(exc, OSError):
            return f"backend '{self.name}' failed to start: {exc.strerror or exc}{self._log_hint()}"
        if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED and self._exit_code is not None:
            # The process ended during the handshake: say how, not "refused".
            how = f"with code {self._exit_code}" if self._exit_code >= 0 else f"on signal {-self._exit_code}"
            said = self._last_stderr_line()
            said = f"; its {said}" if said else ""
            return f"backend '{self.name}' exited {how} during startup{said}{self._log_hint()}"
        if isinstance(exc, MCPError):
            return f"backend '{self.name}' refused the connection: {exc}{self._log_hint()}"
        return f"backend '{self.name}' failed: {type(exc).__name__}: {exc}{self._log_hint()}"

    def _down(self, message: str, *, quiet: bool = False) -> None:
        self.first_attempt.set()
        self.status = "unavailable"
        self._back.set()  # calls that waited for a reconnect learn it failed
        if self.config.hint:
            message = f"{message} — {self.config.hint}"
        self.last_error = message
        if quiet:  # said already: the same failure again
            logger.debug("%s (again)", message)
            return
        logger.warning(
            "%s — its tools are unavailable until it connects; retrying in the background, less and less often"
            " (up to every %.0f min), and saying so again only if the failure changes",
            message,
            BACKOFF_MAX_UNCHANGED / 60,
        )

    def _errlog(self, stack: AsyncExitStack) -> TextIO:
        if self._log_dir is None:
            return sys.stderr
        self._log_dir.mkdir(parents=True, exist_ok=True)
        path = self._log_dir / f"{self.name}.log"
        self._log_start = path.stat().st_size if path.exists() else 0
        handle = StderrLog(path)
        stack.push_async_callback(_close_stderr, handle)
        return handle

    def _exited(self, code: int | None) -> None:
        self._exit_code = code

    def _last_stderr_line(self) -> str:
        """What the current attempt's log says went wrong, named, cut to 200 characters: the
        exception line of its last Python traceback ("error: ..."), else its last non-blank line
        ("last stderr line: ...") — a traceback's last line can be the end of a long help text
        (GitPython's ends `export GIT_PYTHON_REFRESH=quiet`)."""
        if self._log_path is None:
            return ""
        try:
            with self._log_path.open("rb") as log:
                # A rotation since the attempt began (`stderr_log.py`) leaves a shorter file.
                log.seek(self._log_start if self._log_start <= self._log_path.stat().st_size else 0)
                tail = log.read()[-8192:]
        except OSError:
            return ""
        raw = tail.decode(errors="replace").splitlines()
        starts = [i for i, line in enumerate(raw) if line.startswith("Traceback (most recent call last):")]
        if starts:
            error = next((line for line in raw[starts[-1] + 1 :] if line.strip() and not line[0].isspace()), "")
            if error:
                return f"error: {error.strip()[:200]}"
        lines = [line.strip() for line in raw if line.strip()]
        return f"last stderr line: {lines[-1][:200]}" if lines else ""

    @property
    def _log_path(self) -> Path | None:
        return self._log_dir / f"{self.name}.log" if self._log_dir is not None else None

    def _log_hint(self) -> str:
        return f" (its stderr is in {self._log_path})" if self._log_path is not None else ""


async def _close_stderr(log: StderrLog) -> None:
    log.close()  # at once, cancelled or not: the pipe's write end must not outlive the attempt
    with anyio.CancelScope(shield=True):  # the attempt's last lines reach the file before it is read back
        await anyio.to_thread.run_sync(log.drain)


async def _cancel_on(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _announces_changes(client: Client) -> bool:
    caps = client.server_capabilities
    return client.protocol_version in MODERN_PROTOCOL_VERSIONS and any(
        cap is not None and cap.list_changed for cap in (caps.tools, caps.prompts, caps.resources)
    )
