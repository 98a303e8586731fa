"""The HTTP fronts on httptools keep h11's bound on a request's head (`fronts/bounded_head.py`), from a raw socket.

A front served by `serve_asgi` parses with httptools where it is installed (the test extra installs
it, as the `fast` extra does); uvicorn's httptools protocol has no bound of its own on a request's
line and headers. An app that counts what reached it is the ledger.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from unittest.mock import patch

import anyio
import pytest
from starlette.types import Receive, Scope, Send

from mcp_spec_proxy.fronts import asgi
from mcp_spec_proxy.fronts.bounded_head import MAX_HEAD_BYTES, BoundedHttpTools

pytestmark = pytest.mark.anyio


class Ledger:
    """An ASGI app that answers 200 with the length of the body it read, and keeps each request's path."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.headers: list[list[bytes]] = []  # each request's header names, as the app sees them once its body is read

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False)
        self.paths.append(scope["path"])
        self.headers.append([name for name, _ in scope["headers"]])
        body = str(size).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def served(parser: str = "httptools") -> AsyncIterator[tuple[int, Ledger]]:
    app = Ledger()
    protocol = asgi._http_protocol() if parser == "httptools" else "h11"  # h11: uvicorn's own, to compare
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            with patch.object(asgi, "_http_protocol", lambda: protocol):
                port = await tg.start(
                    lambda task_status: asgi.serve_asgi(app, "127.0.0.1", 0, lifespan=False, task_status=task_status)
                )
            yield port, app
            tg.cancel_scope.cancel()


def request(path: str, padding: int = 0, body: bytes = b"") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
    if padding:
        head += f"X-Pad: {'a' * padding}\r\n"
    return head.encode() + b"\r\n" + body


async def exchange(port: int, *pieces: bytes) -> bytes:
    """Send `pieces` one write each, then read until the server closes or goes quiet."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        for piece in pieces:
            try:
                await stream.send(piece)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                break  # the server closed while the client still sent
            await anyio.sleep(0.01)
        answer = b""
        with anyio.move_on_after(1.0):
            try:
                while True:
                    answer += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass
        return answer


def test_the_fronts_parse_with_the_bounded_httptools_where_it_is_installed() -> None:
    assert asgi._http_protocol() is BoundedHttpTools


async def test_a_head_past_the_bound_is_refused_431_before_the_app_sees_it() -> None:
    async with served() as (port, app):
        answer = await exchange(port, request("/big", padding=MAX_HEAD_BYTES + 1))
        megabyte = await exchange(
            port, *[request("/huge", padding=1 << 20)[i : i + 65536] for i in range(0, 1 << 20, 65536)]
        )
    assert answer.startswith(b"HTTP/1.1 431 ") and b"too large" in answer
    assert megabyte.startswith(b"HTTP/1.1 431 ") or megabyte == b""  # refused, or closed while the client still sent
    assert app.paths == []


async def test_a_head_within_the_bound_and_a_large_body_in_one_write_are_served() -> None:
    body = b"x" * 300_000
    async with served() as (port, app):
        answer = await exchange(port, request("/near", padding=MAX_HEAD_BYTES - 200, body=body))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"300000")
    assert app.paths == ["/near"]


async def test_a_head_sent_a_byte_at_a_time_is_served_and_counted() -> None:
    raw = request("/slow", padding=100)
    async with served() as (port, app):
        answer = await exchange(port, *[raw[i : i + 1] for i in range(len(raw))])
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert app.paths == ["/slow"]


async def test_each_request_on_a_kept_connection_has_a_bound_of_its_own() -> None:
    async with served() as (port, app):
        answer = await exchange(
            port,
            request("/one", padding=MAX_HEAD_BYTES - 200),
            request("/two", padding=MAX_HEAD_BYTES - 200),
            request("/three", padding=MAX_HEAD_BYTES + 1),
        )
    assert answer.count(b"HTTP/1.1 200 ") == 2 and b"HTTP/1.1 431 " in answer
    assert app.paths == ["/one", "/two"]


def pieces(raw: bytes, size: int = 8192) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def refused(answer: bytes) -> bool:
    """431, or the connection closed while the client still sent (no other answer)."""
    return answer.startswith(b"HTTP/1.1 431 ") or answer == b""


@pytest.mark.parametrize("parser", ["httptools", "h11"])
@pytest.mark.parametrize("blank", [b"\r\n\r\n", b"\n\n"])
async def test_blank_lines_before_a_request_line_do_not_end_its_head(parser: str, blank: bytes) -> None:
    # The parsers skip empty lines before a request line: the head that follows is still bounded.
    async with served(parser) as (port, app):
        answer = await exchange(port, blank, *pieces(request("/after-blank-lines", padding=200_000)))
    assert refused(answer)
    assert app.paths == []


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_pipelined_requests_body_read_after_its_head_is_not_counted_as_a_head(parser: str) -> None:
    body = b"x" * 100_000
    head = request("/two", body=body)[: -len(body)]
    async with served(parser) as (port, app):
        answer = await exchange(port, request("/one") + head, *pieces(body))
    assert answer.count(b"HTTP/1.1 200 ") == 2 and answer.endswith(b"100000")
    assert app.paths == ["/one", "/two"]


def chunked(path: str, trailers: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    return head + b"3\r\nabc\r\n0\r\n" + trailers + b"\r\n"


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_chunked_requests_trailers_are_bounded_as_its_head_is(parser: str) -> None:
    many = b"".join(b"X-T%d: %s\r\n" % (i, b"a" * 8000) for i in range(30))
    one = b"X-T: " + b"a" * 200_000 + b"\r\n"
    async with served(parser) as (port, _):
        answers = [await exchange(port, *pieces(chunked("/trailers", trailers))) for trailers in (many, one)]
    assert all(refused(answer) for answer in answers), answers


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_chunked_requests_trailers_do_not_become_its_headers(parser: str) -> None:
    async with served(parser) as (port, app):
        answer = await exchange(port, chunked("/trailer", b"Authorization: Bearer smuggled\r\n"))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"3")
    assert app.headers == [[b"host", b"transfer-encoding"]]


async def test_a_refusal_waits_for_the_answers_to_the_pipelined_requests_before_it() -> None:
    # The first request's app has not run when the second's head passes the bound in the same read.
    # (h11 bounds only a head it holds incomplete: one that arrives whole in a read, as this one may, it serves.)
    async with served() as (port, app):
        answer = await exchange(port, request("/first") + request("/second", padding=4 * MAX_HEAD_BYTES))
    assert answer.startswith(b"HTTP/1.1 200 ") and refused(answer[answer.index(b"\r\n\r\n") + 5 :])
    assert app.paths == ["/first"]
