"""`mcp-spec-proxy init` as a user runs it: a home with Claude Desktop's, Cursor's and VS Code's files
where those clients keep them (HOME and XDG_CONFIG_HOME point at a temporary home), and a starter
servers.yaml written from them that `check` and `tools` then accept."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import yaml

from mcp_spec_proxy.config.clients import client_files
from tests.harness import PROXY_COMMAND, proxy_env, toy
from tests.test_client_configs import VS_CODE


def run_proxy(home: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**proxy_env(), "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config")}
    return subprocess.run(
        [PROXY_COMMAND, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd, stdin=subprocess.DEVNULL
    )


def a_home(tmp_path: Path) -> Path:
    """Claude Desktop (with its own settings and the proxy itself registered), Cursor and VS Code, as on Linux."""
    home = tmp_path / "home"
    claude = home / "config" / "Claude" / "claude_desktop_config.json"
    claude.parent.mkdir(parents=True)
    claude.write_text(
        json.dumps(
            {
                "globalShortcut": "Alt+Space",
                "mcpServers": {
                    "toy": toy(tmp_path / "rec"),
                    "proxy": {"command": "/opt/mcp-spec-proxy/.venv/bin/mcp-spec-proxy", "args": ["--config", "x"]},
                    "Brave Search": {"command": "npx", "args": ["-y", "@brave/brave-search-mcp-server"]},
                },
            },
            indent=2,
        )
    )
    cursor = home / ".cursor" / "mcp.json"
    cursor.parent.mkdir()
    # The same toy as Claude Desktop's (kept once), and another server under a name Claude Desktop uses.
    cursor.write_text(
        json.dumps({"mcpServers": {"toy": toy(tmp_path / "rec"), "brave-search": {"command": "npx"}}}, indent=2)
    )
    vs_code = home / "config" / "Code" / "User" / "mcp.json"
    vs_code.parent.mkdir(parents=True)
    entry = toy(tmp_path / "rec-vscode")
    vs_code.write_text(
        VS_CODE.replace("@COMMAND@", json.dumps(entry["command"]))
        .replace("@ARGS@", json.dumps(entry["args"]))
        .replace("@RECORD@", json.dumps(str(tmp_path / "rec-vscode")))
        .replace("${env:HOME}", "/home/ada")
    )
    return home


def test_init_writes_a_servers_yaml_from_every_client_found_and_says_what_it_did(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    work = tmp_path / "work"
    work.mkdir()

    result = run_proxy(home, work, "init")

    assert result.returncode == 0, result.stderr
    said = result.stdout
    assert (
        f"Claude Desktop: {home}/config/Claude/claude_desktop_config.json: 3 servers (toy, proxy, Brave Search)" in said
    )
    assert f"Cursor: {home}/.cursor/mcp.json: 2 servers (toy, brave-search)" in said
    assert f"VS Code: {home}/config/Code/User/mcp.json: 2 servers (toy, github)" in said
    assert "note: Claude Desktop: left out 'proxy': it runs mcp-spec-proxy itself" in said
    assert "wrote servers.yaml: 5 servers (toy, brave-search, brave-search-cursor, toy-vs-code, github)" in said
    written = yaml.safe_load((work / "servers.yaml").read_text())
    assert list(written["servers"]) == ["toy", "brave-search", "brave-search-cursor", "toy-vs-code", "github"]
    assert written["servers"]["toy-vs-code"]["type"] == "stdio"
    assert "dev" not in written["servers"]["toy-vs-code"]  # VS Code's own key
    assert written["review"] == {"default": "human", "fallback": "console", "intent": True}
    assert stat.S_IMODE((work / "servers.yaml").stat().st_mode) == 0o600  # entries may carry tokens

    checked = run_proxy(home, work, "check")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("servers.yaml: ok (5 servers enabled)")


def test_the_written_file_serves_the_clients_servers(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    assert run_proxy(home, work, "init").returncode == 0
    only_toys = yaml.safe_load((work / "servers.yaml").read_text())
    only_toys["servers"] = {name: entry for name, entry in only_toys["servers"].items() if name.startswith("toy")}
    (work / "servers.yaml").write_text(yaml.safe_dump(only_toys))  # npx would download its servers

    listed = run_proxy(home, work, "--state-dir", str(tmp_path / "state"), "tools")

    assert listed.returncode == 0, listed.stderr
    assert "toy__" in listed.stdout and "toy-vs-code__" in listed.stdout


def test_init_refuses_to_overwrite_a_file_without_force(tmp_path: Path) -> None:
    home = a_home(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "servers.yaml").write_text("servers: {}\n# mine\n")

    refused = run_proxy(home, work, "init")

    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "Error: servers.yaml exists — pass --force to overwrite it, or --config OTHER.yaml to write another file"
    )
    assert (work / "servers.yaml").read_text() == "servers: {}\n# mine\n"
    forced = run_proxy(home, work, "init", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "toy" in yaml.safe_load((work / "servers.yaml").read_text())["servers"]


def test_init_writes_where_config_points(tmp_path: Path) -> None:
    home = a_home(tmp_path)

    result = run_proxy(home, tmp_path, "init", "--config", "proxy.yaml")

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "proxy.yaml").is_file()
    assert not (tmp_path / "servers.yaml").exists()


def test_init_with_no_client_found_writes_nothing_and_says_where_it_looked(tmp_path: Path) -> None:
    home = tmp_path / "empty-home"
    home.mkdir()

    result = run_proxy(home, tmp_path, "init")

    assert result.returncode == 1
    assert f"Cursor: no file at {home}/.cursor/mcp.json" in result.stdout
    assert result.stderr.strip() == (
        "Error: no MCP client's servers found, so servers.yaml was not written — write `servers:` by hand"
        " (docs/CONFIG.md#serversyaml-reference), or start from the servers.yaml the proxy ships"
    )
    assert not (tmp_path / "servers.yaml").exists()


def test_a_vs_code_input_is_written_and_named_as_the_edit_to_make(tmp_path: Path) -> None:
    home = tmp_path / "home"
    vs_code = home / "config" / "Code" / "User" / "mcp.json"
    vs_code.parent.mkdir(parents=True)
    vs_code.write_text(
        VS_CODE.replace('"${env:HOME}"', '"${input:perplexity-key}"')
        .replace("@COMMAND@", '"npx"')
        .replace("@ARGS@", "[]")
        .replace("@RECORD@", '"rec"')
    )

    result = run_proxy(home, tmp_path, "init")

    assert result.returncode == 0, result.stderr
    assert "before it serves, edit servers.yaml:" in result.stdout
    assert "export the value as PERPLEXITY_KEY and write ${PERPLEXITY_KEY}" in result.stdout


def test_the_client_files_are_where_each_client_keeps_them_on_macos_and_linux(tmp_path: Path) -> None:
    home, xdg = Path("/Users/ada"), Path("/x/config")

    mac = dict(client_files(home, xdg, "darwin"))
    linux = dict(client_files(Path("/home/ada"), xdg, "linux"))

    assert mac == {
        "Claude Desktop": home / "Library/Application Support/Claude/claude_desktop_config.json",
        "Cursor": home / ".cursor/mcp.json",
        "VS Code": home / "Library/Application Support/Code/User/mcp.json",
    }
    assert linux == {
        "Claude Desktop": xdg / "Claude/claude_desktop_config.json",
        "Cursor": Path("/home/ada/.cursor/mcp.json"),
        "VS Code": xdg / "Code/User/mcp.json",
    }
    assert sys.platform != "win32"
