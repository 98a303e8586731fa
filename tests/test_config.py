"""servers.yaml and Claude Desktop JSON: what loads, and what each mistake's message says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from mcp_spec_proxy.config.schema import ProxyConfig, ServerConfig, load_config, parse_config_text
from mcp_spec_proxy.errors import ConfigError

FULL_YAML = """\
servers:
  fs:
    command: npx
    args: ["-y", "@modelcontextprotocol/server-filesystem", "${HOME}/notes"]
    env: {LOG_LEVEL: "${LOG_LEVEL:-info}"}
    timeout: 12.5
    trust_annotations: false
    tools:
      include: ["read_*", "write_*", "delete_*"]
      exclude: ["move_file"]
      overrides:
        "read_*": {read_only: true}
        "write_*": {hold: true}
        "delete_*": {review: human, on_reject: repair}
  tracker:
    url: http://127.0.0.1:9000/mcp
    headers: {Authorization: "Bearer ${TRACKER_TOKEN}"}
models:
  weak:   {base_url: "http://127.0.0.1:30000/v1", model: "Qwen3.5-4B", api_key_env: WEAK_KEY}
  strong: {base_url: "https://api.example.com/v1", model: "big-model", api_key_env: STRONG_KEY}
review:
  default: strong
  on_reject: replace
  on_error: allow
  intent: false
