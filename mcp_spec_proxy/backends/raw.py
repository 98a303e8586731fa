"""Reads past the SDK client: requests the proxy writes to a stdio backend and reads back itself.

A read needs no more than its request written and its answer read: the SDK client's dispatcher,
its request and result models, spans and output-schema checks cost more than the backend's own
work for a small tool. `RawCalls` is that short path on a stdio backend's pipes, beside the SDK
client on the same pipes: its request ids are strings `msp-<n>`, which the SDK's integer ids
never equal, and the transport's reader hands a line to it only when it answers one of them
(anything else, a server's own request with such an id included, goes to the SDK as before).

`tool_result` is the least a result must be to be one; the front decides what goes out as it came.
The proxy runs on asyncio (uvloop where installed): waits are asyncio futures, which are cheaper
than anyio's events and honour anyio's cancel scopes like any other await.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY, methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from mcp_spec_proxy.wire_types import RpcNotification, RpcRequest

PREFIX = "msp-"
_PREFIX_BYTES = PREFIX.encode()
_CANCEL_TIMEOUT = 1.0

Send = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class Oversized:
    """The transport's own word that an answer's line was over its bound and was skipped.

    It travels as a Python object, never as JSON: in the `data` of the error the transport hands
    the SDK client, and as the answer of a raw request. A backend can send any error it likes,
    but only bytes, so it cannot make one of these; an error that carries one is the proxy's own.
    """

    size: int
    bound: int


class WireResult(TypedDict, total=False):
    """A `tools/call` result as JSON: what a read carries from a backend to a front, unmodelled."""

    content: list[Any]  # the blocks as the backend sent them (each a JSON object)
    isError: bool
    structuredContent: dict[str, Any]
    _meta: dict[str, Any]
    resultType: str


Answer = dict[str, Any] | Oversized | None
"""A raw request's answer: the message, the transport's `Oversized`, or None (the stream ended)."""


class RawCalls:
    """JSON-RPC requests written to a backend's stdin and answered from its stdout, by id."""

    def __init__(self) -> None:
        self._send: Send | None = None
        self._pending: dict[str, asyncio.Future[Answer]] = {}
        self._count = 0

    @property
    def open(self) -> bool:
        return self._send is not None

    def attach(self, send: Send) -> None:
        """The transport is up: `send` writes one encoded line (batched with whatever else waits)."""
        self._send = send

    def detach(self) -> None:
        """The transport ended: every request still waiting learns so (its answer is None)."""
        self._send = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_result(None)

    async def request(self, message: RpcRequest) -> Answer:
        """Send `message` (a request; its id is set here) and return the answer, `Oversized` when
        the transport skipped it for its size, or None when the backend's stream ended first.
        Cancelled while waiting (a timeout, a client that left), the backend is told with
        `notifications/cancelled`."""
        send = self._send
        if send is None:
            return None
        self._count += 1
        key = f"{PREFIX}{self._count}"
        message["id"] = key
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            await send(encode(message))
            return await future
        except BaseException:
            if self._pending.pop(key, None) is not None and self._send is not None:
                await self._cancel(key)
            raise
        finally:
            self._pending.pop(key, None)

    def answer(self, line: bytes) -> bool:
        """Take `line` if it answers one of our requests; False leaves it to the SDK client."""
        if not self._pending or _PREFIX_BYTES not in line:
            return False
        try:
            data = decode(line)
        except (ValueError, RecursionError):
            return False  # the SDK's parser makes of it what it always has
        if not isinstance(data, dict) or "method" in data:
            return False  # a server's own request or notification, whatever its id
        key = data.get("id")
        future = self._pending.pop(key, None) if isinstance(key, str) else None
        if future is None:
            return False
        if not future.done():
            future.set_result(data)
        return True

    def refuse(self, key: int | str, oversized: Oversized) -> bool:
        """Answer our request `key` with `oversized` (its line was skipped); False if it is not ours."""
        future = self._pending.pop(key, None) if isinstance(key, str) else None
        if future is None:
            return False
        if not future.done():
            future.set_result(oversized)
        return True

    async def _cancel(self, key: str) -> None:
        send = self._send
        if send is None:
            return
        notice: RpcNotification = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": key}}
        # A backend that is gone has nothing left to cancel.
        with (
            anyio.move_on_after(_CANCEL_TIMEOUT, shield=True),
            suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError),
        ):
            await send(encode(notice))


def decode(line: bytes | str) -> Any:
    """`line` as JSON. What Python's parser reads but JSON cannot carry (`NaN`, `Infinity`, a
    number past a float's range) is None, as the SDK writes such a number back out: nothing the
    proxy passes on from a backend carries it to a client."""

    def number(text: str) -> float | None:
        value = float(text)
        return value if math.isfinite(value) else None

    return json.loads(line, parse_constant=_null, parse_float=number)


def _null(text: str) -> None:
    return None


