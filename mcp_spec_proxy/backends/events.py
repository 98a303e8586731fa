"""A streamable HTTP request's SSE body, passed on one whole event at a time, each as it arrives.

`Events` wraps the body the SDK's transport reads. It promises:

* an event is passed on as soon as its blank line has arrived, whatever its line ends (`\\n`,
  `\\r\\n` or `\\r`): the SDK's SSE parser holds back a chunk's trailing `\\r` until it sees the
  next byte, so an event whose blank line ends a chunk with `\\r` is passed on with that line
  end completed (`\\r\\n`) and the `\\n` that may follow is dropped;
* no event over `limit` bytes is ever held in memory: its bytes are counted and skipped to its
  end, and it is passed on as `on_oversized(size)`'s event instead;
* a drop mid-stream ends the body with `on_drop`'s event, never inside half an event, unless an
  event already carried an id: the stream can then be resumed (`Last-Event-ID`), and the drop is
  raised for the SDK, which resumes it. Without `on_drop` every drop is raised (a resumed
  stream's GET, which the SDK asks again itself).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import httpx2

# Two line ends in a row (`\r\n`, `\r` or `\n` each) always contain one of these: an event's end.
_EVENT_ENDS = (b"\n\n", b"\r\r", b"\n\r")
_ID_FIELD = re.compile(rb"(?:^|[\r\n])id:")


def event_end(data: bytes | bytearray, start: int = 0) -> int:
    """Where the first event that ends in `data` at or after `start` ends (just past its blank
    line), or 0 when none does."""
    found = [at for mark in _EVENT_ENDS if (at := data.find(mark, start)) >= 0]
    if not found:
        return 0
    end = min(found) + 2
    if data[end - 1 : end] == b"\r" and data[end : end + 1] == b"\n":
        end += 1  # the blank line's `\r\n`, whole
    return end


class Frames:
    """Splits an SSE body into whole events; an event over `limit` bytes comes out as its size."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pending = bytearray()  # the start of the event not yet ended
        self._skipped: int | None = None  # bytes so far of an oversized event being skipped
        self._tail = b""  # the last byte skipped: an event's end may straddle the chunks
        self._lf_owed = False  # a `\r` that ended a chunk was passed on as `\r\n`

    def feed(self, chunk: bytes) -> list[bytes | int]:
        """The events `chunk` completes, in order: an event's bytes, or an oversized one's size."""
        if self._lf_owed:
            self._lf_owed = False
            chunk = chunk.removeprefix(b"\n")
        out: list[bytes | int] = []
        if self._skipped is not None:
            data = self._tail + chunk
            end = event_end(data)
            if not end:
                self._skipped += len(chunk)
                self._tail = data[-1:]
                return out
            out.append(self._skipped + end - len(self._tail))
            self._skipped, self._tail = None, b""
            self._lf_owed = end == len(data) and data.endswith(b"\r")
            chunk = data[end:]
        start = max(0, len(self._pending) - 1)
        self._pending += chunk
        while end := event_end(self._pending, start):
            whole = bytes(self._pending[:end])
            del self._pending[:end]
            start = 0
            if whole.endswith(b"\r"):
                whole += b"\n"
                if self._pending[:1] == b"\n":
                    del self._pending[:1]
                elif not self._pending:
                    self._lf_owed = True
            out.append(whole if len(whole) <= self.limit else len(whole))
        if len(self._pending) > self.limit:
            self._skipped, self._tail = len(self._pending), bytes(self._pending[-1:])
            self._pending.clear()
        return out

    def rest(self) -> bytes:
        """What is left when the body ends: the start of an event that never ended."""
        rest, self._pending = bytes(self._pending), bytearray()
        return rest


class Events(httpx2.AsyncByteStream):
    """An SSE body passed on whole events at a time (see the module's promises)."""

    def __init__(
        self,
        inner: httpx2.AsyncByteStream,
        limit: int,
        on_drop: Callable[[Exception], bytes] | None,
        on_oversized: Callable[[int], bytes],
    ) -> None:
        self._inner = inner
        self._frames = Frames(limit)
        self._on_drop = on_drop
        self._on_oversized = on_oversized

    async def __aiter__(self) -> AsyncIterator[bytes]:
        resumable = False
        try:
            async for chunk in self._inner:
                for event in self._frames.feed(chunk):
                    if isinstance(event, int):
                        yield self._on_oversized(event)
                        continue
                    resumable = resumable or _ID_FIELD.search(event) is not None
                    yield event
        except httpx2.TransportError as exc:
            if resumable or self._on_drop is None:
                raise  # the SDK resumes it with Last-Event-ID
            yield self._on_drop(exc)  # half an event is dropped with the connection
            return
        if rest := self._frames.rest():
            yield rest

    async def aclose(self) -> None:
        await self._inner.aclose()


class Lines(httpx2.AsyncByteStream):
    """A streamed `application/json` body that carries one JSON-RPC message per line (the suite's
    reference server answers `subscriptions/listen` so, as a client reading lines takes it), as
    the SSE events the SDK's transport reads: each line passed on as it arrives, none held past
    `limit` bytes (a longer line is skipped to its end, as `on_oversized(size)`'s event)."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, on_oversized: Callable[[int], bytes]) -> None:
        self._inner = inner
        self._limit = limit
        self._on_oversized = on_oversized

    async def __aiter__(self) -> AsyncIterator[bytes]:
        line = bytearray()
        skipped = 0  # bytes of a line over the limit, counted and not kept
        async for chunk in self._inner:
            for part in re.split(rb"(\n)", bytes(chunk)):
                if part != b"\n":
                    if skipped or len(line) + len(part) > self._limit:
                        skipped += len(line) + len(part)
                        line.clear()
                    else:
                        line += part
                    continue
                if skipped:
                    yield self._on_oversized(skipped)
                elif line.strip():
                    yield b"event: message\ndata: " + bytes(line.strip()) + b"\n\n"
                line.clear()
                skipped = 0
        if skipped:
            yield self._on_oversized(skipped)
        elif line.strip():
            yield b"event: message\ndata: " + bytes(line.strip()) + b"\n\n"

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = ["Events", "Frames", "Lines", "event_end"]
