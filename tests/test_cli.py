"""The `mcp-spec-proxy` console script as a user runs it: `check`, `tools`, `tools accept`, `explain`, serving errors.

Every test runs the installed command in a subprocess with its config and --state-dir under tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import yaml

from mcp_spec_proxy.tools.fingerprints import FingerprintStore, fingerprint
from tests.fixtures import toy_server
from tests.harness import PROXY_COMMAND, TOY, toy


def _toy_effects() -> dict[str, str]:
    """Every tool the toy lists (read from the fixture itself, so new toy tools need no edit here)."""
    listed: list[types.Tool] = toy_server.Toy(None).tools()
    return {
        f"toy__{tool.name}": "read" if tool.annotations and tool.annotations.read_only_hint else "write"
        for tool in listed
    }


TOY_TOOLS = _toy_effects()
CHANGED_WHY = "changed-definition: definition changed since first seen; accept it with `tools accept`"
ROW = re.compile(r"^(?P<name>\S+)  +(?P<effect>read|write) +(?P<why>\S.*?)(?:  \[review: (?P<review>\w+)\])?$")


def run_proxy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROXY_COMMAND, *args], capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL
    )


def write_config(tmp_path: Path, servers: dict[str, Any], **top: Any) -> Path:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump({"servers": servers, **top}))
    return path


def toy_config(tmp_path: Path, **extra_servers: Any) -> Path:
    return write_config(tmp_path, {"toy": toy(tmp_path / "rec"), **extra_servers})


def parse_rows(stdout: str) -> dict[str, tuple[str, str, str | None]]:
    """`tools` output as {name: (effect, reason, review mode shown for writes)}."""
    rows: dict[str, tuple[str, str, str | None]] = {}
    for line in stdout.splitlines():
        match = ROW.match(line)
        assert match, f"unexpected `tools` line: {line!r}"
        rows[match["name"]] = (match["effect"], match["why"], match["review"])
    return rows


def listed(config: Path, state: Path) -> dict[str, tuple[str, str, str | None]]:
    """`tools` output as parsed by `parse_rows`; fails the test unless it exited 0."""
    result = run_proxy("--config", str(config), "--state-dir", str(state), "tools")
    assert result.returncode == 0, result.stderr
    return parse_rows(result.stdout)


def effects(rows: dict[str, tuple[str, str, str | None]]) -> dict[str, str]:
    return {name: effect for name, (effect, _, _) in rows.items()}


def seed_old_definitions(state: Path, *tools: str) -> Path:
    """A store in which these toy tools were first seen with another description than the toy lists now."""
    store_path = state / "fingerprints.json"
    old = {
        f"toy/{name}": fingerprint(
            types.Tool(
                name=name,
                description="An older wording of this tool.",
                input_schema={"type": "object", "properties": {}},
                annotations=types.ToolAnnotations(read_only_hint=True),
            )
        )
        for name in tools
    }
    FingerprintStore(store_path).observe(old)
    return store_path


def env_without(name: str) -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != name}


# -- check -------------------------------------------------------------------------------------


def test_check_accepts_a_valid_config_and_exits_0(tmp_path: Path) -> None:
    config = toy_config(tmp_path)
    result = run_proxy("--config", str(config), "check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{config}: ok (1 servers enabled)"


def test_check_names_file_line_key_path_and_suggestion_for_an_unknown_key(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(
        "servers:\n"
        "  toy:\n"
        f"    command: {sys.executable}\n"
        "    timout: 5\n"  # line 4: a typo of `timeout`
        "review:\n"
        "  default: deny\n"
    )
    result = run_proxy("--config", str(config), "check")
    assert result.returncode == 1
    assert f"Error: {config}:4: servers.toy.timout: unknown key — did you mean `timeout`?" in result.stderr
    assert result.stdout == ""


def test_check_names_file_and_line_of_a_rule_that_does_not_compile_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text("servers: {}\nrules:\n  - review: allow\n    when: 'tool > 3'\n")
    result = run_proxy("--config", str(config), "check")
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: {config}:4: rules.0.when: `when` is not valid CEL: column 6: found no matching")


def test_check_names_a_missing_environment_variable_and_the_fix(tmp_path: Path) -> None:
    variable = "MCP_SPEC_PROXY_TEST_UNSET_TOKEN"
    config = tmp_path / "servers.yaml"
    config.write_text(
        "servers:\n  remote:\n    url: https://example.invalid/mcp\n"
        "    headers:\n      Authorization: Bearer ${" + variable + "}\n"
    )
    result = run_proxy("--config", str(config), "check", env=env_without(variable))
    assert result.returncode == 1
    assert f"servers.remote.headers.Authorization: environment variable {variable} is not set" in result.stderr
    assert f"export {variable}, or write ${{{variable}:-default}}" in result.stderr


def test_check_expands_a_set_environment_variable(tmp_path: Path) -> None:
    variable = "MCP_SPEC_PROXY_TEST_SET_TOKEN"
    config = tmp_path / "servers.yaml"
    config.write_text("servers:\n  remote:\n    url: ${" + variable + "}\n")
    result = run_proxy("--config", str(config), "check", env={**os.environ, variable: "https://example.invalid/mcp"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{config}: ok (1 servers enabled)"


def test_check_accepts_a_claude_desktop_json_file(tmp_path: Path) -> None:
    config = tmp_path / "claude_desktop_config.json"
    entry = toy(tmp_path / "rec")
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "toy": entry,
                    "off": {"command": sys.executable, "args": [str(TOY)], "disabled": True},
                }
            },
            indent=2,
        )
    )
    result = run_proxy("--config", str(config), "check")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{config}: ok (1 servers enabled)"


def test_check_names_mcpservers_key_in_a_claude_desktop_json_error(tmp_path: Path) -> None:
    config = tmp_path / "claude_desktop_config.json"
    config.write_text(json.dumps({"mcpServers": {"toy": {"comand": sys.executable}}}, indent=2))
    result = run_proxy("--config", str(config), "check")
    assert result.returncode == 1
    assert f"{config}:4: mcpServers.toy.comand: unknown key — did you mean `command`?" in result.stderr


# -- tools -------------------------------------------------------------------------------------


def test_tools_lists_every_toy_tool_with_effect_and_reason(tmp_path: Path) -> None:
    rows = listed(toy_config(tmp_path), tmp_path / "state")
    assert effects(rows) == TOY_TOOLS
    assert rows["toy__echo"] == ("read", "annotation: readOnlyHint: true", None)
    assert rows["toy__record"] == ("write", "annotation: readOnlyHint: false", "human")
    assert (tmp_path / "state" / "fingerprints.json").exists()


def test_tools_reports_a_server_that_cannot_start_and_still_lists_the_others(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-server"
    config = toy_config(tmp_path, ghost={"command": str(missing)})
    result = run_proxy("--config", str(config), "--state-dir", str(tmp_path / "state"), "tools")
    assert result.returncode == 0, result.stderr
    assert effects(parse_rows(result.stdout)) == TOY_TOOLS
    assert "ghost" not in result.stdout
    unavailable = [line for line in result.stderr.splitlines() if line.startswith("unavailable  ")]
    assert unavailable == [
        f"unavailable  ghost: backend 'ghost' failed to start: command '{missing}' does not exist — fix `command`"
    ]


def test_tools_shows_the_configured_review_mode_for_writes(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"toy": toy(tmp_path / "rec")}, review={"default": "deny"})
    rows = listed(config, tmp_path / "state")
    assert rows["toy__record"] == ("write", "annotation: readOnlyHint: false", "deny")
    assert rows["toy__echo"] == ("read", "annotation: readOnlyHint: true", None)


def test_tools_takes_config_and_state_dir_after_the_subcommand(tmp_path: Path) -> None:
    config, state = toy_config(tmp_path), tmp_path / "state"
    result = run_proxy("tools", "--config", str(config), "--state-dir", str(state))
    assert result.returncode == 0, result.stderr
    assert effects(parse_rows(result.stdout)) == TOY_TOOLS
    assert (state / "fingerprints.json").exists()


# -- tools accept ------------------------------------------------------------------------------


def test_changed_definition_is_a_write_until_accepted(tmp_path: Path) -> None:
    config, state = toy_config(tmp_path), tmp_path / "state"
    store_path = seed_old_definitions(state, "echo")

    rows = listed(config, state)
    assert rows["toy__echo"] == ("write", CHANGED_WHY, "human")
    assert rows["toy__big"] == ("read", "annotation: readOnlyHint: true", None)
    assert FingerprintStore(store_path).pending() == ["toy/echo"]

    accepted = run_proxy("--config", str(config), "--state-dir", str(state), "tools", "accept", "toy__echo")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.splitlines()[0] == "accepted the new definition of toy/echo"
    assert FingerprintStore(store_path).pending() == []

    assert listed(config, state)["toy__echo"] == ("read", "annotation: readOnlyHint: true", None)


def test_accepting_an_unchanged_tool_fails_and_lists_what_changed(tmp_path: Path) -> None:
    config, state = toy_config(tmp_path), tmp_path / "state"
    store_path = seed_old_definitions(state, "echo")
    listed(config, state)

    result = run_proxy("--config", str(config), "--state-dir", str(state), "tools", "accept", "toy__record")
    assert result.returncode == 1
    assert "Error: toy/record has no changed definition to accept; changed: toy/echo" in result.stderr
    assert result.stdout == ""
    assert FingerprintStore(store_path).pending() == ["toy/echo"]


def test_accepting_a_name_without_a_server_prefix_fails(tmp_path: Path) -> None:
    config, state = toy_config(tmp_path), tmp_path / "state"
    result = run_proxy("--config", str(config), "--state-dir", str(state), "tools", "accept", "echo")
    assert result.returncode == 1
    assert "'echo' does not start with a configured server name and '__'" in result.stderr


def test_accept_all_accepts_every_changed_definition(tmp_path: Path) -> None:
    config, state = toy_config(tmp_path), tmp_path / "state"
    store_path = seed_old_definitions(state, "echo", "big")
    rows = listed(config, state)
    assert rows["toy__echo"] == ("write", CHANGED_WHY, "human")
    assert rows["toy__big"] == ("write", CHANGED_WHY, "human")

    result = run_proxy("--config", str(config), "--state-dir", str(state), "tools", "accept", "--all")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [
        "accepted the new definition of toy/big",
        "accepted the new definition of toy/echo",
    ]
    assert FingerprintStore(store_path).pending() == []
    assert effects(listed(config, state)) == TOY_TOOLS


# -- serving -----------------------------------------------------------------------------------


def test_serve_rejects_a_malformed_http_address_with_exit_2(tmp_path: Path) -> None:
    config = toy_config(tmp_path)
    result = run_proxy("--config", str(config), "--state-dir", str(tmp_path / "state"), "--http", "nonsense")
    assert result.returncode == 2
    assert "Invalid value for --http: 'nonsense': use HOST:PORT or :PORT" in result.stderr
    assert not (tmp_path / "rec").exists()


def assert_refuses_review_mode_strong(result: subprocess.CompletedProcess[str], config: Path) -> None:
    """One plain `Error:` line naming the file, the key and the modes that work without a model."""
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith(f"Error: {config}: review.default: review mode 'strong' needs ")
    assert errors[0].endswith("use human, deny or allow")
    assert result.stdout == ""


def test_serve_refuses_a_review_mode_it_cannot_build_with_a_plain_message(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"toy": toy(tmp_path / "rec")}, review={"default": "strong"})
    result = run_proxy("--config", str(config), "--state-dir", str(tmp_path / "state"), "--log-level", "WARNING")
    assert_refuses_review_mode_strong(result, config)


def test_tools_refuses_a_review_mode_it_cannot_build_with_a_plain_message(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"toy": toy(tmp_path / "rec")}, review={"default": "strong"})
    result = run_proxy("--config", str(config), "--state-dir", str(tmp_path / "state"), "tools")
    assert_refuses_review_mode_strong(result, config)


# -- explain -----------------------------------------------------------------------------------

EXPLAIN_RULES = [
    {"when": 'tool == "toy__record" && args.value.startsWith("${NOTES}/")', "review": "allow"},
    {"name": "big-amounts", "when": "has(args.amount) && args.amount > 100", "review": "human"},
    {"when": '"admins" in principal.groups', "deny": "admins write by hand"},
]


def explain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = write_config(tmp_path, {"toy": toy(tmp_path / "rec")}, review={"default": "deny"}, rules=EXPLAIN_RULES)
    state = str(tmp_path / "state")
    return run_proxy("explain", "--config", str(config), "--state-dir", state, *args, env={**os.environ, "NOTES": "/n"})


def test_explain_names_the_rule_and_the_reviewer_a_call_would_meet(tmp_path: Path) -> None:
    notes = explain(tmp_path, "toy__record", "--args", '{"value": "/n/a.md"}')
    assert notes.returncode == 0, notes.stderr
    assert notes.stdout.splitlines()[1:] == [
        'rule: 1 — when: tool == "toy__record" && args.value.startsWith("/n/")',
        "reviewer: allow",
    ]
    large = explain(tmp_path, "toy__record", "--args", '{"value": "x", "amount": 250}')
    assert large.stdout.splitlines()[1:] == [
        "rule: big-amounts — when: has(args.amount) && args.amount > 100",
        "reviewer: human",
    ]
    admin = explain(tmp_path, "toy__record", "--args", '{"value": "x"}', "--principal", '{"groups": ["admins"]}')
    assert admin.stdout.splitlines()[-1] == "reviewer: deny — denied by rule 3: admins write by hand"
    nobody = explain(tmp_path, "toy__record", "--args", '{"value": "x"}')
    assert nobody.stdout.splitlines()[1:] == ["rule: none matched — the tool's own reviewer decides", "reviewer: deny"]
    failed = explain(tmp_path, "toy__record", "--args", '{"value": "x", "amount": "250"}')
    assert "failed closed: rule big-amounts: " in failed.stdout and failed.stdout.endswith("reviewer: deny\n")
    assert (tmp_path / "rec").exists() is False  # nothing ran


def test_explain_says_when_access_hides_the_tool_from_the_principal(tmp_path: Path) -> None:
    access = [{"when": 'server == "toy" && !("finance" in principal.groups)', "hide": True}]
    config = write_config(tmp_path, {"toy": toy(tmp_path / "rec")}, review={"default": "allow"}, access=access)
    command = ["explain", "--config", str(config), "--state-dir", str(tmp_path / "state"), "toy__record"]
    hidden, seen = (
        run_proxy(*command, "--args", '{"value": "v"}', *who)
        for who in ((), ("--principal", '{"sub": "ann", "groups": ["finance"]}'))
    )
    assert hidden.returncode == 0, hidden.stderr
    assert hidden.stdout.splitlines() == [
        "tool: toy__record",
        "access: hidden from this principal by `access:` — to them it is an unknown tool; nothing runs",
    ]
    assert seen.stdout.splitlines()[-1] == "reviewer: allow"


def test_explain_refuses_what_is_not_a_call_in_one_line(tmp_path: Path) -> None:
    unknown = explain(tmp_path, "toy__nope")
    assert unknown.returncode == 1 and unknown.stderr.strip().splitlines() == [
        "Error: 'toy__nope' is not a tool the proxy lists — run `mcp-spec-proxy tools` for the names"
    ]
    broken = explain(tmp_path, "toy__record", "--args", "[1")
    assert broken.returncode == 2 and "Invalid value for --args: not JSON" in broken.stderr
