"""A config file with several mistakes names every one of them in one run, each with file:line,
key and fix, in the file's order — as `mcp-spec-proxy check` prints them, and as `ConfigError`
carries them. A mistake is told once: not again as a second union member's complaint, nor as the
failure of a value whose `${VAR}` did not expand.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from mcp_spec_proxy.config.schema import parse_config_text
from mcp_spec_proxy.errors import ConfigError
from tests.harness import PROXY_COMMAND

THREE_MISTAKES = """\
servers:
  fs:
    command: npx
    timout: 5
review:
  default: deny
  on_reject: maybe
speculation:
  draft_steps: many
"""


def config_error(text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text, environ or {}, file="servers.yaml")
    return caught.value


def test_check_names_three_mistakes_in_three_sections_at_once(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(THREE_MISTAKES, encoding="utf-8")

    result = subprocess.run(
        [PROXY_COMMAND, "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )

    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "Error: 3 problems in the configuration:"
    assert lines[1:] == [
        f"  {config}:4: servers.fs.timout: unknown key — did you mean `timeout`?",
        f"  {config}:7: review.on_reject: 'maybe' is not allowed — use 'block', 'replace' or 'repair'",
        f"  {config}:9: speculation.draft_steps: Input should be a valid integer, unable to parse string as an integer",
    ]


def test_each_problem_is_carried_with_its_own_file_line_key_and_fix() -> None:
    error = config_error(THREE_MISTAKES)

    assert [(p.file, p.key, p.problem, p.fix) for p in error.problems] == [
        ("servers.yaml:4", "servers.fs.timout", "unknown key", "did you mean `timeout`?"),
        ("servers.yaml:7", "review.on_reject", "'maybe' is not allowed", "use 'block', 'replace' or 'repair'"),
        (
            "servers.yaml:9",
            "speculation.draft_steps",
            "Input should be a valid integer, unable to parse string as an integer",
            "",
        ),
    ]
    assert (error.file, error.key) == ("servers.yaml:4", "servers.fs.timout")  # the first, as before


def test_problems_are_listed_in_the_order_of_the_file() -> None:
    # pydantic finds them in the order of the models' fields (servers before review); the user reads top down.
    text = "review:\n  default: maybe\nservers:\n  fs:\n    command: npx\n    timout: 5\n"

    error = config_error(text)

    assert [p.file for p in error.problems] == ["servers.yaml:2", "servers.yaml:6"]


def test_every_unset_variable_is_named_with_its_line() -> None:
    text = "servers:\n  fs:\n    command: ${CMD}\n    args: [a, '${ARG}']\n  web:\n    url: https://x/${A}${B}\n"

    error = config_error(text)

    assert [(p.file, p.key, p.problem) for p in error.problems] == [
        ("servers.yaml:3", "servers.fs.command", "environment variable CMD is not set"),
        ("servers.yaml:4", "servers.fs.args.1", "environment variable ARG is not set"),
        ("servers.yaml:6", "servers.web.url", "environment variable A is not set"),
        ("servers.yaml:6", "servers.web.url", "environment variable B is not set"),
    ]


def test_a_value_whose_variable_is_unset_is_told_once_beside_the_other_mistakes() -> None:
    # Left unexpanded, the url fails its own check (no http:// scheme): that is the same mistake.
    text = "servers:\n  web:\n    url: ${WEB_URL}\nreview:\n  default: maybe\n"

    error = config_error(text)

    assert [(p.key, p.problem) for p in error.problems] == [
        ("servers.web.url", "environment variable WEB_URL is not set"),
        ("review.default", "'maybe' is not allowed"),
    ]


def test_a_mistake_inside_a_union_is_told_once_at_the_keys_the_user_wrote() -> None:
    # `store` is `files` or `{postgres: ...}`; pydantic complains for each, naming its members as keys.
    error = config_error("store:\n  postgres:\n    dsn: postgresql://db\n")

    assert [(p.file, p.key, p.problem, p.fix) for p in error.problems] == [
        ("servers.yaml:2", "store.postgres.dsn_env", "required key is missing", ""),
        ("servers.yaml:3", "store.postgres.dsn", "unknown key", "did you mean `dsn_env`?"),
    ]


def test_a_wrong_word_for_a_union_is_told_once_with_the_word_allowed() -> None:
    error = config_error("store: filez\n")

    assert str(error) == "servers.yaml:1: store: 'filez' is not allowed — use 'files'"


def test_a_defaulted_key_a_whole_file_check_names_keeps_its_name() -> None:
    # `leash.encoder` is not written (hashing by default), yet it is the key to change.
    error = config_error("review: {default: leash}\nleash: {bank_dir: /tmp/banks}\n")

    assert error.key == "leash.encoder"


def test_claude_desktop_json_with_several_mistakes_names_each_under_mcp_servers(tmp_path: Path) -> None:
    text = (
        '{\n  "mcpServers": {\n    "fs": {\n      "command": "npx",\n'
        '      "args": 3,\n'  # line 5
        '      "timout": 1\n'  # line 6
        "    }\n  },\n"
        '  "review": {"on_error": "maybe"}\n'  # line 9
        "}\n"
    )
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(text, encoding="utf-8")

    with pytest.raises(ConfigError) as caught:
        parse_config_text(path.read_text(), {}, file=str(path), json_file=True)

    assert [(p.file, p.key) for p in caught.value.problems] == [
        (f"{path}:5", "mcpServers.fs.args"),
        (f"{path}:6", "mcpServers.fs.timout"),
        (f"{path}:9", "review.on_error"),
    ]


def test_an_unknown_key_is_told_beside_its_unset_variable() -> None:
    # The key is a mistake whatever its value: only checks of the value are the variable's.
    error = config_error("servers:\n  fs:\n    command: npx\n    timout: ${UNSET_TIMEOUT}\n")

    assert [(p.file, p.key, p.problem) for p in error.problems] == [
        ("servers.yaml:4", "servers.fs.timout", "environment variable UNSET_TIMEOUT is not set"),
        ("servers.yaml:4", "servers.fs.timout", "unknown key"),
    ]


def test_a_file_with_many_mistakes_is_read_for_their_lines_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Composed anew for each mistake, a file of a thousand typos took a minute to be refused.
    composed: list[str] = []
    compose = yaml.compose

    def counted(text: str) -> yaml.Node | None:
        composed.append(text)
        return compose(text)

    monkeypatch.setattr(yaml, "compose", counted)
    text = "servers:\n  fs:\n    command: npx\n" + "".join(f"    typo{i}: 1\n" for i in range(50))

    error = config_error(text)

    assert len(error.problems) == 50
    assert error.problems[-1].file == "servers.yaml:53"
    assert len(composed) == 1


def test_a_key_yaml_reads_as_a_number_keeps_its_place_in_the_path() -> None:
    error = config_error("servers:\n  1:\n    command: npx\nreview:\n  default: maybe\n")

    assert [(p.file, p.key) for p in error.problems] == [
        ("servers.yaml:2", "servers.1"),
        ("servers.yaml:5", "review.default"),
    ]


def test_a_traces_receiver_that_is_no_http_url_is_told_at_its_key_with_what_to_write() -> None:
    # `telemetry` is a path or `{file, otlp}`: the mistake is told once, at the key written, not as the path's.
    error = config_error("telemetry:\n  file: decisions.jsonl\n  otlp: collector:4318\n")

    (problem,) = error.problems
    assert (problem.file, problem.key) == ("servers.yaml:3", "telemetry.otlp")
    assert problem.problem.startswith("'collector:4318' is not the http(s) URL of an OTLP/HTTP receiver")
    assert "http://collector:4318" in problem.problem  # what to write instead


@pytest.mark.parametrize("typo", ["oltp", "otlp_url"])
def test_a_misspelt_traces_receiver_key_is_told_with_the_key_meant(typo: str) -> None:
    error = config_error(f"telemetry:\n  {typo}: http://collector:4318\n")

    assert [(p.file, p.key, p.problem, p.fix) for p in error.problems] == [
        ("servers.yaml:2", f"telemetry.{typo}", "unknown key", "did you mean `otlp`?"),
    ]