def encode(message: Mapping[str, Any]) -> bytes:
    """One JSON line; ASCII-escaped, so no argument (a lone surrogate included) can fail to encode.
    A float JSON cannot carry (NaN, an infinity: Python's parser reads them from a client) is
    written null, as the SDK writes it."""
    try:
        return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"
    except ValueError:
        return json.dumps(_finite(message), separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def tool_result(result: Any, version: str) -> WireResult | None:
    """`result` if it is a finished tool result, else None: what the SDK client takes for one on
    a connection of that `version`, so both paths of a read agree on what is a result.

    The plain shape passes unchecked (the front passes it as it is, `fronts/fast_read.py`);
    any other is checked as the SDK client checks it: against its era's surface, then its
    result model, and is what that model holds (as the SDK client's path gives it). A
    2026-07-28 backend's result that asks for input (`resultType: input_required`), or names
    any other kind, is None: a proxied read has no one to ask. A handshake-era backend's
    `resultType` is a key of no meaning in its era, which the SDK client does not read either.
    """
    if not isinstance(result, dict) or not isinstance(result.get("content"), list):
        return None
    modern = version in MODERN_PROTOCOL_VERSIONS
    if modern and result.get("resultType", "complete") != "complete":
        return None
    if plain(result):
        return cast(WireResult, result)
    try:
        methods.validate_server_result("tools/call", version, result)
        # As the SDK client drops a later era's keys before its model reads the result.
        model = types.CallToolResult.model_validate(result if modern else _without(result, "resultType"))
    except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    # What the model made of it (`"false"` is False), as the SDK client's path hands it on: the
    # step a reviewer reads and the answer a client gets then say the same on either path.
    return cast(WireResult, model.model_dump(by_alias=True, mode="json", exclude_none=True))


def _without(result: dict[str, Any], key: str) -> dict[str, Any]:
    return {name: value for name, value in result.items() if name != key}


_RESULT_KEYS = frozenset({"content", "isError", "structuredContent", "_meta", "resultType"})
_TEXT_BLOCK = frozenset({"type", "text"})


def plain(result: Mapping[str, Any]) -> bool:
    """The shape that goes out as it came: what the SDK's sieve would pass unchanged."""
    content = result["content"]
    return (
        result.keys() <= _RESULT_KEYS
        and isinstance(content, list)
        and all(
            isinstance(block, dict)
            and block.keys() == _TEXT_BLOCK
            and block["type"] == "text"
            and isinstance(block["text"], str)
            for block in content
        )
        and isinstance(result.get("isError", False), bool)
        and isinstance(result.get("structuredContent", {}), dict)
        and isinstance(result.get("_meta", {}), dict)
    )


def json_size(result: Mapping[str, Any]) -> int:
    """Roughly how many bytes a wire result carries, as `connection.result_size` counts a model."""
    size = 0
    for block in result.get("content") or ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            size += len(str(block.get("text", "")))
        elif kind in ("image", "audio"):
            size += len(str(block.get("data", "")))
        elif kind == "resource":
            resource = block.get("resource")
            resource = resource if isinstance(resource, dict) else {}
            size += len(str(resource.get("text") or resource.get("blob") or ""))
    structured = result.get("structuredContent")
    if structured is not None:
        size += len(str(structured))
    return size


def result_size(result: types.CallToolResult) -> int:
    """Roughly how many bytes a result carries: its text, binary payloads and structured content."""
    size = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            size += len(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            size += len(block.data)
        elif isinstance(block, types.EmbeddedResource):
            resource = block.resource
            size += len(getattr(resource, "text", "") or getattr(resource, "blob", "") or "")
    if result.structured_content is not None:
        size += len(str(result.structured_content))
    return size


ENVELOPE = frozenset({PROTOCOL_VERSION_META_KEY, CLIENT_INFO_META_KEY, CLIENT_CAPABILITIES_META_KEY})


def without_envelope(meta: Any) -> Any:
    """A client's `_meta` without its 2026-07-28 envelope, which describes that client's connection
    to the proxy: the proxy's own connection to the backend carries its own (or, on the
    handshake era, none, and a handshake-era server refuses a request that has one)."""
    if not meta:
        return meta
    items = meta.items() if isinstance(meta, dict) else meta.model_dump(by_alias=True, exclude_none=True).items()
    kept = {key: value for key, value in items if key not in ENVELOPE}
    return kept or None


def asks_for_input(answer: dict[str, Any]) -> bool:
    result = answer.get("result")
    return isinstance(result, dict) and result.get("resultType") == "input_required"


def amount(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size} bytes"


def remote_error(error: Any) -> MCPError | None:
    """A JSON-RPC `error` member as the backend sent it (code, message, data), or None when it
    is not one (no integer code, no string message)."""
    if not isinstance(error, dict):
        return None
    code, message = error.get("code"), error.get("message")
    if not isinstance(code, int) or isinstance(code, bool) or not isinstance(message, str):
        return None
    return MCPError(code, message, error.get("data"))


__all__ = [
    "PREFIX",
    "Answer",
    "Oversized",
    "RawCalls",
    "WireResult",
    "amount",
    "asks_for_input",
    "decode",
    "encode",
    "json_size",
    "plain",
    "remote_error",
    "result_size",
    "tool_result",
    "without_envelope",
]
