"""Stdio backends spawned before the SDK is imported (`launch`, `prespawn`), adopted on first connection.

Ground truth is outside the proxy: each backend is started through a shell that appends its PID
to a file before it becomes the toy server, so the test knows every process ever spawned for it,
and reads /proc for who their parent is and whether they still run. The adoption itself is named
by a DEBUG line with the PID; the ledger shows a write went through the adopted pipes.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client

from mcp_spec_proxy import launch
from mcp_spec_proxy.config.commands import default_environment
from mcp_spec_proxy.config.options import serving_files
from mcp_spec_proxy.prespawn import Prespawned, SpawnKey
from tests.harness import PROXY_COMMAND, TOY, recorded, text_of

pytestmark = pytest.mark.anyio

ADOPTED = re.compile(r"backend '(\w+)': adopted its process started at launch \(pid (\d+)\)")


def counted(pids: Path, script: str, record: Path) -> dict[str, Any]:
    """A server run by `sh -c`: it appends its PID to `pids`, then runs `script`."""
    return {
        "command": "/bin/sh",
        "args": ["-c", f"echo $$ >> {shlex.quote(str(pids))}; {script}"],
        "env": {"TOY_RECORD_FILE": str(record)},
    }


def toy_exec() -> str:
    return f"exec {shlex.quote(sys.executable)} {shlex.quote(str(TOY))}"


def spawned(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def parent_cmdline(pid: int) -> str:
    ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    return Path(f"/proc/{ppid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def write_config(tmp: Path, servers: dict[str, Any], review: str = "deny") -> Path:
    path = tmp / "servers.yaml"
    path.write_text(yaml.safe_dump({"servers": servers, "review": {"default": review}}))
    return path


def proxy_params(config: Path, state: Path) -> StdioServerParameters:
    args = ["--config", str(config), "--state-dir", str(state), "--no-console", "--log-level", "DEBUG"]
    return StdioServerParameters(command=PROXY_COMMAND, args=args)


async def test_the_proxy_adopts_the_backend_it_spawned_before_loading(tmp_path: Path) -> None:
    pids, ledger = tmp_path / "pids", tmp_path / "ledger"
    config = write_config(tmp_path, {"toy": counted(pids, toy_exec(), ledger)}, review="allow")
    with anyio.fail_after(60), open(tmp_path / "stderr.log", "w") as errlog:
        async with Client(stdio_client(proxy_params(config, tmp_path / "state"), errlog=errlog)) as client:
            assert "toy__echo" in [t.name for t in (await client.list_tools()).tools]
            assert text_of(await client.call_tool("toy__echo", {"text": "hi"})) == "hi"
            written = await client.call_tool("toy__record", {"value": "7", "intent": "test"})
            assert not written.is_error, text_of(written)
            [pid] = spawned(pids)  # one process only: adopted, not spawned again
            assert alive(pid) and "mcp-spec-proxy" in parent_cmdline(pid)
    log = (tmp_path / "stderr.log").read_text()
    assert ADOPTED.findall(log) == [("toy", str(pid))], log
    assert len(recorded(ledger)) == 1  # the write went out through the adopted pipes
    assert not alive(pid)


async def test_a_backend_that_died_before_adoption_is_started_again(tmp_path: Path) -> None:
    pids, marker = tmp_path / "pids", tmp_path / "started-once"
    m = shlex.quote(str(marker))
    script = f"if [ -e {m} ]; then {toy_exec()}; fi; touch {m}; exit 3"  # the first start fails
    config = write_config(tmp_path, {"toy": counted(pids, script, tmp_path / "ledger")})
    with anyio.fail_after(60), open(tmp_path / "stderr.log", "w") as errlog:
        async with Client(stdio_client(proxy_params(config, tmp_path / "state"), errlog=errlog)) as client:
            # The dead one is not adopted: the first connection spawns anew, so the first list has it.
            assert "toy__echo" in [t.name for t in (await client.list_tools()).tools]
            assert text_of(await client.call_tool("toy__echo", {"text": "hi"})) == "hi"
            first, second = spawned(pids)
            assert not alive(first) and alive(second)
    assert ADOPTED.findall((tmp_path / "stderr.log").read_text()) == []
    assert not alive(second)


def test_backends_never_adopted_are_stopped_when_the_proxy_exits(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    stubborn = "trap '' TERM; while :; do sleep 0.1; done"  # ignores stdin's end and SIGTERM
    servers = {
        "toy": counted(pids, toy_exec(), tmp_path / "ledger"),
        "stubborn": counted(pids, stubborn, tmp_path / "ledger2"),
    }
    config = write_config(tmp_path, servers)
    # The backends start, then the command fails before serving: the bearer token's variable is unset.
    unset = "MCP_SPEC_PROXY_TEST_UNSET_TOKEN"
    args = ["--config", str(config), "--state-dir", str(tmp_path / "state"), "--http", ":0", "--token-env", unset]
    env = {key: value for key, value in os.environ.items() if key != unset}
    result = subprocess.run(
        [PROXY_COMMAND, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, env=env
    )
    assert result.returncode == 1 and unset in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    started = spawned(pids)
    assert len(started) == 2, started  # both were spawned before the proxy loaded
    assert [pid for pid in started if alive(pid)] == []


def test_a_config_whose_backend_changed_is_not_adopted(tmp_path: Path) -> None:
    """The key is every spawn parameter: a process spawned with other arguments is refused and stopped."""
    config = write_config(tmp_path, {"toy": counted(tmp_path / "pids", toy_exec(), tmp_path / "ledger")})
    from mcp_spec_proxy.config.schema import load_config

    loaded = load_config(config, {})
    log_dir = tmp_path / "logs"
    early = Prespawned()
    assert early.spawn(loaded, log_dir) == ["toy"]
    [pid] = early.unclaimed()
    server = loaded.servers["toy"]
    env = default_environment() | server.env
    other = SpawnKey.of("toy", "/bin/sh", [*server.args, "x"], env, None, str(log_dir / "toy.log"))
    assert early.claim(other) is None
    assert early.unclaimed() == []
    launch.stop(early)  # what `launch.main` does when the command ends
    assert not alive(pid)


def test_each_launch_owns_its_early_processes(tmp_path: Path) -> None:
    # No registry outlives its object: what one launch spawned, another never sees nor adopts.
    from mcp_spec_proxy.config.schema import load_config

    config = load_config(write_config(tmp_path, {"toy": counted(tmp_path / "pids", toy_exec(), tmp_path / "l")}), {})
    first, second = Prespawned(), Prespawned()
    assert first.spawn(config, tmp_path / "logs") == ["toy"]
    [pid] = first.unclaimed()
    assert second.unclaimed() == [] and second.leftover() == []
    launch.stop(second)
    assert alive(pid)
    launch.stop(first)
    assert not alive(pid) and first.unclaimed() == []


def test_the_early_environment_is_the_sdks() -> None:
    assert default_environment() == get_default_environment()


def test_a_port_in_use_spawns_nothing_early() -> None:
    """The command refuses an address it cannot listen on before any backend starts; so does this."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert serving_files(["--http", f"127.0.0.1:{port}"]) is None
        assert serving_files(["--console", f":{port}"]) is None
    assert serving_files(["--http", f"127.0.0.1:{port}"]) == ("servers.yaml", None)


