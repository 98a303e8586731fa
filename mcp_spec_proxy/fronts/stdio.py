"""The MCP front over stdio: one client on this process's stdin and stdout, one session.

`serve_stdio(front)` serves until the client closes stdin. As the SDK's stdio server does, fd 0
and 1 point elsewhere while serving (`sdk.claimed_stdio`). Unlike it:

* the pipes are the event loop's own (asyncio pipe transports), not files read and written in
  worker threads: a message costs no thread hand-off either way; where stdin or stdout is not a
  pipe or socket (a regular file, a terminal, /dev/null), threads serve it (reads in a daemon
  thread a stop abandons, so Ctrl-C in a terminal does not wait for Enter);
* a client's read is taken off the wire before the SDK parses it (`_LeanReads`, the lean read
  path of `fast_read.py`) and answered from the line it came in, past the SDK's dispatcher;
* answers waiting together go out in one write;
* a line that is not a valid JSON-RPC message is answered (`malformed_answer`: -32700 or
  -32600, with the request's id where one can be read) instead of leaving the client to wait
  forever on that id; a line over `MAX_LINE_BYTES` is answered -32600 and skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, BinaryIO, Protocol, TypeGuard, cast

import anyio
import anyio.abc
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.message import SessionMessage
from mcp_types import INTERNAL_ERROR, INVALID_REQUEST, PARSE_ERROR, RequestId

from mcp_spec_proxy.backends.era import speaking
from mcp_spec_proxy.calls.access import viewing
from mcp_spec_proxy.calls.drain import Answering
from mcp_spec_proxy.fronts.fast_read import FastRead, Read
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.sdk import claimed_stdio
from mcp_spec_proxy.sessions.barrier import Session
from mcp_spec_proxy.wire_types import RpcError, RpcResponse

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest message a client may send on one line (and what the proxy buffers at most)."""


async def serve_stdio(front: McpFront, answering: Answering | None = None) -> None:
    """Serve one client on this process's stdin/stdout until it closes them. `answering` counts
    the client's requests from the line that brings one to the write of its answer (a stop waits
    for those: the result of a call that ran reaches its client)."""
    front.stdio_session = session = front.proxy.barrier.new_session()
    # The one client is nobody identified: every task of this front sees that view (`calls/access.py`),
    # whatever door it came by; each request sets it again, the same.
    with viewing(front.view_of(None)), claimed_stdio() as (wire_in, wire_out):
        async with _open_wire(wire_in, wire_out) as wire, front.suspensions.hosting():
            read_writer, read = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            write, write_reader = anyio.create_memory_object_stream[SessionMessage | bytes](0)
            lean = _LeanReads(front.fast_read, session, write, answering or Answering())
            async with anyio.create_task_group() as writing:
                writing.start_soon(_write_messages, wire, write_reader, lean)
                try:
                    async with anyio.create_task_group() as reads:
                        lean.tasks = reads
                        reads.start_soon(_read_messages, wire, read_writer, write, lean)
                        # The SDK's server sees a stream of its own messages; ours go beside them.
                        server_write = cast(MemoryObjectSendStream[SessionMessage], write.clone())
                        await front.server.run_live(read, server_write)  # initialize answered per client
                        # The reads still in flight answer before the writer ends.
                finally:
                    write.close()  # the writer sends what is queued, then ends


