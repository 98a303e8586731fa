"""The client processes bench/front_load.py drives its throughput sessions from.

    python -m bench.front_clients      (started by front_load, one per `--clients`; not run by hand)

A level's sessions, all in one Python process, make that process part of what the figure measures:
each SDK `Client` read costs the client more CPU than it costs a lean proxy to serve. So the sessions
are shared out among several worker processes, each holding its share, and a level starts in every
worker at once. The pipe between front_load and a worker carries one JSON object a line:

    front_load -> worker   {"url", "tool", "arguments", "era", "sessions", "reads", "roots"}
                           the worker opens its sessions (each in a task of its own), makes one
                           unmeasured read on each, and answers
    worker -> front_load   {"ready": true}
    front_load -> worker   "go", to every worker once all are ready: the common start
    worker -> front_load   {"start", "end", "reads", "cpu"}: CLOCK_MONOTONIC (one clock for every
                           process on the machine) when "go" came and when its last read was answered,
                           and its own CPU seconds in between; or {"error": "one line"}

then its sessions close and it waits for the next level. The end of its input ends it. Every wait in
a worker is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.shared.exceptions import MCPError

from bench.overhead import declaring

REPO = Path(__file__).resolve().parent.parent
OPEN_S = 120.0  # a worker's share of sessions open, and each answered its first read
LEVEL_S = 600.0  # a level's reads, from "go" to the last answer
LINE_LIMIT = 65536


class ReadFailed(Exception):
    """A measured read came back as an error result, or not at all."""


@dataclass(frozen=True)
class Share:
    """One worker's part of a level, as it reported it."""

    start: float
    end: float
    reads: int
    cpu: float


class _Level:
    """A worker's share of one level: its sessions open, wait for the common start, read, and finish."""

    def __init__(self, order: dict[str, Any]) -> None:
        self.order = order
        self.sessions: int = order["sessions"]
        self.opened = self.finished = 0
        self.all_open, self.go, self.done, self.release = anyio.Event(), anyio.Event(), anyio.Event(), anyio.Event()
        self.end = self.cpu_end = 0.0

    async def session(self) -> None:
        order = self.order
        async with Client(order["url"], mode=order["era"], **declaring(order["roots"])) as client:

            async def read() -> None:
                result = await client.call_tool(order["tool"], order["arguments"])
                if result.is_error:
                    raise ReadFailed(f"{order['tool']} failed: {result.content}")

            await read()
            self.opened += 1
            if self.opened == self.sessions:
                self.all_open.set()
            await self.go.wait()
            for _ in range(order["reads"]):
                await read()
            self.finished += 1
            if self.finished == self.sessions:
                self.end, self.cpu_end = time.monotonic(), time.process_time()
                self.done.set()
            await self.release.wait()  # every session stays open until the level is reported

    async def run(self) -> None:
        """Open, wait for the common start, read; the report goes out before the sessions close (a
        handshake-era session's close is a request of its own, not part of the level)."""
        async with anyio.create_task_group() as tg:
            for _ in range(self.sessions):
                tg.start_soon(self.session)
            with anyio.fail_after(OPEN_S):
                await self.all_open.wait()
            _say({"ready": True})
            if (await anyio.to_thread.run_sync(sys.stdin.readline)).strip() != "go":
                tg.cancel_scope.cancel()
                _say({"error": "no common start came"})
                return
            start, cpu_start = time.monotonic(), time.process_time()
            self.go.set()
            with anyio.fail_after(LEVEL_S):
                await self.done.wait()
            reads = self.sessions * self.order["reads"]
            _say({"start": start, "end": self.end, "reads": reads, "cpu": self.cpu_end - cpu_start})
            self.release.set()


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


def _first(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


async def _serve() -> None:
    while line := await anyio.to_thread.run_sync(sys.stdin.readline):
        try:
            await _Level(json.loads(line)).run()
        except* (ReadFailed, MCPError, httpx2.HTTPError, TimeoutError, OSError) as group:
            error = _first(group)
            _say({"error": f"{type(error).__name__}: {error}"})


class ClientPool:
    """The worker processes of one run, started once and given every level of every target in turn."""

    def __init__(self, workers: list[tuple[anyio.abc.Process, BufferedByteReceiveStream]]) -> None:
        self.workers = workers
        self.busy: list[tuple[anyio.abc.Process, BufferedByteReceiveStream]] = []

    @classmethod
    async def start(cls, stack: AsyncExitStack, count: int) -> ClientPool:
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
        workers = []
        for _ in range(count):
            process = await anyio.open_process(
                [sys.executable, "-m", "bench.front_clients"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                cwd=REPO,
                env=env,
            )
            stack.push_async_callback(_stop, process)
            assert process.stdout is not None
            workers.append((process, BufferedByteReceiveStream(process.stdout)))
        return cls(workers)

    async def open(self, order: dict[str, Any], sessions: int) -> None:
        """Each worker opens its share of `sessions` (as even as can be) and says when it is ready."""
        count = min(sessions, len(self.workers))
        self.busy = self.workers[:count]
        for index, (process, _) in enumerate(self.busy):
            share = sessions // count + (1 if index < sessions % count else 0)
            await _send(process, json.dumps({**order, "sessions": share}))
        for worker in self.busy:
            await _answer(worker, "ready")

    async def go(self) -> list[Share]:
        """The common start; what each worker reports once its last read is answered."""
        for process, _ in self.busy:
            await _send(process, "go")
        shares = []
        for worker in self.busy:
            report = await _answer(worker, "start")
            shares.append(Share(report["start"], report["end"], report["reads"], report["cpu"]))
        return shares


async def _send(process: anyio.abc.Process, line: str) -> None:
    assert process.stdin is not None
    await process.stdin.send(line.encode() + b"\n")


async def _answer(worker: tuple[anyio.abc.Process, BufferedByteReceiveStream], key: str) -> dict[str, Any]:
    process, lines = worker
    try:
        with anyio.fail_after(OPEN_S + LEVEL_S):
            answer: dict[str, Any] = json.loads(await lines.receive_until(b"\n", LINE_LIMIT))
    except (anyio.IncompleteRead, anyio.EndOfStream) as exc:
        raise SystemExit(f"a client process (pid {process.pid}) exited before it answered") from exc
    if "error" in answer:
        raise SystemExit(f"a client process (pid {process.pid}): {answer['error']}")
    if key not in answer:
        raise SystemExit(f"a client process (pid {process.pid}) answered {answer!r}, not {key!r}")
    return answer


async def _stop(process: anyio.abc.Process) -> None:
    """End of input ends a worker; one that does not end is terminated, then killed."""
    if process.stdin is not None:
        await process.stdin.aclose()
    with anyio.move_on_after(10):
        await process.wait()
        return
    process.kill()
    await process.wait()


if __name__ == "__main__":
    anyio.run(_serve)
