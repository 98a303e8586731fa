"""A level: its sessions connect, start together, make their calls; each call timed, each failure counted."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import anyio
from mcp import Client

from bench.load.plan import CALL_TIMEOUT_S, Call, Plan
from bench.load.process import ProxyProcess

CONNECT_TIMEOUT_S = 60.0
LEVEL_TIMEOUT_S = 300.0


@dataclass
class Sample:
    era: str
    write: bool
    ms: float


@dataclass
class Level:
    sessions: int
    calls: int
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    writes_issued: list[Call] = field(default_factory=list)
    connect_s: float = 0.0
    wall_s: float = 0.0
    proxy_peak_mib: float = 0.0
    children_peak_mib: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds during the calls: proxy, backends, bench
    load: float = 0.0  # the machine's 1-minute load average at the end of the calls
    model_ms: list[float] = field(default_factory=list)  # each review's model round trip, from the telemetry

    def latencies(self, write: bool, era: str | None = None) -> list[float]:
        return [s.ms for s in self.samples if s.write == write and era in (None, s.era)]

    @property
    def throughput(self) -> float:
        return len(self.samples) / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class Gate:
    """The sessions of one level: all connect, start together, stay connected until all are done."""

    sessions: int
    connected: int = 0
    finished: int = 0
    all_connected: anyio.Event = field(default_factory=anyio.Event)
    start: anyio.Event = field(default_factory=anyio.Event)
    all_finished: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)

    def on_connected(self) -> None:
        self.connected += 1
        if self.connected == self.sessions:
            self.all_connected.set()

    def on_finished(self) -> None:
        self.finished += 1
        if self.finished == self.sessions:
            self.all_finished.set()


async def run_session(url: str, p: Plan, gate: Gate, level: Level) -> None:
    connected = done = False
    try:
        with anyio.move_on_after(CONNECT_TIMEOUT_S + LEVEL_TIMEOUT_S) as scope:
            async with Client(url, mode=p.era) as client:
                connected = True
                gate.on_connected()
                await gate.start.wait()
                for call in p.calls:
                    await timed_call(client, call, p, level)
                done = True
                gate.on_finished()
                await gate.release.wait()
        if scope.cancelled_caught:
            level.errors.append(f"{p.tag} ({p.era}): session timed out")
    except Exception as exc:  # boundary: a failing session is a measured error, never the benchmark's end
        stage = "closing" if done else "calling" if connected else "connecting"
        level.errors.append(f"{p.tag} ({p.era}): {stage}: {type(exc).__name__}: {exc}")
    finally:
        # A session that failed must not keep the level waiting for it.
        if not connected:
            gate.on_connected()
        if not done:
            gate.on_finished()


async def timed_call(client: Client, call: Call, p: Plan, level: Level) -> None:
    if call.is_write:
        level.writes_issued.append(call)
    started = time.perf_counter()
    try:
        with anyio.fail_after(CALL_TIMEOUT_S):
            result = await client.call_tool(call.tool, call.arguments)
    except TimeoutError:
        level.errors.append(f"{p.tag} ({p.era}): {call.tool}: no answer within {CALL_TIMEOUT_S:g}s")
        return
    except Exception as exc:  # boundary: an error answer is counted and reported, not raised
        level.errors.append(f"{p.tag} ({p.era}): {call.tool}: {type(exc).__name__}: {exc}")
        return
    elapsed = (time.perf_counter() - started) * 1000
    if result.is_error:
        text = " ".join(getattr(block, "text", "") for block in result.content)[:300]
        level.errors.append(f"{p.tag} ({p.era}): {call.tool}: isError: {text}")
        return
    level.samples.append(Sample(p.era, call.is_write, elapsed))


async def run_level(proxy: ProxyProcess, plans: list[Plan], level: Level) -> None:
    gate = Gate(len(plans))
    proxy.reset_peaks()
    async with anyio.create_task_group() as tg:
        connecting = time.perf_counter()
        for p in plans:
            tg.start_soon(run_session, proxy.url, p, gate, level)
        with anyio.move_on_after(CONNECT_TIMEOUT_S) as waited:
            await gate.all_connected.wait()
        if waited.cancelled_caught:
            level.errors.append(f"only {gate.connected} of {len(plans)} sessions connected in {CONNECT_TIMEOUT_S:g}s")
        level.connect_s = time.perf_counter() - connecting
        cpu_before = (*proxy.cpu(), time.process_time())
        started = time.perf_counter()
        gate.start.set()
        with anyio.move_on_after(LEVEL_TIMEOUT_S) as waited:
            await gate.all_finished.wait()
        level.wall_s = time.perf_counter() - started
        if waited.cancelled_caught:
            level.errors.append(f"{gate.sessions - gate.finished} sessions not done within {LEVEL_TIMEOUT_S:g}s")
        cpu_after = (*proxy.cpu(), time.process_time())
        level.load = os.getloadavg()[0]
        level.cpu = {k: b - a for k, a, b in zip(("proxy", "backends", "bench"), cpu_before, cpu_after, strict=True)}
        level.proxy_peak_mib, level.children_peak_mib = proxy.peaks_mib()
        gate.release.set()
