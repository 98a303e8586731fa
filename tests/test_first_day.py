"""A new user's first day, as they meet it from the command line: a config with no servers, the
messages that send them to the docs, `serve.sh` in a terminal, the example that runs from any folder."""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from mcp_spec_proxy.config.schema import parse_config_text
from mcp_spec_proxy.errors import ConfigError
from tests.harness import PROXY_COMMAND, proxy_env, toy
from tests.test_docs_links import anchors, slug

REPO = Path(__file__).resolve().parent.parent


def run_proxy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROXY_COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=proxy_env(),
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def config_error(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text, {}, file="servers.yaml")
    return caught.value


def test_check_refuses_a_config_with_no_servers_in_one_line_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "servers.yaml"
    path.write_text("review:\n  default: human\n")

    result = run_proxy("--config", str(path), "check")

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: {path}: no server is configured — add one under `servers:`"
        " (docs/CONFIG.md#serversyaml-reference), or write a servers.yaml from your MCP clients' configs with"
        " `mcp-spec-proxy init`"
    ]


def test_check_refuses_a_config_whose_every_server_is_disabled(tmp_path: Path) -> None:
    path = tmp_path / "servers.yaml"
    path.write_text("servers:\n  fs: {command: npx, enabled: false}\n")

    result = run_proxy("--config", str(path), "check")

    assert result.returncode == 1
    assert "no server is configured or enabled — add one under `servers:`" in result.stderr


def test_check_accepts_a_gateway_config_that_needs_no_backends() -> None:
    result = run_proxy("--config", str(REPO / "bench" / "tau2_retail" / "gateway.yaml"), "check")

    assert result.returncode == 0, result.stderr
    assert "ok (0 servers enabled)" in result.stdout


# A page the code cites (README.md, or a page of docs/) with an anchor (`docs/CONFIG.md#rules`) or a
# section's title in quotes (`docs/BENCHMARKS.md, "Tool search at catalog scale"`).
CITED = re.compile(r"\b((?:docs/)?[A-Z][A-Z_]+(?:\.md)?)(?:#([a-z0-9_-]+)|,? \"([^\"]+)\")")


def cited_sections() -> list[tuple[str, Path, str]]:
    """Every section of README.md or docs/ cited in the package, the scripts, the examples and the shipped
    configs: where it is cited, the page, and the anchor."""
    files = [
        *sorted((REPO / "mcp_spec_proxy").rglob("*.py")),
        *sorted((REPO / "scripts").iterdir()),
        *sorted((REPO / "examples").iterdir()),
        *sorted((REPO / "bench").rglob("*.yaml")),
        REPO / "servers.yaml",
    ]
    found: list[tuple[str, Path, str]] = []
    for file in files:
        if not file.is_file():
            continue
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            for page, anchor, title in CITED.findall(line):
                name = page.removeprefix("docs/").removesuffix(".md") + ".md"
                path = REPO / "README.md" if name == "README.md" else REPO / "docs" / name
                if name != "README.md" and not path.exists():
                    continue  # DESIGN.md, STYLE.md: the design notes the code answers to, not user docs
                found.append((f"{file.relative_to(REPO)}:{number}", path, anchor or slug(title) + "*"))
    return found


def exists(anchor: str, path: Path) -> bool:
    """Whether `path` has the section: an anchor exactly, a title as the start of a heading's (`anchor*`)."""
    offered = anchors(path)
    if anchor.endswith("*"):
        return any(name.startswith(anchor[:-1]) for name in offered)
    return anchor in offered


def test_every_section_of_the_docs_the_code_cites_exists() -> None:
    cited = cited_sections()
    missing = [
        f"{where}: {path.relative_to(REPO)}#{anchor}" for where, path, anchor in cited if not exists(anchor, path)
    ]

    assert len(cited) >= 5  # the messages below, at least
    assert missing == []


def test_the_messages_that_send_a_user_to_the_docs_cite_a_section() -> None:
    leash = run_proxy("--config", str(REPO / "examples" / "local-model.yaml"), "run", "x", "--mode", "spec+leash")
    unknown = config_error("servers:\n  fs: {command: npx, zzzzzzzz: 1}\n")

    assert "it needs a `leash:` section (docs/CONFIG.md#serversyaml-reference)" in leash.stderr
    assert unknown.fix == "remove it or check its spelling against docs/CONFIG.md#serversyaml-reference"


def test_the_local_model_example_from_another_folder_says_which_folder_its_paths_are_taken_from(
    tmp_path: Path,
) -> None:
    result = run_proxy("--config", str(REPO / "examples" / "local-model.yaml"), "check", cwd=tmp_path)

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: backend 'notes' failed to start: command '.venv/bin/python' is not in {tmp_path}, the folder the"
        " proxy started in, which a relative path is taken from — start the proxy in the folder the path is"
        " relative to, or give `command` (and any relative path in `args`) as an absolute path"
    ]


def leash_config(tmp_path: Path) -> Path:
    config = tmp_path / "servers.yaml"
    config.write_text(f"leash:\n  encoder: hashing\n  bank_dir: {tmp_path / 'banks'}\n")
    return config