class _LeanReads:
    """Reads taken off the wire before the SDK parses anything (`fast_read.FastRead.claim`).

    A line is taken when it is a well-formed `tools/call` request the lean path claims: of the
    2026-07-28 era (its `_meta` envelope passes the SDK's own ladder), or of the handshake era
    once this session's `initialize` was answered. Every other line goes to the SDK as before.
    A taken read runs as its own task; `notifications/cancelled` naming it cancels it (the
    backend is told, and no answer is sent, as the SDK does).
    """

    def __init__(
        self,
        fast: FastRead,
        session: Session,
        answers: MemoryObjectSendStream[SessionMessage | bytes],
        answering: Answering,
    ) -> None:
        self._fast = fast
        self._session = session
        self._answers = answers
        self.answering = answering  # every request of the client's, this path's and the SDK's, until answered
        self.tasks: anyio.abc.TaskGroup | None = None  # where taken reads run, while the front serves
        self._initialize: RequestId | None = None  # the handshake's request id, until answered
        self.handshake: str | None = None  # the era negotiated, once `initialize` was answered
        self._inflight: dict[RequestId, anyio.CancelScope] = {}

    def take(self, line: bytes) -> bool:
        """True when the lean path took this line (its answer will follow)."""
        if self.tasks is None:
            return False
        if b'"tools/call"' not in line:
            if b'"initialize"' in line or b"notifications/cancelled" in line:
                self._observe(line)
            return False
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            return False
        if not isinstance(data, dict) or data.keys() != _REQUEST_KEYS or data["jsonrpc"] != "2.0":
            return False
        request_id, params = data["id"], data["params"]
        if data["method"] != "tools/call" or not _is_id(request_id) or request_id in self._inflight:
            return False
        if self.handshake is not None:
            version = self.handshake
        else:
            route = classify_inbound_request(data)
            if isinstance(route, InboundLadderRejection):
                return False
            version = route.protocol_version
        with speaking(version), viewing(self._fast.front.view_of(None)):  # stdio identifies nobody
            read = self._fast.claim(params, version, initialized=True)
        if read is None:
            return False
        scope = anyio.CancelScope()
        self._inflight[request_id] = scope
        self.answering.begin((_LEAN, request_id))
        self.tasks.start_soon(self._answer, request_id, read, scope)
        return True

    def answered(self, message: SessionMessage) -> None:
        """The writer's view: the SDK answered `initialize`, so the handshake era is settled."""
        if self._initialize is None:
            return
        sent = message.message
        if isinstance(sent, types.JSONRPCResponse) and sent.id == self._initialize:
            version = sent.result.get("protocolVersion")
            self.handshake = version if isinstance(version, str) else None
            self._initialize = None

    def _observe(self, line: bytes) -> None:
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            return
        if not isinstance(data, dict):
            return
        if data.get("method") == "initialize" and _is_id(data.get("id")) and self.handshake is None:
            self._initialize = data["id"]
        elif data.get("method") == "notifications/cancelled":
            params = data.get("params")
            request_id = params.get("requestId") if isinstance(params, dict) else None
            scope = self._inflight.get(request_id) if _is_id(request_id) else None
            if scope is not None:
                scope.cancel()

    async def _answer(self, request_id: RequestId, read: Read, scope: anyio.CancelScope) -> None:
        answer: RpcResponse | None = None
        try:
            with scope:
                try:
                    with (
                        speaking(read.version),
                        viewing(self._fast.front.view_of(None)),
                        self._fast.front.calling(self._session, None),
                    ):
                        result = await self._fast.run(read, self._session)
                    answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
                except MCPError as exc:  # the backend's own error as it sent it, or the proxy's own
                    # The SDK's `ErrorData` as JSON: its code, message and (if set) data.
                    error = cast(RpcError, exc.error.model_dump(by_alias=True, mode="json", exclude_unset=True))
                    answer = {"jsonrpc": "2.0", "id": request_id, "error": error}
                except Exception:  # boundary: a fault of ours is this call's error, never the front's end
                    logger.exception("lean read of %s failed", read.tool.name)
                    error = {"code": INTERNAL_ERROR, "message": "internal error"}
                    answer = {"jsonrpc": "2.0", "id": request_id, "error": error}
        finally:
            self._inflight.pop(request_id, None)
        try:
            if answer is not None:
                with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                    # Once the writer took it, it writes it without waiting on anything else.
                    await self._answers.send(json.dumps(answer, separators=(",", ":")).encode() + b"\n")
        finally:
            self.answering.end((_LEAN, request_id))


