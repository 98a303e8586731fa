"""Every link in README.md and docs/*.md resolves: a relative file exists, and a `#anchor` names a heading of
the file it points into, slugged as GitHub slugs headings (so a link that works here works on GitHub too).

The README is a front door that sends readers to docs/ pages for the reference; a link that leads nowhere
loses them, and a heading renamed in one page silently breaks another page's anchor.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target) and ![alt](target), with an optional "title"; the text may hold `code` and brackets one deep.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's slug of a heading's text (github-slugger): markup dropped, lower case, every character that
    is not a letter, digit, `_`, `-` or space removed, each space a hyphen (runs are not collapsed)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays, its target goes
    text = text.replace("`", "").replace("*", "")
    text = text.lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "_- ")
    return text.replace(" ", "-")


def outside_code(text: str, *, blank_inline: bool = True) -> list[tuple[int, str]]:
    """The file's lines outside fenced code blocks, numbered from 1, with inline code blanked out (a link
    written inside backticks is an example, not a link) unless `blank_inline` is false (a heading's code
    is part of its anchor)."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line) if blank_inline else line))
    return lines


def anchors(path: Path) -> set[str]:
    """Every anchor a page offers: its headings' slugs, numbered as GitHub numbers repeats, and HTML anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in outside_code(path.read_text(encoding="utf-8"), blank_inline=False):
        found.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """Each link of `path` that leads nowhere, as `file:line: target (why)`."""
    problems: list[str] = []
    for number, line in outside_code(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: — not ours to check here
                continue
            file_part, _, anchor = target.partition("#")
            into = (path.parent / unquote(file_part)).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}:{number}: {target}"
            if not into.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and into.suffix == ".md" and unquote(anchor) not in anchors(into):
                problems.append(f"{where} (no heading with that anchor in {into.name})")
    return problems


def test_every_link_in_the_readme_and_docs_resolves() -> None:
    problems = [problem for page in pages() for problem in broken_links(page)]
    assert not problems, "\n".join(problems)


def test_the_readme_links_to_every_docs_page() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    linked = {Path(target.partition("#")[0]).name for _, line in outside_code(readme) for target in LINK.findall(line)}
    missing = [page.name for page in sorted((REPO / "docs").glob("*.md")) if page.name not in linked]
    assert not missing, f"docs pages the README does not link to: {missing}"


def test_the_readme_is_a_front_door_under_250_lines() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines < 250, f"README.md has {lines} lines"


def test_the_two_commands_and_the_desktop_snippet_are_near_the_top() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    first_screen = "\n".join(readme[:40])
    assert "scripts/serve.sh" in first_screen and "scripts/test.sh" in first_screen
    assert '"mcpServers"' in "\n".join(readme[:50])


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        (
            "Conformance: the MCP conformance suite directly, behind mcp-spec-proxy, behind fastmcp",
            "conformance-the-mcp-conformance-suite-directly-behind-mcp-spec-proxy-behind-fastmcp",
        ),
        ("τ²-bench retail with real endpoints", "τ²-bench-retail-with-real-endpoints"),
        ("Read-path overhead (stdio → stdio)", "read-path-overhead-stdio--stdio"),
        (
            "Tool search at catalog scale (recall@5, bytes a client reads)",
            "tool-search-at-catalog-scale-recall5-bytes-a-client-reads",
        ),
        ("`servers.yaml` reference", "serversyaml-reference"),
        ("Changed definitions (rug-pull guard)", "changed-definitions-rug-pull-guard"),
        ("What `review: leash` trusts", "what-review-leash-trusts"),
    ],
)
def test_headings_slug_as_github_slugs_them(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_a_link_to_a_missing_file_or_heading_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "PAGE.md").write_text(
        "# A page\n\n## Its second heading\n\n## Its second heading\n\n## `code` in it\n"
    )
    (tmp_path / "README.md").write_text(
        "[fine](docs/PAGE.md#its-second-heading) [repeat](docs/PAGE.md#its-second-heading-1)\n"
        "[code](docs/PAGE.md#code-in-it)\n"
        "[gone](docs/GONE.md) [no heading](docs/PAGE.md#a-third-heading) [here](#nowhere)\n"
        "`[in code](docs/NOT-A-LINK.md)` [web](https://example.com/x#y)\n"
        "```\n[fenced](docs/ALSO-NOT.md)\n```\n"
    )
    problems = broken_links(tmp_path / "README.md")
    assert problems == [
        "README.md:3: docs/GONE.md (no such file)",
        "README.md:3: docs/PAGE.md#a-third-heading (no heading with that anchor in PAGE.md)",
        "README.md:3: #nowhere (no heading with that anchor in README.md)",
    ]
