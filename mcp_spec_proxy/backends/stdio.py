"""The stdio transport to a backend, with a bound on the size of any one message.

It is the SDK's `stdio_client` (same spawn in its own process group, same bounded and shielded
shutdown: close stdin, wait, terminate the tree, kill), with its own stdout reader: lines are
split in linear time, and a line longer than `max_line_bytes` is never held in memory. It is
skipped to its end, and if its first bytes name a request id, that request is answered with an
error whose `data` is `raw.Oversized` (the proxy's own mark, which no backend can send) so the
caller learns why instead of waiting out its timeout.

Messages waiting for stdin go out together, one write for all of them, and with `raw` the same
pipes carry the fast path's reads (`raw.RawCalls`): its lines are written beside the SDK's, and
the reader hands their answers back to it before the SDK parses anything.

A server's first connection adopts the process the launcher started for it before the SDK was
imported (`prespawn.Prespawned`, handed down to the pool), when it was spawned with exactly the
parameters this connection would use (`_adopt`); the pipes are then served by the event loop's
own pipe transports (`AdoptedProcess`). What the launcher spawned and nobody adopted is stopped
with the SDK's own shutdown too (`stop_processes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO, cast

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

from mcp_spec_proxy.backends.raw import Oversized, RawCalls
from mcp_spec_proxy.errors import RESULT_TOO_LARGE
from mcp_spec_proxy.prespawn import Prespawned, SpawnKey
from mcp_spec_proxy.sdk import (  # the SDK's own spawn and shutdown, so both behave the same
    TransportStreams,
    create_platform_compatible_process,
    drain_stdout,
    parse_line,
    stop_server_process,
)

_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.){0,200}")')
_WRITER_FLUSH_TIMEOUT = 0.5
_EXIT_POLL_S = 0.01

logger = logging.getLogger(__name__)


@asynccontextmanager
async def bounded_stdio_client(
    server: StdioServerParameters,
    errlog: TextIO,
    max_line_bytes: int,
    on_exit: Callable[[int | None], None] | None = None,
    raw: RawCalls | None = None,
    name: str | None = None,
    early: Prespawned | None = None,
) -> AsyncGenerator[TransportStreams, None]:
    """`on_exit` hears the process's exit status once it is stopped (or found dead): the
    supervisor names it when a server exits during its handshake. `raw` is attached to these
    pipes while they are open. `name` (the server's) lets a first connection adopt its process in
    `early`, the launcher's."""
    env = get_default_environment() | (server.env or {})
    adopted = await _adopt(early, name, server, env, errlog) if name is not None and early is not None else None
    process = adopted or await create_platform_compatible_process(
        command=server.command, args=server.args, env=env, errlog=errlog, cwd=server.cwd
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    # The SDK sends its messages; the fast path sends lines it encoded itself.
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage | bytes](0)
    writer_done = anyio.Event()

    async def deliver(line: bytes) -> None:
        if raw is not None and raw.answer(line):
            return
        if line.strip():
            await read_writer.send(parse_line(line.decode(server.encoding, server.encoding_error_handler)))

    async def refuse(head: bytes, size: int) -> None:
        found = _ID.search(head)
        if found is None:
            return  # a notification, or no id in sight: dropping it is all we can do
        named = found.group(1)
        request_id: int | str = int(named) if named[:1] != b'"' else named[1:-1].decode(errors="replace")
        oversized = Oversized(size, max_line_bytes)
        if raw is not None and raw.refuse(request_id, oversized):
            return  # it answered one of the fast path's reads
        message = f"response of {size} bytes is over the {max_line_bytes}-byte bound"
        error = types.ErrorData(code=RESULT_TOO_LARGE, message=message, data=oversized)
        await read_writer.send(SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buffer = bytearray()
        skipping: tuple[bytes, int] | None = None  # (first bytes, size so far) of an oversized line
        try:
            async with read_writer:
                try:
                    async for chunk in process.stdout:
                        if skipping is not None:
                            end = chunk.find(b"\n")
                            if end < 0:
                                skipping = (skipping[0], skipping[1] + len(chunk))
                                continue
                            await refuse(skipping[0], skipping[1] + end)
                            skipping = None
                            chunk = chunk[end + 1 :]
                        start = len(buffer)
                        buffer += chunk
                        while (end := buffer.find(b"\n", start)) >= 0:
                            line = bytes(buffer[:end])
                            del buffer[: end + 1]
                            start = 0
                            await deliver(line)
                        if len(buffer) > max_line_bytes:
                            skipping = (bytes(buffer[:512]), len(buffer))
                            buffer.clear()
                finally:
                    if raw is not None:
                        raw.detach()  # no answer can come now
                    await drain_stdout(process)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError):
            pass  # the session or the process went away; the read stream's end tells the session

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    # Whatever else is already waiting goes out in the same write: one system call.
                    chunks = [encode(message)]
                    while True:
                        try:
                            chunks.append(encode(write_reader.receive_nowait()))
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                    await process.stdin.send(b"".join(chunks))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()
        finally:
            writer_done.set()

    def encode(message: SessionMessage | bytes) -> bytes:
        if isinstance(message, bytes):
            return message
        data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
        return data.encode(server.encoding, server.encoding_error_handler)

    async def send_line(line: bytes) -> None:
        await write_stream.send(line)

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        if raw is not None:
            raw.attach(send_line)
        try:
            yield read_stream, cast(Any, write_stream)  # the SDK sees a stream of SessionMessage
        finally:
            if raw is not None:
                raw.detach()
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT):
                    await writer_done.wait()
                await stop_server_process(process)
                if on_exit is not None:
                    on_exit(process.returncode)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            tg.cancel_scope.cancel()


