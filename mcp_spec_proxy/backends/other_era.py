"""A backend's second session, in the era its first does not speak, where the server speaks both.

A handshake-era client reaches such a server in the handshake era and a 2026-07-28 client in
2026-07-28 (`backends/era.py`), each seeing what its era lists: the conformance suite's reference
server lists some tools on its 2026-07-28 path only. `OtherEra.run` opens the session once the
first is up (a URL backend, or an in-process twin), keeps it while the first lives, and hears the
list changes a 2026-07-28 session announces on its listen stream. A server that speaks one era,
or whose second session fails, is served by the first alone.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import mcp_types as types
from mcp.client.client import Client
from mcp.client.session import MessageHandlerFnT
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import PromptsListChanged, ResourcesListChanged, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.backends.era import era_of
from mcp_spec_proxy.backends.listing import Listing, list_all
from mcp_spec_proxy.backends.oauth import BackendAuth
from mcp_spec_proxy.backends.relay import Relay, as_declared
from mcp_spec_proxy.backends.transports import WatchedTransport, open_transport
from mcp_spec_proxy.config.schema import ServerConfig
from mcp_spec_proxy.sdk import restamp_capabilities

logger = logging.getLogger(__name__)

REOPEN_START_S = 1.0
REOPEN_MAX_S = 60.0
LIST_OF: dict[type, str] = {ToolsListChanged: "tools", PromptsListChanged: "prompts", ResourcesListChanged: "resources"}
"""The list each listen-stream event says changed."""


class OtherEra:
    """The second session of one backend; `client` and `listing` while it is up."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        in_process: Any,
        relay: Relay,
        on_message: MessageHandlerFnT,
        on_change: Callable[[str], None],
        auth: BackendAuth | None = None,
    ) -> None:
        self._name = name
        self._auth = auth  # the backend's OAuth client: this session carries its tokens too
        self._config = config
        self._in_process = in_process
        self._relay = relay
        self._on_message = on_message
        self._on_change = on_change  # a list ("tools", ...) the server announced changed
        self.client: Client | None = None
        self.transport: WatchedTransport | None = None
        self.listing: Listing | None = None
        # The URIs handshake-era clients subscribed to on this leg (`Requests.subscribe`): subscribed
        # again each time it opens.
        self.watched: set[str] = set()

    async def run(self, first: Client, settled: anyio.Event, republish: Callable[[], Awaitable[None]]) -> None:
        """Open and keep the session in the era `first` does not speak, opened again (after a
        growing pause) when one that was up ends; `settled` once the first attempt is up or will
        not be; `republish` when what it lists comes or goes."""
        pause = REOPEN_START_S
        while await self._once(first, settled, republish):
            logger.info("backend %r: its other era's session ended; opening it again in %.0fs", self._name, pause)
            await anyio.sleep(pause)
            pause = min(pause * 2, REOPEN_MAX_S)

    async def _once(self, first: Client, settled: anyio.Event, republish: Callable[[], Awaitable[None]]) -> bool:
        """One session in the other era; True when it was up and has ended."""
        mode = "legacy" if first.protocol_version in MODERN_PROTOCOL_VERSIONS else "auto"
        was_up = False
        try:
            # The deadline lives on a scope around the whole session (lifted once it is up),
            # because the client's own task groups nest inside it.
            with anyio.CancelScope(deadline=anyio.current_time() + self._config.startup_timeout) as startup:
                async with AsyncExitStack() as stack:
                    target: Any = self._in_process
                    transport: WatchedTransport | None = None
                    if target is None:
                        auth = self._auth.provider if self._auth is not None else None
                        transport = open_transport(self._name, self._config, sys.stderr, on_end=lambda: None, auth=auth)
                        target = transport
                    other = Client(target, mode=mode, message_handler=self._on_message, **self._relay.callbacks())
                    await stack.enter_async_context(other)
                    restamp_capabilities(other, as_declared)
                    if era_of(other.protocol_version) == era_of(first.protocol_version):
                        logger.debug("backend %r speaks one era (%s)", self._name, first.protocol_version)
                        return False
                    self.listing = await list_all(other)
                    await self._resubscribe(other)
                    startup.deadline = math.inf
                    self.client, self.transport = other, transport
                    logger.info("backend %r: a %s session beside the first", self._name, other.protocol_version)
                    settled.set()
                    was_up = True
                    try:
                        await republish()
                        await self._serve(other, transport)
                    finally:
                        self.client, self.transport, self.listing = None, None, None
                        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                            await republish()  # what only this session listed goes with it
            if startup.cancelled_caught:
                logger.info("backend %r: no %s session in time; the first serves every client", self._name, mode)
        except Exception as exc:  # boundary: the other era is a bonus; the first session serves every client
            logger.info("backend %r: no %s session (%s); the first serves every client", self._name, mode, exc)
        finally:
            settled.set()
        return was_up

    async def _resubscribe(self, client: Client) -> None:
        caps = client.server_capabilities
        if caps.resources is None or not caps.resources.subscribe:
            return
        for uri in sorted(self.watched):
            try:
                with self._relay.calling():
                    await client.session.send_request(
                        types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult
                    )
            except MCPError as exc:
                logger.warning("backend %r: could not restore the subscription to %s: %s", self._name, uri[:500], exc)

    async def relist(self) -> None:
        """List again (its server announced a change)."""
        if self.client is not None:
            self.listing = await list_all(self.client, refresh=True)

    async def _serve(self, client: Client, transport: WatchedTransport | None) -> None:
        async with anyio.create_task_group() as tg:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                tg.start_soon(self._hear_lists, client)  # that era announces changes on a listen stream
            await (transport.ended.wait() if transport is not None else anyio.sleep_forever())
            tg.cancel_scope.cancel()

    async def _hear_lists(self, client: Client) -> None:
        caps = client.server_capabilities
        if not any(cap is not None and cap.list_changed for cap in (caps.tools, caps.prompts, caps.resources)):
            return
        try:
            async with client.listen(
                tools_list_changed=True, prompts_list_changed=True, resources_list_changed=True
            ) as subscription:
                async for event in subscription:
                    if type(event) in LIST_OF:
                        self._on_change(LIST_OF[type(event)])
        except (MCPError, SubscriptionLost, ListenNotSupportedError, TimeoutError) as exc:
            logger.info(
                "backend %r: no change subscription on its %s session (%s)", self._name, client.protocol_version, exc
            )


__all__ = ["LIST_OF", "OtherEra"]
