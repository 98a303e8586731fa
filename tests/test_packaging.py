"""What a user installs: the extras the docs name, the shipped config inside the package, and the
hint a missing server of the shipped config gives. The wheel itself, built and installed into a
fresh venv, is tests/test_wheel.py."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from mcp_spec_proxy.cli import main
from mcp_spec_proxy.config.commands import resolve_command
from mcp_spec_proxy.errors import BackendError

REPO = Path(__file__).resolve().parent.parent
# `pip install 'mcp-spec-proxy[a,b]'`, `pipx install '.[a]'`, `uvx --from '.[a]'`: the extras in brackets.
INSTALL_EXTRAS = re.compile(r"(?:mcp-spec-proxy|\s'\.|\s\.)\[([a-z0-9_,-]+)\]")


def written_by_people() -> list[Path]:
    """Every file a user reads install lines in: the docs, the config, the scripts, the messages."""
    files = [REPO / "README.md", REPO / "servers.yaml", REPO / "Containerfile", *sorted((REPO / "docs").glob("*.md"))]
    files += sorted((REPO / "scripts").glob("*.sh")) + sorted((REPO / "mcp_spec_proxy").rglob("*.py"))
    return files


def test_every_extra_an_install_line_names_exists() -> None:
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named: dict[str, set[str]] = {}
    for path in written_by_people():
        for group in INSTALL_EXTRAS.findall(path.read_text(encoding="utf-8")):
            for extra in group.split(","):
                named.setdefault(extra, set()).add(str(path.relative_to(REPO)))
    assert {"servers", "postgres", "otel"} <= set(named)  # the pattern finds the lines it is for
    assert {extra: where for extra, where in named.items() if extra not in extras} == {}


def test_shipped_config_prints_the_servers_yaml_the_package_carries() -> None:
    result = CliRunner().invoke(main, ["shipped-config"])

    assert result.exit_code == 0, result.output
    assert result.output == (REPO / "servers.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("command", ["mcp-server-git", "mcp-server-time"])
def test_a_missing_server_of_the_shipped_config_names_the_extra_that_installs_it(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))

    with pytest.raises(BackendError) as caught:
        resolve_command("git", command)

    assert "pip install 'mcp-spec-proxy[servers]'" in str(caught.value)


def test_the_image_build_context_admits_what_the_containerfile_copies() -> None:
    admitted = {line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line[:1] == "!"}
    copied = [line.split()[1:-1] for line in (REPO / "Containerfile").read_text().splitlines() if line[:5] == "COPY "]
    sources = {name.rstrip("/") for names in copied if not any(n.startswith("--") for n in names) for name in names}
    assert {"LICENSE", "servers.yaml", "mcp_spec_proxy"} <= sources  # the wheel's license and its shipped config
    assert sources - admitted == set()