_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_LEAN = "lean"  # a lean read's request, apart from the SDK's requests (keyed by their bare ids)


def _is_id(value: Any) -> TypeGuard[RequestId]:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


class _Wire(Protocol):
    async def readline(self) -> bytes: ...  # b"" at the end
    async def write(self, data: bytes) -> None: ...


class _LoopWire:
    """stdin and stdout as asyncio pipe transports."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def readline(self) -> bytes:
        try:
            return await self._reader.readline()
        except ValueError:  # over the limit: the reader dropped what it had of the line
            return _TOO_LONG

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()


class _ThreadWire:
    """stdin and stdout as files read and written in worker threads (a regular file, say)."""

    def __init__(self, wire_in: BinaryIO, wire_out: BinaryIO) -> None:
        self._in = wire_in
        self._out = wire_out

    async def readline(self) -> bytes:
        line = await _in_daemon(self._in.readline, MAX_LINE_BYTES + 1)
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := await _in_daemon(self._in.readline, MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            return _TOO_LONG
        return line

    async def write(self, data: bytes) -> None:
        await anyio.to_thread.run_sync(self._write, data)

    def _write(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()


async def _in_daemon(read: Callable[[int], bytes], size: int) -> bytes:
    """`read(size)` in a daemon thread of its own, abandoned when the caller is cancelled.

    A read of a terminal returns only at Enter: in a worker thread, which a stop waits for and
    the interpreter joins at exit, Ctrl-C would leave the proxy waiting for a key press. An
    abandoned daemon thread holds neither the stop nor the exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[bytes] = loop.create_future()

    def settle(line: bytes | None, error: BaseException | None) -> None:
        if future.done():
            return  # the caller was cancelled: nobody reads this line
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(line or b"")

    def run() -> None:
        try:
            line, error = read(size), None
        except BaseException as exc:  # handed to the caller, who handles it as before
            line, error = None, exc
        with suppress(RuntimeError):  # the loop closed while this read waited: the process is ending
            loop.call_soon_threadsafe(settle, line, error)

    threading.Thread(target=run, name="mcp-spec-proxy stdin", daemon=True).start()
    return await future


_TOO_LONG = b"\0too long\n"  # never a line of JSON: stands for one that was skipped


@asynccontextmanager
async def _open_wire(wire_in: BinaryIO, wire_out: BinaryIO) -> AsyncIterator[_Wire]:
    if wire_in is sys.stdin.buffer or wire_out is sys.stdout.buffer or not (_pipe(wire_in) and _pipe(wire_out)):
        # Not our own duplicates (the transports would close them), or not a pipe or socket, which
        # pipe transports cannot always serve (uvloop aborts the process on one instead of refusing it).
        yield _ThreadWire(wire_in, wire_out)
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES, loop=loop)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), wire_in)
    try:
        write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, wire_out)
    except BaseException:
        read_transport.close()
        _blocking(wire_in)
        raise
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    try:
        yield _LoopWire(reader, writer)
    finally:
        read_transport.close()
        write_transport.close()  # what is still buffered is written first
        _blocking(wire_in, wire_out)