async def _adopt(
    early: Prespawned, name: str, server: StdioServerParameters, env: dict[str, str], errlog: TextIO
) -> anyio.abc.Process | None:
    """The process spawned at launch for `name` with exactly these parameters, served on this loop;
    None when there is none (a reconnect, a changed config, one that died) or it cannot be served."""
    log_name = getattr(errlog, "name", None)
    if not isinstance(log_name, str):
        return None
    key = SpawnKey.of(name, server.command, server.args, env, server.cwd, log_name)
    popen = early.claim(key)
    if popen is None:
        return None
    try:
        process = await AdoptedProcess.serve(popen)
    except Exception as exc:
        logger.warning("backend %r: could not take over its process started at launch (%s); starting one", name, exc)
        early.refuse(popen)
        return None
    logger.debug("backend %r: adopted its process started at launch (pid %d)", name, popen.pid)
    return process


async def stop_processes(processes: list[subprocess.Popen[bytes]]) -> None:
    """Stop processes the launcher spawned that nobody adopted, all at once, as the SDK stops its
    own (`stop_server_process`: stdin closed, its grace to exit, then the whole process group)."""
    async with anyio.create_task_group() as tg:
        for popen in processes:
            for pipe in (popen.stdin, popen.stdout):  # served by no loop: closed here, not by the SDK
                with contextlib.suppress(OSError):
                    if pipe is not None:
                        pipe.close()
            tg.start_soon(stop_server_process, AdoptedProcess(popen, _Closed(), _Closed()))


class AdoptedProcess(anyio.abc.Process):
    """A process spawned by `subprocess.Popen` (`prespawn`), its pipes served by the event loop's pipe
    transports: what `bounded_stdio_client` and the SDK's `stop_server_process` use of a process."""

    def __init__(
        self, popen: subprocess.Popen[bytes], stdin: anyio.abc.ByteSendStream, stdout: anyio.abc.ByteReceiveStream
    ) -> None:
        self._popen = popen
        self._stdin = stdin
        self._stdout = stdout

    @classmethod
    async def serve(cls, popen: subprocess.Popen[bytes]) -> AdoptedProcess:
        assert popen.stdin is not None and popen.stdout is not None  # spawned with pipes
        loop = asyncio.get_running_loop()  # RuntimeError on another event loop (trio): not adopted
        reader = asyncio.StreamReader(loop=loop)
        read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
        try:
            write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, popen.stdin)
        except BaseException:
            read_transport.close()
            raise
        writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
        return cls(popen, _PipeSend(writer), _PipeReceive(reader, read_transport))

    async def aclose(self) -> None:
        await self._stdin.aclose()
        await self._stdout.aclose()
        await self.wait()

    async def wait(self) -> int:
        # Polled as the SDK's shutdown polls: nothing signals a Popen's exit to the loop.
        while (code := self._popen.poll()) is None:  # noqa: ASYNC110
            await anyio.sleep(_EXIT_POLL_S)
        return code

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()

    def send_signal(self, signal: int) -> None:
        self._popen.send_signal(signal)

    @property
    def pid(self) -> int:
        return self._popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()  # reaps it once it exited, as reading an anyio process's does

    @property
    def stdin(self) -> anyio.abc.ByteSendStream:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream:
        return self._stdout

    @property
    def stderr(self) -> None:
        return None  # stderr goes to the server's log file


class _PipeReceive(anyio.abc.ByteReceiveStream):
    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.ReadTransport) -> None:
        self._reader = reader
        self._transport = transport

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._transport.is_closing():
            raise anyio.ClosedResourceError
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        self._transport.close()


class _Closed(anyio.abc.ByteSendStream, anyio.abc.ByteReceiveStream):
    """A pipe already closed: what a process nobody adopted has left to the SDK's shutdown."""

    async def send(self, item: bytes) -> None:
        raise anyio.ClosedResourceError

    async def receive(self, max_bytes: int = 65536) -> bytes:
        raise anyio.EndOfStream

    async def aclose(self) -> None:
        return None


class _PipeSend(anyio.abc.ByteSendStream):
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, item: bytes) -> None:
        if self._writer.is_closing():
            raise anyio.ClosedResourceError
        self._writer.write(item)
        await self._writer.drain()

    async def aclose(self) -> None:
        self._writer.close()  # what is still buffered is written first; then the server reads its end
