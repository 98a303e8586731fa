"""The MCP Inspector CLI as a black-box client of `mcp-spec-proxy` over stdio, in front of the toy backend.

The Inspector starts the real console script itself (`-- mcp-spec-proxy --config ... --state-dir ...`), so
these tests see exactly what an MCP client sees: JSON on stdout with `--format json -q`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.backends import BackendCommand, inspector_argv
from tests.harness import PROXY_COMMAND, recorded, toy


def proxy_target(tmp_path: Path, review: str = "human") -> BackendCommand:
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {"toy": toy(tmp_path / "rec")}, "review": {"default": review}}))
    args = ["--config", str(config), "--state-dir", str(tmp_path / "state"), "--log-level", "WARNING"]
    return BackendCommand(PROXY_COMMAND, args, {})


def inspect(target: BackendCommand, *options: str) -> tuple[int, dict[str, Any], str]:
    """Run the Inspector with `options`; (exit status, stdout parsed as JSON, stderr)."""
    argv = inspector_argv(target, *options, "--format", "json", "-q")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.stdout.strip(), f"no output (exit {done.returncode}): {done.stderr}"
    return done.returncode, json.loads(done.stdout), done.stderr


def call(target: BackendCommand, tool: str, *args: str) -> tuple[int, dict[str, Any], str]:
    return inspect(target, "--method", "tools/call", "--tool-name", tool, "--tool-arg", *args)


def texts(result: dict[str, Any]) -> list[str]:
    return [block["text"] for block in result["content"] if block["type"] == "text"]


def test_tools_list_shows_namespaced_tools_with_annotations_and_intent(tmp_path: Path) -> None:
    status, out, stderr = inspect(proxy_target(tmp_path), "--method", "tools/list")
    assert status == 0, stderr
    tools = {tool["name"]: tool for tool in out["result"]["tools"]}
    assert {"toy__echo", "toy__record"} <= set(tools)
    assert all(name.startswith("toy__") for name in tools)

    echo = tools["toy__echo"]
    assert echo["annotations"] == {"readOnlyHint": True}
    assert echo["inputSchema"] == {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    record = tools["toy__record"]
    assert record["annotations"] == {"readOnlyHint": False, "destructiveHint": False}
    assert record["inputSchema"]["required"] == ["value"]  # `intent` is offered, never required
    assert record["inputSchema"]["properties"]["intent"]["type"] == "string"
    assert record["inputSchema"]["properties"]["value"] == {"type": "string"}


def test_tools_call_of_a_read_returns_the_backend_text(tmp_path: Path) -> None:
    status, out, stderr = call(proxy_target(tmp_path), "toy__echo", "text=hi")
    assert status == 0, stderr
    assert out["result"]["isError"] is False
    assert texts(out["result"]) == ["hi"]


def test_tools_call_of_a_write_under_deny_is_blocked_and_never_reaches_the_backend(tmp_path: Path) -> None:
    status, out, stderr = call(proxy_target(tmp_path, "deny"), "toy__record", "value=v1", "intent=the user asked")
    assert status == 5  # the Inspector's exit status for a tool result with isError: true
    assert json.loads(stderr)["error"]["code"] == "tool_is_error"
    assert out["result"]["isError"] is True
    [text] = texts(out["result"])
    assert text.startswith("Blocked at the write barrier: toy__record was not executed.")
    assert "Reviewer deny" in text
    assert not (tmp_path / "rec").exists()


def test_tools_call_of_a_write_under_allow_reaches_the_backend_with_intent_stripped(tmp_path: Path) -> None:
    status, out, stderr = call(proxy_target(tmp_path, "allow"), "toy__record", "value=v1", "intent=the user asked")
    assert status == 0, stderr
    assert out["result"]["isError"] is False
    assert texts(out["result"]) == ["recorded v1"]
    assert [json.loads(line) for line in recorded(tmp_path / "rec")] == [{"value": "v1"}]


def test_tools_call_of_a_write_without_intent_is_valid_as_it_is_for_the_backend(tmp_path: Path) -> None:
    status, out, stderr = call(proxy_target(tmp_path, "allow"), "toy__record", "value=v1")
    assert status == 0, stderr
    assert texts(out["result"]) == ["recorded v1"]
    assert [json.loads(line) for line in recorded(tmp_path / "rec")] == [{"value": "v1"}]


@pytest.mark.parametrize("review", ["human", "deny"])
def test_load_of_concurrent_reads_completes_without_errors(tmp_path: Path, review: str) -> None:
    status, out, stderr = inspect(
        proxy_target(tmp_path, review),
        "--method",
        "tools/call",
        "--tool-name",
        "toy__echo",
        "--tool-arg",
        "text=x",
        "--load",
        "--load-requests",
        "200",
        "--load-concurrency",
        "8",
    )
    assert status == 0, stderr
    summary = out["result"]
    assert summary["tool"] == "toy__echo"
    assert summary["requests"] == 200
    assert summary["ok"] == 200
    assert summary["errors"] == 0
    assert summary["toolErrors"] == 0
    assert summary["errorMessages"] == []
