"""A small sticky HTTP router in front of proxy replicas: what deploy/nginx.conf does in the compose
stack, for the smoke script (scripts/ops_stack.py), where no nginx is installed.

    python scripts/sticky_router.py --listen 127.0.0.1:0 --replica a=http://127.0.0.1:8765 \
        --replica b=http://127.0.0.1:8766

A session stays where it can be served:

* a handshake-era HTTP session (`Mcp-Session-Id`) is named by the replica that answered its
  `initialize`: the router learns the name from that response and sends every later request of
  the session there (hashing the name alone cannot work: the first request carries none, and the
  replica that chose it is not the one its hash points at); the gateway's `X-Session-Id` (a
  running engine loop) is hashed over every configured replica. Both live in one replica's memory:
  when that replica cannot be reached, the client is answered 503 (the session is gone with it),
  never a closed connection;
* a 2026-07-28 session the client names (`Mcp-Spec-Proxy-Session`) lives in Postgres, so any
  replica can serve it: it is hashed over the replicas that are ready now (rendezvous hashing, so a
  replica that goes away moves only its own sessions, and they come back when it is ready again),
  and a replica that refuses the connection is passed over for the next one at once;
* a request that names no session starts one on the next ready replica, in turn.

Readiness is each replica's `GET /readyz`, polled every half second (a refused connection marks a
replica not ready at once); the router's own `/readyz` says which replicas are ready (200 while one
is). Each request is relayed on a connection of its own (`Connection: close` both ways), so a
client's keep-alive connection never carries two sessions' requests to one replica; response bodies
(SSE streams included) are piped as they come. Request bodies must carry a Content-Length (MCP
clients send JSON with one). A request is sent to one replica only: once it is sent, a replica that
closes without answering is reported as 502, never retried elsewhere (a write may have run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024
LEARNED = 10_000  # handshake-era session names remembered; the oldest is forgotten first
POLL_S = 0.5
CONNECT_S = 2.0  # to open a connection to a replica
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"te"}


@dataclass
class Replica:
    name: str
    host: str
    port: int
    ready: bool = False


@dataclass
class Router:
    replicas: list[Replica]
    learned: dict[str, str] = field(default_factory=dict)  # Mcp-Session-Id -> replica name
    turn: int = 0

    def by_name(self, name: str) -> Replica | None:
        return next((r for r in self.replicas if r.name == name), None)

    def pick(self, headers: dict[bytes, bytes]) -> list[Replica]:
        """The replicas that may serve this request, best first (empty: none is ready)."""
        session = headers.get(b"mcp-session-id", b"").decode("latin-1")
        if session and (known := self.by_name(self.learned.get(session, ""))):
            return [known]
        pinned = session or headers.get(b"x-session-id", b"").decode("latin-1")
        if pinned:  # lives in one replica's memory: its replica or none
            return [max(self.replicas, key=lambda r: rank(r, pinned))]
        ready = [r for r in self.replicas if r.ready]
        if shared := headers.get(b"mcp-spec-proxy-session", b"").decode("latin-1"):
            return sorted(ready, key=lambda r: rank(r, shared), reverse=True)
        if not ready:
            return []
        self.turn += 1
        return ready[self.turn % len(ready) :] + ready[: self.turn % len(ready)]

    def learn(self, session: str, replica: Replica) -> None:
        self.learned.pop(session, None)
        self.learned[session] = replica.name
        while len(self.learned) > LEARNED:
            self.learned.pop(next(iter(self.learned)))


def rank(replica: Replica, session: str) -> bytes:
    """Rendezvous hashing: a session goes to the replica of highest rank among those it may use."""
    return hashlib.sha256(f"{replica.name}\0{session}".encode()).digest()


async def connect(candidates: list[Replica]) -> tuple[Replica, asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection to the first candidate that takes one; one that refuses is not ready from now
    (the poll says when it is again). Nothing has been sent yet, so passing one over is safe."""
    for replica in candidates:
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(replica.host, replica.port), CONNECT_S)
        except (OSError, TimeoutError):
            replica.ready = False
            continue
        return replica, up_r, up_w
    return None


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, list[tuple[bytes, bytes]]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        return None
    first, *lines = raw[:-4].split(b"\r\n")
    headers = []
    for line in lines:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    return first, headers


