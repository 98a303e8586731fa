"""Backends that crash, hang, never start, change their tools, or outlive nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.errors import BACKEND_CLOSED
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from tests.harness import ERAS, PROXY_COMMAND, call_error, proxied, spawned, text_of, toy

pytestmark = pytest.mark.anyio


class ToolChanges:
    """Counts `notifications/tools/list_changed` from the proxy, and lets a test wait for the next."""

    def __init__(self) -> None:
        self.count = 0
        self._event = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.count += 1
            self._event.set()

    async def next(self) -> None:
        await self._event.wait()
        self._event = anyio.Event()


async def wait_for_tool(client: Any, changes: ToolChanges, name: str, present: bool = True) -> None:
    with anyio.fail_after(30):
        while (name in [t.name for t in (await client.list_tools()).tools]) is not present:
            await changes.next()


async def test_backend_that_crashes_comes_back(tmp_path: Path) -> None:
    changes = ToolChanges()
    cfg = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "deny"}}
    async with proxied(cfg, tmp_path / "state", messages=changes) as p:
        crashed = await call_error(p.client, "toy__crash", {})
        assert crashed.code == BACKEND_CLOSED
        assert crashed.message.startswith("backend 'toy' closed its connection during tools/call crash")
        await wait_for_tool(p.client, changes, "toy__echo")
        assert text_of(await p.client.call_tool("toy__echo", {"text": "back"})) == "back"
        assert p.proxy.backends.get("toy").restarts == 1


async def test_missing_command_leaves_the_other_backends_working(tmp_path: Path) -> None:
    cfg = {"servers": {"broken": {"command": "no-such-mcp-server"}, "toy": toy(tmp_path / "rec")}}
    async with proxied(cfg, tmp_path / "state") as p:
        names = [t.name for t in (await p.client.list_tools()).tools]
        assert "toy__echo" in names
        assert not any(name.startswith("broken__") for name in names)
        assert text_of(await p.client.call_tool("toy__echo", {"text": "fine"})) == "fine"
        error = p.proxy.backends.get("broken").last_error or ""
    assert "backend 'broken' failed to start: command 'no-such-mcp-server' not found" in error


async def test_backend_that_hangs_at_start_does_not_hold_up_the_others(tmp_path: Path) -> None:
    cfg = {
        "servers": {
            "stuck": toy(tmp_path / "rec", "--hang-at-start", startup_timeout=1),
            "toy": toy(tmp_path / "rec"),
        }
    }
    async with proxied(cfg, tmp_path / "state") as p:
        assert text_of(await p.client.call_tool("toy__echo", {"text": "fine"})) == "fine"
        stuck = p.proxy.backends.get("stuck")
        with anyio.fail_after(30):
            await stuck.first_attempt.wait()  # the proxy serves before it gives up; it gives up on time
        assert stuck.status == "unavailable"
        assert "did not finish its handshake within 1s" in (stuck.last_error or "")


@pytest.mark.parametrize("backend_era", ["--legacy-only", "--modern"])
async def test_list_changed_from_a_backend_reaches_the_client(tmp_path: Path, backend_era: str) -> None:
    changes = ToolChanges()
    flags = [backend_era] if backend_era == "--legacy-only" else []
    cfg = {"servers": {"toy": toy(tmp_path / "rec", *flags)}}
    async with proxied(cfg, tmp_path / "state", messages=changes) as p:
        assert "toy__extra" not in [t.name for t in (await p.client.list_tools()).tools]
        await p.client.call_tool("toy__add_tool", {})
        with anyio.fail_after(30):
            await changes.next()  # the proxy tells its client, not just its catalog
        await wait_for_tool(p.client, changes, "toy__extra")


async def test_changed_definition_is_held_until_accepted(tmp_path: Path) -> None:
    changes = ToolChanges()
    cfg = {"servers": {"toy": toy(tmp_path / "rec", "--legacy-only")}, "review": {"default": "deny"}}
    async with proxied(cfg, tmp_path / "state", messages=changes) as p:
        assert p.proxy.catalog.lookup("toy__echo").effect == "read"
        await p.client.call_tool("toy__rug_pull", {})
        with anyio.fail_after(30):
            while p.proxy.catalog.lookup("toy__echo").reason != "changed-definition":
                await changes.next()
        held = await p.client.call_tool("toy__echo", {"text": "x", "intent": "test"})
        assert held.is_error and "Blocked at the write barrier" in text_of(held)

        assert p.proxy.catalog.lookup("toy__echo").effect == "write"
        # What `mcp-spec-proxy tools accept toy__echo` does from another process; the running
        # proxy applies it at the next call of that tool.
        assert FingerprintStore(p.state.fingerprints).accept("toy/echo")
        assert text_of(await p.client.call_tool("toy__echo", {"text": "y"})) == "y"
        assert p.proxy.catalog.lookup("toy__echo").effect == "read"


async def test_changed_definition_survives_a_restart(tmp_path: Path) -> None:
    cfg = {"servers": {"toy": toy(tmp_path / "rec", "--legacy-only")}, "review": {"default": "deny"}}
    changes = ToolChanges()
    async with proxied(cfg, tmp_path / "state", messages=changes) as p:
        await p.client.call_tool("toy__rug_pull", {})
        with anyio.fail_after(30):
            while p.proxy.catalog.lookup("toy__echo").reason != "changed-definition":
                await changes.next()
    # A fresh toy lists the original definition again, which differs from the latest seen but
    # equals the accepted one: it is trusted; the store still records the unaccepted change.
    assert FingerprintStore(tmp_path / "state" / "fingerprints.json").pending() == ["toy/echo"]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


async def test_no_child_process_outlives_the_proxy(tmp_path: Path) -> None:
    config_file = tmp_path / "servers.yaml"
    config_file.write_text(
        yaml.safe_dump({"servers": {"a": toy(tmp_path / "rec"), "b": toy(tmp_path / "rec", "--legacy-only")}})
    )
    process = await anyio.open_process(
        [PROXY_COMMAND, "--config", str(config_file), "--state-dir", str(tmp_path / "state")]
    )
    async with process:
        assert process.stdin is not None and process.stderr is not None
        # The proxy logs once every backend has had its first try; then its children are up.
        with anyio.fail_after(60):
            buffer = b""
            async for chunk in process.stderr:
                buffer += chunk
                if b"serving" in buffer and b"tools from" in buffer:
                    break
        children = _children(process.pid)
        assert len(children) == 2
        pidfds = [os.pidfd_open(child) for child in children]
        await process.stdin.aclose()  # the client goes away
        with anyio.fail_after(30):
            assert await process.wait() == 0
            for fd in pidfds:
                await anyio.wait_readable(fd)  # readable once that process has exited
                os.close(fd)
    assert all(not Path(f"/proc/{child}").exists() or _is_zombie(child) for child in children)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_audit_log_and_fingerprints_are_whole_after_the_proxy_is_killed(tmp_path: Path) -> None:
    cfg = {"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": "allow"}}
    before = set(_children(os.getpid()))
    with pytest.raises(BaseException) as lost:  # the connection dies under the client: that is the test
        async with spawned(cfg, tmp_path) as client:
            for value in range(3):
                await client.call_tool("toy__record", {"value": str(value), "intent": "x"})
            (proxy_pid,) = [pid for pid in _children(os.getpid()) if pid not in before]
            os.kill(proxy_pid, signal.SIGKILL)
            await client.call_tool("toy__echo", {"text": "gone"})
    assert lost.value is not None
    events = read_audit(tmp_path / "state" / "audit.jsonl")
    assert [e["event"] for e in events] == ["held", "verdict", "forwarded"] * 3
    assert FingerprintStore(tmp_path / "state" / "fingerprints.json").keys()[0] == "toy/add_tool"


@pytest.mark.parametrize("mode", ERAS)
async def test_list_changed_reaches_a_client_of_the_real_stdio_proxy(tmp_path: Path, mode: str) -> None:
    changes = ToolChanges()
    cfg = {"servers": {"toy": toy(tmp_path / "rec")}}
    async with spawned(cfg, tmp_path, mode=mode, messages=changes) as client:
        assert "toy__extra" not in [t.name for t in (await client.list_tools()).tools]
        if mode == "legacy":  # the handshake era hears notifications/tools/list_changed pushed
            await client.call_tool("toy__add_tool", {})
            with anyio.fail_after(30):
                await changes.next()
        else:  # the 2026-07-28 era hears it on its subscriptions/listen stream
            async with client.listen(tools_list_changed=True) as subscription:
                await client.call_tool("toy__add_tool", {})
                with anyio.fail_after(30):
                    async for _event in subscription:
                        break
        assert "toy__extra" in [t.name for t in (await client.list_tools()).tools]