def _pipe(file: BinaryIO) -> bool:
    """Whether `file` is a pipe or a socket: what the loop's pipe transports serve for certain
    (a regular file or a device like /dev/null they cannot poll, and uvloop aborts on one)."""
    try:
        mode = os.fstat(file.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _blocking(*files: BinaryIO) -> None:
    """Give the descriptors back in blocking mode (the pipe transports made them non-blocking)."""
    for file in files:
        with suppress(OSError, ValueError):
            os.set_blocking(file.fileno(), True)


async def _read_messages(
    wire: _Wire,
    messages: MemoryObjectSendStream[SessionMessage | Exception],
    answers: MemoryObjectSendStream[SessionMessage | bytes],
    lean: _LeanReads,
) -> None:
    async with messages:
        while line := await wire.readline():
            if lean.take(line):
                continue
            if line is _TOO_LONG:
                too_long = _invalid(None, f"Invalid Request: a message over {MAX_LINE_BYTES} bytes")
                await answers.send(SessionMessage(too_long))
                continue
            text = line.decode("utf-8", "replace")
            try:
                message = types.jsonrpc_message_adapter.validate_json(text, by_name=False)
            except Exception:  # boundary: whatever the client sent, it gets an answer, not a crash
                error = malformed_answer(text)
                if error is not None:
                    await answers.send(SessionMessage(error))
                continue
            if isinstance(message, types.JSONRPCNotification) and b'"id"' in line and _has_id(text):
                # The SDK reads a request whose id is neither a string nor an integer (1.5, {}, null)
                # as a notification: nothing would run and its sender would wait for ever.
                await answers.send(SessionMessage(_invalid(None, "Invalid Request: an id is a string or an integer")))
                continue
            if isinstance(message, types.JSONRPCRequest):
                lean.answering.begin(message.id)
            elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                # A cancelled request gets no answer (the SDK sends none): nothing to wait for.
                cancelled = (message.params or {}).get("requestId")
                if _is_id(cancelled):
                    lean.answering.end(cancelled)
            await messages.send(SessionMessage(message))


async def _write_messages(
    wire: _Wire, messages: MemoryObjectReceiveStream[SessionMessage | bytes], lean: _LeanReads
) -> None:
    async with messages:
        async for message in messages:
            if lean.handshake is None and isinstance(message, SessionMessage):
                lean.answered(message)
            batch = [message]
            while True:  # whatever else is ready goes out in the same write
                try:
                    batch.append(messages.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            try:
                await wire.write(b"".join(_encode(sent) for sent in batch))
            except (OSError, RuntimeError):  # the client closed stdout: nothing more can reach it
                return
            finally:
                for sent in batch:  # answered (or never will be: stdout is closed)
                    if isinstance(sent, SessionMessage) and isinstance(
                        sent.message, types.JSONRPCResponse | types.JSONRPCError
                    ):
                        lean.answering.end(sent.message.id)


def _encode(message: SessionMessage | bytes) -> bytes:
    if isinstance(message, bytes):
        return message  # a lean read's answer, encoded where it was made
    return message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"


def _invalid(request_id: str | int | None, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=INVALID_REQUEST, message=message)
    )


def _has_id(text: str) -> bool:
    """Whether a message the SDK took for a notification names an id (of a kind it dropped)."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "id" in data


_ANY_ID = re.compile(r'"id"\s*:\s*(-?\d{1,19}(?![\d.eE])|"(?:[^"\\]|\\.){0,200}")')


def malformed_answer(line: str) -> types.JSONRPCError | None:
    """The JSON-RPC error a line that is not a valid message deserves, or None (a notification)."""
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        # JSON-RPC 2.0: when the id cannot be detected (a parse error), the answer's id is null.
        return types.JSONRPCError(
            jsonrpc="2.0", id=None, error=types.ErrorData(code=PARSE_ERROR, message="Parse error")
        )
    except (RecursionError, ValueError) as exc:
        # Nested too deep, or an integer past Python's digit limit: the id may still be legible.
        found = _ANY_ID.search(line[:4096])
        request_id = json.loads(found.group(1)) if found else None
        why = "nested too deep" if isinstance(exc, RecursionError) else "a number is too long"
        return types.JSONRPCError(
            jsonrpc="2.0", id=request_id, error=types.ErrorData(code=INVALID_REQUEST, message=f"Invalid Request: {why}")
        )
    if isinstance(data, dict) and "method" in data and "id" not in data:
        return None  # a malformed notification: nobody waits for an answer
    raw_id = data.get("id") if isinstance(data, dict) else None
    request_id = (
        raw_id if isinstance(raw_id, str) or (isinstance(raw_id, int) and not isinstance(raw_id, bool)) else None
    )
    return types.JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=types.ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a valid JSON-RPC 2.0 message"),
    )