def render(first: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    kept = [(n, v) for n, v in headers if n not in HOP_BY_HOP]
    return b"\r\n".join([first, *(n + b": " + v for n, v in kept), b"connection: close", b"", b""])


async def answer(writer: asyncio.StreamWriter, status: str, body: object) -> None:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
    writer.write(head.encode() + b"connection: close\r\n\r\n" + data)
    await writer.drain()


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while chunk := await reader.read(65536):
        writer.write(chunk)
        await writer.drain()


async def relay(router: Router, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    try:
        head = await read_head(client_r)
        if head is None:
            return
        first, headers = head
        table = dict(headers)
        path = first.split(b" ")[1] if first.count(b" ") >= 2 else b"/"
        if path == b"/readyz":
            ready = [r.name for r in router.replicas if r.ready]
            await answer(client_w, "200 OK" if ready else "503 Service Unavailable", {"ready": ready})
            return
        if b"chunked" in table.get(b"transfer-encoding", b""):
            await answer(client_w, "411 Length Required", {"error": "send a Content-Length"})
            return
        body = await client_r.readexactly(int(table.get(b"content-length", b"0") or 0))
        candidates = router.pick(table)
        if not candidates:
            await answer(client_w, "503 Service Unavailable", {"error": "no replica is ready"})
            return
        connected = await connect(candidates)
        if connected is None:
            names = ", ".join(r.name for r in candidates)
            error = f"replica {names} cannot be reached" if len(candidates) == 1 else "no replica can be reached"
            if b"mcp-session-id" in table or b"x-session-id" in table:
                error += ": this session lived in that replica's memory; start a new one"
            await answer(client_w, "503 Service Unavailable", {"error": error})
            return
        replica, up_r, up_w = connected
        try:
            up_w.write(render(first, headers) + body)
            await up_w.drain()
            response = await read_head(up_r)
            if response is None:
                error = f"replica {replica.name} closed the connection without answering: the request may have run"
                await answer(client_w, "502 Bad Gateway", {"error": error})
                return
            status, reply = response
            if session := dict(reply).get(b"mcp-session-id"):
                router.learn(session.decode("latin-1"), replica)
            chunked = b"chunked" in dict(reply).get(b"transfer-encoding", b"")
            kept = [(n, v) for n, v in reply if n not in HOP_BY_HOP]
            if chunked:  # the body goes on as the replica framed it
                kept.append((b"transfer-encoding", b"chunked"))
            client_w.write(render(status, kept))
            await pipe(up_r, client_w)
        finally:
            up_w.close()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        client_w.close()


async def poll(router: Router) -> None:
    while True:
        for replica in router.replicas:
            replica.ready = await probe(replica)
        await asyncio.sleep(POLL_S)


async def probe(replica: Replica) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(replica.host, replica.port), 2)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(f"GET /readyz HTTP/1.1\r\nhost: 127.0.0.1:{replica.port}\r\nconnection: close\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), 2)
        return status.split(b" ")[1:2] == [b"200"]
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def replica_of(spec: str) -> Replica:
    name, _, url = spec.partition("=")
    parts = urlsplit(url)
    if not name or parts.hostname is None or parts.port is None:
        raise argparse.ArgumentTypeError(f"{spec!r}: use NAME=http://HOST:PORT")
    return Replica(name, parts.hostname, parts.port)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (port 0: a free one)")
    parser.add_argument("--replica", type=replica_of, action="append", required=True, help="NAME=http://HOST:PORT")
    args = parser.parse_args()
    router = Router(args.replica)
    host, _, port = args.listen.rpartition(":")
    server = await asyncio.start_server(lambda r, w: relay(router, r, w), host or "127.0.0.1", int(port))
    bound = server.sockets[0].getsockname()
    print(f"routing on http://{bound[0]}:{bound[1]}", file=sys.stderr, flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), poll(router))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