speculation: {draft_steps: 4}
telemetry: "~/telemetry.jsonl"
"""

ENVIRON = {"HOME": "/home/ada", "TRACKER_TOKEN": "s3cret"}


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def config_error(text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text, environ or {}, file="servers.yaml")
    return caught.value


# -- what loads ------------------------------------------------------------------------------


def test_full_design_yaml_loads_every_section(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "servers.yaml", FULL_YAML), ENVIRON)

    assert list(config.servers) == ["fs", "tracker"]
    fs = config.servers["fs"]
    assert fs.command == "npx"
    assert fs.args == ["-y", "@modelcontextprotocol/server-filesystem", "/home/ada/notes"]
    assert fs.env == {"LOG_LEVEL": "info"}
    assert fs.timeout == 12.5
    assert fs.trust_annotations is False
    assert fs.tools.include == ["read_*", "write_*", "delete_*"]
    assert fs.tools.exclude == ["move_file"]
    assert fs.tools.overrides["read_*"].read_only is True
    assert fs.tools.overrides["read_*"].hold is False
    assert fs.tools.overrides["write_*"].hold is True
    assert fs.tools.overrides["write_*"].read_only is None
    assert fs.tools.overrides["delete_*"].review == "human"
    assert fs.tools.overrides["delete_*"].on_reject == "repair"

    tracker = config.servers["tracker"]
    assert tracker.url == "http://127.0.0.1:9000/mcp"
    assert tracker.headers == {"Authorization": "Bearer s3cret"}
    assert tracker.command is None
    assert tracker.timeout == 60.0
    assert tracker.trust_annotations is True

    weak = config.models["weak"]
    assert (weak.base_url, weak.model, weak.api_key_env) == ("http://127.0.0.1:30000/v1", "Qwen3.5-4B", "WEAK_KEY")
    assert weak.thinking_off == {"chat_template_kwargs": {"enable_thinking": False}}
    assert config.models["strong"].model == "big-model"
    assert config.review.default == "strong"
    assert config.review.on_reject == "replace"
    assert config.review.on_error == "allow"
    assert config.review.intent is False
    assert config.speculation.draft_steps == 4
    assert config.telemetry == "~/telemetry.jsonl"


def test_parse_config_text_follows_the_same_rules_as_load_config(tmp_path: Path) -> None:
    from_file = load_config(write(tmp_path, "servers.yaml", FULL_YAML), ENVIRON)
    from_text = parse_config_text(FULL_YAML, ENVIRON)

    assert from_text == from_file


def test_empty_file_is_a_config_with_no_servers(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "servers.yaml", ""), {})

    assert config.servers == {}
    assert config.review.default == "human"
    assert config.review.intent is True
    assert config.separator == "__"
    assert config.max_name_length == 64


def test_unset_server_fields_take_their_defaults() -> None:
    server = parse_config_text("servers:\n  git:\n    command: uvx\n", {}).servers["git"]

    assert server.args == []
    assert server.env == {}
    assert server.timeout == 60.0
    assert server.trust_annotations is True
    assert server.tools.include == ["*"]
    assert server.tools.exclude == []
    assert server.tools.overrides == {}
    assert server.active is True
    assert server.protocol == "legacy"


def test_protocol_is_auto_or_legacy() -> None:
    legacy = parse_config_text("servers:\n  git:\n    command: uvx\n    protocol: legacy\n", {}).servers["git"]
    assert legacy.protocol == "legacy"
    with pytest.raises(ConfigError) as raised:
        parse_config_text("servers:\n  git:\n    command: uvx\n    protocol: 2026-07-28\n", {})
    assert "protocol" in str(raised.value)


# -- ${VAR} expansion ------------------------------------------------------------------------


def test_variable_is_expanded_from_the_environ_given() -> None:
    config = parse_config_text("servers:\n  git:\n    command: ${GIT_BIN}\n", {"GIT_BIN": "/opt/bin/git-mcp"})

    assert config.servers["git"].command == "/opt/bin/git-mcp"


def test_default_is_used_when_the_variable_is_unset() -> None:
    config = parse_config_text("servers:\n  git:\n    command: ${GIT_BIN:-uvx}\n", {})

    assert config.servers["git"].command == "uvx"


def test_set_variable_beats_its_default() -> None:
    config = parse_config_text("servers:\n  git:\n    command: ${GIT_BIN:-uvx}\n", {"GIT_BIN": "git-mcp"})

    assert config.servers["git"].command == "git-mcp"


def test_empty_default_expands_to_an_empty_string() -> None:
    config = parse_config_text("servers:\n  git:\n    command: uvx\n    env: {TOKEN: '${TOKEN:-}'}\n", {})

    assert config.servers["git"].env == {"TOKEN": ""}


def test_several_variables_in_one_value_and_in_list_items_are_expanded() -> None:
    text = "servers:\n  git:\n    command: uvx\n    args: ['--repo', '${ROOT}/${REPO}']\n"

    config = parse_config_text(text, {"ROOT": "/src", "REPO": "proxy"})

    assert config.servers["git"].args == ["--repo", "/src/proxy"]


def test_expansion_reads_only_the_mapping_passed_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONLY_IN_PROCESS_ENV", "leaked")

    error = config_error("servers:\n  git:\n    command: ${ONLY_IN_PROCESS_ENV}\n", {})

    assert error.key == "servers.git.command"
    assert "ONLY_IN_PROCESS_ENV is not set" in error.problem


def test_missing_variable_names_file_line_key_path_and_fix(tmp_path: Path) -> None:
    path = write(tmp_path, "servers.yaml", FULL_YAML)

    with pytest.raises(ConfigError) as caught:
        load_config(path, {"HOME": "/home/ada"})

    error = caught.value
    assert error.file == f"{path}:17"
    assert error.key == "servers.tracker.headers.Authorization"
    assert error.problem == "environment variable TRACKER_TOKEN is not set"
    assert error.fix == "export TRACKER_TOKEN, or write ${TRACKER_TOKEN:-default}"
    assert str(error) == (
        f"{path}:17: servers.tracker.headers.Authorization: environment variable TRACKER_TOKEN is not set"
        " — export TRACKER_TOKEN, or write ${TRACKER_TOKEN:-default}"
    )


def test_missing_variable_in_a_list_item_names_its_index() -> None:
    error = config_error("servers:\n  git:\n    command: uvx\n    args: ['a', '${NOPE}']\n")

    assert error.key == "servers.git.args.1"


# -- Claude Desktop JSON ---------------------------------------------------------------------

CLAUDE_DESKTOP = {
    "mcpServers": {
        "filesystem": {
            "command": "npx",
            "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/ada/Desktop"],
            "env": {"DEBUG": "${DEBUG:-0}"},
        },
        "linear": {"type": "sse", "url": "https://mcp.linear.app/sse", "disabled": True},
        "notion": {"type": "streamable-http", "url": "https://mcp.notion.com/mcp"},
        "local": {"type": "stdio", "command": "node", "args": ["server.js"], "disabled": False},
    }
}


def test_claude_desktop_json_loads_its_mcp_servers(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "claude_desktop_config.json", json.dumps(CLAUDE_DESKTOP)), {})

    assert list(config.servers) == ["filesystem", "linear", "notion", "local"]
    assert config.servers["filesystem"].args[-1] == "/Users/ada/Desktop"
    assert config.servers["filesystem"].env == {"DEBUG": "0"}
    assert config.servers["linear"].type == "sse"
    assert config.servers["linear"].transport == "sse"
    assert config.servers["notion"].transport == "http"
    assert config.servers["local"].transport == "stdio"


def test_active_servers_leaves_out_disabled_ones(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "claude_desktop_config.json", json.dumps(CLAUDE_DESKTOP)), {})

    assert list(config.active_servers()) == ["filesystem", "notion", "local"]
    assert config.servers["linear"].active is False


def test_enabled_false_also_makes_a_server_inactive() -> None:
    config = parse_config_text("servers:\n  a: {command: x, enabled: false}\n  b: {command: y}\n", {})

    assert list(config.active_servers()) == ["b"]


def test_claude_desktop_json_sits_beside_the_other_sections(tmp_path: Path) -> None:
    data = {**CLAUDE_DESKTOP, "review": {"default": "deny"}}

    config = load_config(write(tmp_path, "proxy.json", json.dumps(data)), {})

    assert config.review.default == "deny"
    assert "filesystem" in config.servers


def test_both_servers_and_mcp_servers_is_an_error(tmp_path: Path) -> None:
    data = {"servers": {"a": {"command": "x"}}, "mcpServers": {"b": {"command": "y"}}}
    path = write(tmp_path, "proxy.json", json.dumps(data))

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.key == "mcpServers"
    assert caught.value.fix == "keep one of them"


def test_error_in_claude_desktop_json_names_the_mcp_servers_key_and_line(tmp_path: Path) -> None:
    text = '{\n  "mcpServers": {\n    "fs": {\n      "command": "npx",\n      "timout": 5\n    }\n  }\n}\n'
    path = write(tmp_path, "claude_desktop_config.json", text)

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.file == f"{path}:5"
    assert caught.value.key == "mcpServers.fs.timout"
    assert caught.value.fix == "did you mean `timeout`?"


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "claude_desktop_config.json", '{\n  "mcpServers": {\n    "fs": {,\n  }\n}\n')

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.file == f"{path}:3"
    assert caught.value.problem.startswith("invalid JSON: ")


# -- mistakes and their messages -------------------------------------------------------------


def test_unknown_key_names_file_line_key_and_near_spelling(tmp_path: Path) -> None:
    path = write(tmp_path, "servers.yaml", "servers:\n  fs:\n    command: npx\n    timout: 5\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    error = caught.value
    assert error.file == f"{path}:4"
    assert error.key == "servers.fs.timout"
    assert error.problem == "unknown key"
    assert error.fix == "did you mean `timeout`?"
    assert str(error) == f"{path}:4: servers.fs.timout: unknown key — did you mean `timeout`?"


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("comand", "command"),  # a letter dropped
        ("commmand", "command"),  # a letter doubled
        ("trust_anotations", "trust_annotations"),
        ("headrs", "headers"),
        ("timeoot", "timeout"),  # a letter replaced
    ],
)
def test_unknown_server_key_suggests_the_key_one_typo_away(written: str, meant: str) -> None:
    error = config_error(f"servers:\n  fs:\n    command: npx\n    {written}: x\n")

    assert error.key == f"servers.fs.{written}"
    assert error.fix == f"did you mean `{meant}`?"


def test_dashed_override_key_suggests_the_underscored_one() -> None:
    text = "servers:\n  fs:\n    command: npx\n    tools:\n      overrides:\n        'read_*': {read-only: true}\n"

    error = config_error(text)

    assert error.file == "servers.yaml:6"
    assert error.key == "servers.fs.tools.overrides.read_*.read-only"
    assert error.fix == "did you mean `read_only`?"


def test_unknown_key_with_nothing_close_points_at_the_reference() -> None:
    error = config_error("servers:\n  fs:\n    command: npx\n    zzzzzzzz: 1\n")

    assert error.key == "servers.fs.zzzzzzzz"
    assert error.fix == "remove it or check its spelling against docs/CONFIG.md#serversyaml-reference"


def test_unknown_top_level_key_is_named_with_its_line() -> None:
    error = config_error("servers: {}\nreveiw:\n  default: deny\n")

    assert error.file == "servers.yaml:2"
    assert error.key == "reveiw"
    assert error.problem == "unknown key"


def test_wrong_type_names_the_key_and_line() -> None:
    error = config_error("servers:\n  fs:\n    command: npx\n    timeout: soon\n")

    assert error.file == "servers.yaml:4"
    assert error.key == "servers.fs.timeout"
    assert "valid number" in error.problem


def test_non_positive_timeout_is_rejected_at_its_line() -> None:
    error = config_error("servers:\n  fs:\n    command: npx\n\n    timeout: 0\n")

    assert error.file == "servers.yaml:5"
    assert error.key == "servers.fs.timeout"
    assert error.problem == "Input should be greater than 0"


def test_unknown_review_mode_lists_the_allowed_ones() -> None:
    error = config_error("review:\n  default: maybe\n")

    assert error.file == "servers.yaml:2"
    assert error.key == "review.default"
    assert error.fix == "use 'strong', 'human', 'strong_then_human', 'deny', 'allow', 'leash' or 'console'"


def test_invalid_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "servers.yaml", "servers:\n  fs:\n    command: [npx\n  x: 1\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.file == f"{path}:4"
    assert caught.value.problem.startswith("invalid YAML: ")


def test_top_level_list_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "servers.yaml", "- fs\n- git\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.problem == "the top level must be a mapping"
    assert caught.value.fix == "start with `servers:`"


def test_server_with_neither_command_nor_url_is_rejected() -> None:
    error = config_error("servers:\n  fs:\n    args: [a]\n")

    assert error.file == "servers.yaml:2"
    assert error.key == "servers.fs"
    assert error.problem == "needs either `command` (a stdio server) or `url` (a streamable HTTP or SSE server)"


def test_server_with_both_command_and_url_is_rejected() -> None:
    error = config_error("servers:\n  fs:\n    command: npx\n    url: http://localhost/mcp\n")

    assert error.key == "servers.fs"
    assert error.problem == "has both `command` and `url`; keep the one that reaches this server"


def test_url_without_an_http_scheme_is_rejected() -> None:
    error = config_error("servers:\n  fs:\n    url: localhost:9000/mcp\n")

    assert error.key == "servers.fs"
    assert error.problem == "url 'localhost:9000/mcp' must start with http:// or https://"


@pytest.mark.parametrize("name", ["my server", "fs/git", "x" * 41, "ünïcode"])
def test_bad_server_name_is_rejected_with_the_reason(name: str) -> None:
    error = config_error(f"servers:\n  {json.dumps(name)}:\n    command: npx\n")

    assert error.key == "servers"
    assert error.problem == (
        f"server name {name!r} may use only letters, digits, '_' and '-' (1-40 characters),"
        " because it prefixes every tool name"
    )


def test_server_name_containing_the_separator_is_rejected() -> None:
    error = config_error("separator: '-'\nservers:\n  my-fs:\n    command: npx\n")

    assert error.problem == "server name 'my-fs' contains the separator '-'; rename it"


def test_server_name_containing_the_default_separator_is_rejected() -> None:
    error = config_error("servers:\n  my__fs:\n    command: npx\n")

    assert error.problem == "server name 'my__fs' contains the separator '__'; rename it"


def test_single_underscores_are_fine_with_the_default_separator() -> None:
    config = parse_config_text("servers:\n  my_fs:\n    command: npx\n", {})

    assert list(config.servers) == ["my_fs"]


def test_missing_file_says_how_to_point_at_one(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"

    with pytest.raises(ConfigError) as caught:
        load_config(path, {})

    assert caught.value.file == str(path)
    assert caught.value.problem == "file not found"
    assert caught.value.fix.startswith("pass --config with the path of your servers.yaml")
    assert "mcp-spec-proxy shipped-config > servers.yaml" in caught.value.fix


# -- transport inference ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "transport"),
    [
        ({"command": "npx"}, "stdio"),
        ({"type": "stdio", "command": "npx"}, "stdio"),
        ({"url": "http://127.0.0.1:9000/mcp"}, "http"),
        ({"url": "https://example.com/mcp/"}, "http"),
        ({"url": "https://example.com/sse"}, "sse"),
        ({"url": "https://example.com/sse/"}, "sse"),
        ({"type": "sse", "url": "https://example.com/events"}, "sse"),
        ({"type": "http", "url": "https://example.com/sse"}, "http"),
        ({"type": "streamable-http", "url": "https://example.com/mcp"}, "http"),
        ({"type": "streamableHttp", "url": "https://example.com/mcp"}, "http"),
    ],
)
def test_transport_is_inferred_from_command_url_and_type(server: dict[str, str], transport: str) -> None:
    assert ServerConfig.model_validate(server).transport == transport


def test_config_objects_are_frozen() -> None:
    config = ProxyConfig.model_validate({"servers": {"fs": {"command": "npx"}}})

    with pytest.raises(ValidationError, match="frozen"):
        config.servers["fs"].timeout = 1


def test_telemetry_is_a_path_alone_or_a_file_and_a_traces_receiver() -> None:
    alone = parse_config_text("telemetry: ~/decisions.jsonl\n", {})
    both = parse_config_text("telemetry: {file: ~/decisions.jsonl, otlp: 'http://collector:4318'}\n", {})
    receiver_only = parse_config_text("telemetry: {otlp: 'https://otel.example/v1/traces'}\n", {})

    assert (alone.telemetry_file, alone.otlp) == ("~/decisions.jsonl", None)
    assert (both.telemetry_file, both.otlp) == ("~/decisions.jsonl", "http://collector:4318")
    assert (receiver_only.telemetry_file, receiver_only.otlp) == (None, "https://otel.example/v1/traces")