def test_the_documented_bank_import_example_imports_as_the_docs_say(tmp_path: Path) -> None:
    page = (REPO / "docs" / "LEASH.md").read_text(encoding="utf-8")
    section = page[page.index("## Importing labelled examples") :]
    example = section[
        section.index("```jsonl\n") + len("```jsonl\n") : section.index("```\n", section.index("```jsonl"))
    ]
    examples = tmp_path / "examples.jsonl"
    examples.write_text(example)

    result = run_proxy("bank", "import", str(examples), "-c", str(leash_config(tmp_path)))

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "imported 1 tasks and 2 steps"
    assert "(`imported 1 tasks and 2 steps`)" in section


def test_a_bad_bank_import_line_is_one_line_pointing_at_the_format_and_imports_nothing(tmp_path: Path) -> None:
    examples = tmp_path / "examples.jsonl"
    examples.write_text(
        '{"kind": "task", "text": "a", "label": "success"}\n{"tool": "fs__write_file", "label": "bad"}\n'
    )
    config = leash_config(tmp_path)

    result = run_proxy("bank", "import", str(examples), "-c", str(config))
    stats = run_proxy("bank", "stats", "-c", str(config))

    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"Error: {examples}:2: label 'bad' is neither success nor failure — each line is"
        ' {"kind": "task", "text": "...", "label": "success"} or {"kind": "step", "tool": "...", "arguments": {...},'
        ' "label": "failure"} (docs/LEASH.md#importing-labelled-examples-bank-import)'
    ]
    assert '"count": 0' in stats.stdout.splitlines()[0]  # the task bank: the good first line was not imported


WAITING = "waiting for an MCP client to speak on stdin"


def fake_venv_python(tmp_path: Path) -> Path:
    """Stands in for `python3 -m venv VENV`: pip only says it ran; the venv's mcp-spec-proxy is the real one."""
    fake = tmp_path / "python3"
    fake.write_text(
        '#!/bin/sh\nmkdir -p "$3/bin"\n'
        "printf '#!/bin/sh\\nexit 0\\n' >\"$3/bin/python\"\n"
        f'printf \'#!/bin/sh\\nexec env PYTHONPATH={REPO} {PROXY_COMMAND} "$@"\\n\' >"$3/bin/mcp-spec-proxy"\n'
        'chmod +x "$3/bin/python" "$3/bin/mcp-spec-proxy"\n'
    )
    fake.chmod(0o755)
    return fake


def test_serve_sh_in_a_terminal_says_it_waits_for_an_mcp_client_on_stdin(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "serve.sh", tmp_path / "scripts" / "serve.sh")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    config = tmp_path / "servers.yaml"
    config.write_text(yaml.safe_dump({"servers": {"toy": toy(tmp_path / "rec")}}))
    env = {**os.environ, "PYTHON": str(fake_venv_python(tmp_path)), "PROXY_CONFIG": str(config)}
    terminal, its_end = pty.openpty()  # stdin is a terminal, as when a person runs the script
    command = ["bash", str(tmp_path / "scripts" / "serve.sh"), "--state-dir", str(tmp_path / "s"), "--no-console"]
    process = subprocess.Popen(
        command, stdin=its_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    os.close(its_end)
    said: list[str] = []
    try:
        assert process.stderr is not None
        for line in process.stderr:  # ends when the proxy does: a test that never hears the line fails here
            said.append(line)
            if "serving 11 tools" in line or WAITING in line:
                break
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)
        os.close(terminal)

    told = [line for line in said if WAITING in line]
    assert len(told) == 1, "".join(said)
    assert "README.md#use-it-from-claude-desktop" in told[0] and "--http :8765" in told[0]


def documented_completion(shell: str) -> str:
    page = (REPO / "docs" / "COMMANDS.md").read_text(encoding="utf-8")
    section = page[page.index("## Shell completion") :]
    return next(line.split("  #")[0].strip() for line in section.splitlines() if f"={shell}_source" in line)


def test_the_documented_bash_completion_completes_commands_and_starts_no_backend(tmp_path: Path) -> None:
    spawned = tmp_path / "spawned"
    backend = {"command": "sh", "args": ["-c", f"touch {spawned}; exec sleep 30"]}
    (tmp_path / "servers.yaml").write_text(yaml.safe_dump({"servers": {"slow": backend}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mcp-spec-proxy").write_text(f'#!/bin/sh\nexec env PYTHONPATH={REPO} {PROXY_COMMAND} "$@"\n')
    (bin_dir / "mcp-spec-proxy").chmod(0o755)
    script = (
        f"{documented_completion('bash')}\n"
        "COMP_WORDS=(mcp-spec-proxy ba); COMP_CWORD=1; _mcp_spec_proxy_completion mcp-spec-proxy\n"
        'echo "${COMPREPLY[@]}"\n'
        "COMPREPLY=(); COMP_WORDS=(mcp-spec-proxy bank i); COMP_CWORD=2; _mcp_spec_proxy_completion mcp-spec-proxy\n"
        'echo "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["bank", "import"]
    assert not spawned.exists()  # ./servers.yaml's backend was not started for a Tab


def test_the_documented_zsh_and_fish_completions_print_their_scripts() -> None:
    for shell, marker in (("zsh", "#compdef mcp-spec-proxy"), ("fish", "complete --no-files --command mcp-spec-proxy")):
        variable = documented_completion(shell).split("_MCP_SPEC_PROXY_COMPLETE=")[1].split()[0]
        env = {**proxy_env(), "_MCP_SPEC_PROXY_COMPLETE": variable}
        printed = subprocess.run([PROXY_COMMAND], capture_output=True, text=True, timeout=60, env=env)
        assert marker in printed.stdout, printed.stdout
