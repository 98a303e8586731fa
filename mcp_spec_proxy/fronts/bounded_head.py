"""uvicorn's httptools parser with the bound on a request's head that its h11 parser keeps.

With `httptools` installed (the `fast` extra) uvicorn parses HTTP with it: about a fifth less CPU per
read than h11's pure Python (docs/BENCHMARKS.md). But uvicorn's h11 protocol refuses a request line
and headers past 16 KiB (h11's own bound) before the app sees them, and its httptools protocol
has no bound at all: a client could make the proxy hold a header of any size while the parser
gathers it. `BoundedHttpTools` counts the bytes of each request's head as they arrive and answers
431 and closes the connection once they pass the same 16 KiB, before the parser is fed them.

Where a head begins and ends is the parser's word, not a search for a blank line: the empty lines
the parser skips before a request line count toward the head that follows, and a pipelined
request's body is never taken for its head. A chunked body's trailer section is bounded the same
way (h11 bounds it too), and its fields are dropped, as uvicorn's h11 protocol drops them: on
httptools they would join the request's headers, where a field an intermediary strips from a head
could come back. A body is never counted (the SDK's body limit bounds it). A refused head that
follows pipelined requests still being answered waits for their answers, so the 431 never stands in
for the answer to a request that ran.

One approximation, which h11 shares (it bounds only what it holds of a head not yet complete): the
bytes of a head that begins in the same read as the end of what came before it on the connection
are not counted; the bound applies from the next read on, so a head is at most one read past it.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEAD_BYTES = 16 * 1024
"""A request line and its headers, as h11's `max_incomplete_event_size` bounds them by default."""


class BoundedHttpTools(HttpToolsProtocol):
    """`HttpToolsProtocol` that refuses a request head or trailer section past `MAX_HEAD_BYTES` (431, then closes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # the parser is in a request's head, or before one
        self._counted = 0  # bytes that are not body since the parser last passed a boundary, as far as known
        self._crossed = False  # the parser passed a boundary (a head's end, a chunk's size line, a message's end)
        self._body = 0  # body bytes the feed in progress handed on
        self._refusing = False  # a head past the bound waits for the answers to the requests before it

    def data_received(self, data: bytes) -> None:
        while data and not self._refusing:
            piece, data = data, b""
            room = MAX_HEAD_BYTES - self._counted
            if self._in_head and len(piece) > room:  # the head must end within `room`: feed no more first
                piece, data = piece[:room], piece[room:]
            self._crossed, self._body = False, 0
            super().data_received(piece)
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return  # refused as malformed, or upgraded (uvicorn drops the rest of such a read)
            self._counted = 0 if self._crossed else self._counted + len(piece) - self._body
            if self._counted > MAX_HEAD_BYTES or (self._in_head and self._counted >= MAX_HEAD_BYTES):
                self._refuse()  # a head at the bound and not ended is past it
                return

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # a trailer field is not a header of the request
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._crossed = False, True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body += len(body)
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._crossed = True  # a chunk's size line and the CRLF before it, or the trailers after the last, are counted

    def on_message_complete(self) -> None:
        self._in_head, self._crossed = True, True
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._refusing and not self.pipeline and not self.transport.is_closing():
            self._refused()

    def _refuse(self) -> None:
        """Refuse now, or — where pipelined requests before this head are still being answered — once
        their answers are written: the 431 must not stand in for the answer to a request that ran."""
        if self._in_head and self.cycle is not None and not self.cycle.response_complete:
            self._refusing = True
            self.flow.pause_reading()
            return
        self._refused()

    def _refused(self) -> None:
        message = b"Request header fields too large."
        self.transport.write(
            STATUS_LINE[431]
            + b"content-type: text/plain; charset=utf-8\r\n"
            + b"content-length: "
            + str(len(message)).encode()
            + b"\r\nconnection: close\r\n\r\n"
            + message
        )
        self.transport.close()


__all__ = ["MAX_HEAD_BYTES", "BoundedHttpTools"]