@pytest.mark.parametrize(
    ("argv", "files"),
    [
        ([], ("servers.yaml", None)),
        (["--config", "a.yaml", "--state-dir", "s", "--no-console"], ("a.yaml", "s")),
        (["-c", "a.yaml", "--http", ":8765", "--log-level=DEBUG"], ("a.yaml", None)),
        (["--config=a.yaml"], ("a.yaml", None)),
        (["--config", "a.yaml", "tools"], None),
        (["check"], None),
        (["--help"], None),
        (["--version"], None),
        (["--config"], None),
        (["--unknown", "x"], None),
        (["--http", "nonsense"], None),  # the command line explains it
    ],
)
def test_only_the_serving_command_spawns_early(argv: list[str], files: tuple[str, str | None] | None) -> None:
    assert serving_files(argv) == files


def test_a_failure_before_loading_is_one_line_and_the_command_still_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import mcp_spec_proxy.cli

    ran: list[tuple[str, Any]] = []

    def broken(argv: list[str], early: Prespawned) -> None:
        raise OSError("no such thing")

    monkeypatch.setattr(launch, "start_backends", broken)
    monkeypatch.setattr(mcp_spec_proxy.cli, "main", lambda prog_name, obj: ran.append((prog_name, obj)))
    launch.main()
    [(prog, obj)] = ran
    assert prog == "mcp-spec-proxy" and isinstance(obj["prespawned"], Prespawned)  # handed down, not global
    [record] = caplog.records
    assert record.levelname == "WARNING" and "OSError: no such thing" in record.getMessage()
    assert record.exc_info is None  # one line, no traceback


def test_the_launcher_parses_argv_with_the_serving_commands_own_options() -> None:
    # The console script reads argv before the SDK loads; an option of the serving command it did
    # not know would send every start down the late path (safe, but slow), one it knew wrongly
    # would misread the config's path. One declaration (`options.serving_options`) serves both.
    import click

    from mcp_spec_proxy.cli import main
    from mcp_spec_proxy.config.options import serving_options

    probe = click.command(add_help_option=False)(serving_options(lambda **options: None))

    def table(command: click.Command) -> set[tuple[str, ...]]:
        return {(*param.opts, *param.secondary_opts) for param in command.params if isinstance(param, click.Option)}

    assert table(main) - table(probe) == {("--version",)}  # and --help, which `params` does not list
    assert serving_files(["--log-format", "json", "--allow-host", "a", "--telemetry", "t.jsonl"]) == (
        "servers.yaml",
        None,
    )
