"""uvicorn's httptools parser with the bound on a request's head that its h11 parser keeps.

With `httptools` installed (the `fast` extra) uvicorn parses HTTP with it: about a fifth less CPU per
read than h11's pure Python (docs/BENCHMARKS.md). But uvicorn's h11 protocol refuses a request line
and headers past 16 KiB (h11's own bound) before the app sees them, and its httptools protocol
has no bound at all: a client could make the proxy hold a header of any size while the parser
gathers it. `BoundedHttpTools` counts the bytes of each request's head as they arrive — up to the
blank line that ends it — and answers 431 and closes the connection once they pass the same
16 KiB, before the parser is fed them. A body is never counted (the SDK's body limit bounds it).

One approximation: bytes of a pipelined next request that arrive in the same read as the end of
the request before them are not counted; the bound applies again from the next read on.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

MAX_HEAD_BYTES = 16 * 1024
"""A request line and its headers, as h11's `max_incomplete_event_size` bounds them by default."""

_ENDS = (b"\r\n\r\n", b"\n\n")
_KEEP = 3  # bytes kept from one read to find a blank line split across two


def head_end(data: bytes) -> int:
    """The index just past the first blank line in `data`, or -1."""
    found = [at + len(end) for end in _ENDS if (at := data.find(end)) >= 0]
    return min(found) if found else -1


class BoundedHttpTools(HttpToolsProtocol):
    """`HttpToolsProtocol` that refuses a request head past `MAX_HEAD_BYTES` (431, then closes)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head: int | None = 0  # bytes of the current request's head so far; None once it ended
        self._tail = b""

    def data_received(self, data: bytes) -> None:
        if self._head is not None:
            seen = self._tail + data
            end = head_end(seen)
            if end < 0:
                self._head += len(data)
                self._tail = seen[-_KEEP:]
            else:
                self._head += end - len(self._tail)
            if self._head > MAX_HEAD_BYTES:
                self._refuse()
                return
            if end >= 0:
                self._head = None
        super().data_received(data)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head, self._tail = 0, b""  # the next request on this connection has a head of its own

    def _refuse(self) -> None:
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


__all__ = ["MAX_HEAD_BYTES", "BoundedHttpTools", "head_end"]
