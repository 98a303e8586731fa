"""The config files MCP clients already have, given to `--config` as they are: Claude Desktop's
`claude_desktop_config.json` (with its own keys beside `mcpServers`), Cursor's `mcp.json` and VS Code's
`mcp.json` (comments, `inputs`, `type: stdio`). The proxy reads their servers and leaves the client's
own keys alone; a servers.yaml keeps every unknown key an error.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mcp_spec_proxy.config.schema import load_config
from mcp_spec_proxy.errors import ConfigError
from tests.harness import PROXY_COMMAND, proxy_env, toy


def run_proxy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROXY_COMMAND, *args], capture_output=True, text=True, timeout=120, env=proxy_env(), stdin=subprocess.DEVNULL
    )


def claude_desktop(tmp_path: Path) -> dict[str, object]:
    """A Claude Desktop file as the app writes it: its settings beside the servers the user added."""
    return {
        "globalShortcut": "Alt+Space",
        "isUsingBuiltInNodeForMcp": True,
        "mcpServers": {
            "toy": toy(tmp_path / "rec"),
            "filesystem": {
                "command": "npx",
                "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/ada/Desktop"],
            },
        },
        "preferences": {"menuBarEnabled": False, "quickEntryShortcut": "double-tap-option"},
    }


VS_CODE = """\
{
  // Inputs are prompted on first server start, then stored securely by VS Code.
  "inputs": [
    {
      "type": "promptString",
      "id": "perplexity-key",
      "description": "Perplexity API Key",
      "password": true,
    },
  ],
  "servers": {
    /* a local server */
    "toy": {
      "type": "stdio",
      "command": @COMMAND@,
      "args": @ARGS@,
      "env": {"TOY_RECORD_FILE": @RECORD@, "USER_HOME": "${env:HOME}"},
      "dev": {"watch": "src/**/*.ts", "debug": {"type": "node"}},
    },
    "github": {
      "type": "http",
      "url": "https://api.githubcopilot.com/mcp/",
    },
  },
}
"""


def vs_code(tmp_path: Path) -> str:
    entry = toy(tmp_path / "rec")
    return (
        VS_CODE.replace("@COMMAND@", json.dumps(entry["command"]))
        .replace("@ARGS@", json.dumps(entry["args"]))
        .replace("@RECORD@", json.dumps(str(tmp_path / "rec")))
    )


CURSOR = {
    "mcpServers": {
        "time": {"command": "npx", "args": ["-y", "mcp-server-time"], "env": {"TZ": "Europe/Paris"}},
        "linear": {"url": "https://mcp.linear.app/mcp", "headers": {"Authorization": "Bearer ${env:LINEAR_TOKEN}"}},
    }
}


def test_check_accepts_a_real_claude_desktop_file_and_names_the_keys_it_leaves(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(claude_desktop(tmp_path), indent=2))

    result = run_proxy("--config", str(path), "check")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"{path}: ok (2 servers enabled)"
    assert "the client's own keys, left alone: globalShortcut, isUsingBuiltInNodeForMcp, preferences" in result.stdout


def test_tools_serves_the_servers_of_a_claude_desktop_file(tmp_path: Path) -> None:
    data = claude_desktop(tmp_path)
    data["mcpServers"] = {"toy": toy(tmp_path / "rec")}  # npx would download a server: the toy alone
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(data, indent=2))

    result = run_proxy("--config", str(path), "--state-dir", str(tmp_path / "state"), "tools")

    assert result.returncode == 0, result.stderr
    assert "toy__" in result.stdout


def test_check_accepts_a_vs_code_mcp_json_with_comments_inputs_and_stdio_type(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(vs_code(tmp_path))

    result = run_proxy("--config", str(path), "check")

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"{path}: ok (2 servers enabled)"
    assert "the client's own keys, left alone: inputs" in result.stdout


def test_a_vs_code_file_reads_env_references_and_sets_dev_aside(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(vs_code(tmp_path))

    config = load_config(path, {"HOME": "/home/ada"})

    assert config.servers["toy"].env["USER_HOME"] == "/home/ada"
    assert config.servers["toy"].transport == "stdio"
    assert config.servers["github"].transport == "http"


def test_a_vs_code_input_reference_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(vs_code(tmp_path).replace('"${env:HOME}"', '"${input:perplexity-key}"'))

    result = run_proxy("--config", str(path), "check")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert f"{path}:17: servers.toy.env.USER_HOME: ${{input:perplexity-key}}" in lines[0]
    assert "export the value as PERPLEXITY_KEY and write ${PERPLEXITY_KEY}" in lines[0]


def test_check_accepts_a_cursor_mcp_json(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(CURSOR, indent=2))

    config = load_config(path, {"LINEAR_TOKEN": "lin_123"})

    assert config.servers["linear"].headers == {"Authorization": "Bearer lin_123"}
    assert config.servers["time"].env == {"TZ": "Europe/Paris"}


def test_an_env_file_the_proxy_cannot_read_is_told_with_its_fix(tmp_path: Path) -> None:
    data = {"mcpServers": {"api": {"command": "npx", "envFile": "${userHome}/.env"}}}
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(data, indent=2))

    with pytest.raises(ConfigError) as caught:
        load_config(path, {"userHome": "/home/ada"})

    assert caught.value.key == "mcpServers.api.envFile"
    assert "copy its variables into `env`" in caught.value.fix


def test_a_servers_yaml_still_refuses_an_unknown_top_level_key(tmp_path: Path) -> None:
    path = tmp_path / "servers.yaml"
    path.write_text("servers:\n  a: {command: npx}\nglobalShortcut: Alt+Space\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.key == "globalShortcut"
    assert caught.value.problem == "unknown key"


def test_the_proxy_sections_beside_a_client_file_servers_are_still_checked(tmp_path: Path) -> None:
    data = {**claude_desktop(tmp_path), "review": {"default": "stron"}}
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps(data, indent=2))

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.key == "review.default"


def test_the_proxy_registered_in_the_clients_file_is_not_served_behind_itself(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    data = claude_desktop(tmp_path)
    data["mcpServers"] = {
        "toy": toy(tmp_path / "rec"),
        # As the README says to register it, pointed at this very file: served, it would start itself.
        "proxy": {"command": PROXY_COMMAND, "args": ["--config", str(path)]},
    }
    path.write_text(json.dumps(data, indent=2))

    checked = run_proxy("--config", str(path), "check")
    listed = run_proxy("--config", str(path), "--state-dir", str(tmp_path / "state"), "tools")

    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines()[0] == f"{path}: ok (1 servers enabled)"
    assert "note: server 'proxy' is left out: it starts mcp-spec-proxy itself" in checked.stdout
    assert listed.returncode == 0, listed.stderr
    assert {line.split("__")[0] for line in listed.stdout.splitlines()} == {"toy"}
