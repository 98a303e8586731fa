"""The text of a config file, read: YAML or JSON parsed, `${VAR}` references expanded, and every
mistake told at the line and the key the user wrote, with what to change (`config/schema.py` holds the
models and calls these; this module knows no model by name).

Mistakes are gathered, not raised one by one: `expand` notes each reference it cannot expand and
leaves it as written, `validation_problems` turns every pydantic error into a `ConfigProblem`
(each mistake once), and `every_problem` puts them all in the file's order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

from mcp_spec_proxy.config import CONFIG_REFERENCE
from mcp_spec_proxy.errors import ConfigError, ConfigProblem

Loc = tuple[str, ...]
Found = Sequence[tuple[Loc, ConfigProblem]]  # each problem with the key path it is about

_NONE = object()  # no such key in what the user wrote
# `${NAME}`, `${NAME:-default}`, and VS Code's spelling of the first, `${env:NAME}`.
_ENV_REF = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_INPUT_REF = re.compile(r"\$\{input:([^}]*)\}")  # VS Code asks the user for it when it starts the server
# A client's key the proxy cannot honour, and what to write instead.
_CLIENT_KEY_FIXES = {
    "envFile": "the proxy does not read an envFile: copy its variables into `env` (values may be ${VAR})",
}


def parse(file: str, text: str, *, json_file: bool) -> Any:
    """The file's data; text that is no YAML (or JSON) is a `ConfigError` at its line."""
    if json_file:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            try:  # VS Code's and Cursor's files are JSON with comments and trailing commas
                return json.loads(plain_json(text))
            except json.JSONDecodeError:
                raise ConfigError(f"{file}:{exc.lineno}", "", f"invalid JSON: {exc.msg}") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 0
        raise ConfigError(f"{file}:{line}", "", f"invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(file, "", f"invalid YAML: {exc}") from None


def plain_json(text: str) -> str:
    """JSON with comments (`//`, `/* */`) and trailing commas, as VS Code and Cursor allow, as plain
    JSON: each comment blanked to spaces and each trailing comma to a space, so every line keeps its
    number. Plain JSON comes back as it was."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':  # a string, escapes and all, as it is
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i : end + 1])
            i = end + 1
            continue
        if text.startswith("//", i) or text.startswith("/*", i):
            line_comment = text[i + 1] == "/"
            end = text.find("\n" if line_comment else "*/", i + 2)
            end = n if end < 0 else end + (0 if line_comment else 2)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if ch == "," and re.match(r"(?:\s|//[^\n]*|/\*.*?\*/)*[}\]]", text[i + 1 :], re.DOTALL):
            ch = " "
        out.append(ch)
        i += 1
    return "".join(out)


def expand(
    file: str,
    lines: Lines,
    value: Any,
    environ: Mapping[str, str],
    loc: Loc,
    problems: list[tuple[Loc, ConfigProblem]],
) -> Any:
    """`value` with its `${VAR}` references expanded; a reference that cannot be is added to
    `problems` and left as written, so the rest of the file is still checked."""
    if isinstance(value, str):
        rest = _ENV_REF.sub("", value)
        unset = [m.group(1) for m in _ENV_REF.finditer(value) if m.group(1) not in environ and m.group(2) is None]
        if "${" not in rest and not unset:

            def substitute(match: re.Match[str]) -> str:
                name, default = match.group(1), match.group(2)
                return environ[name] if name in environ else str(default)

            return _ENV_REF.sub(substitute, value)
        line = lines.of(loc)
        where, key = f"{file}:{line}" if line else file, ".".join(loc)
        prompted = _INPUT_REF.search(rest)
        if prompted:
            name = re.sub(r"[^A-Za-z0-9]+", "_", prompted.group(1)).strip("_").upper() or "VALUE"
            problem = f"{prompted.group(0)} is a value VS Code asks for when it starts the server"
            fix = f"the proxy asks no one: export the value as {name} and write ${{{name}}}"
            problems.append((loc, ConfigProblem(where, key, problem, fix)))
            return value
        if "${" in rest:
            broken = rest[rest.index("${") :][:40]
            fix = "close it with `}` — ${NAME} or ${NAME:-default}, NAME of letters, digits and _"
            problems.append((loc, ConfigProblem(where, key, f"{broken!r} is not a complete ${{VAR}} reference", fix)))
            return value
        for name in dict.fromkeys(unset):
            fix = f"export {name}, or write ${{{name}:-default}}"
            problems.append((loc, ConfigProblem(where, key, f"environment variable {name} is not set", fix)))
        return value
    if isinstance(value, dict):
        return {key: expand(file, lines, item, environ, (*loc, str(key)), problems) for key, item in value.items()}
    if isinstance(value, list):
        return [expand(file, lines, item, environ, (*loc, str(index)), problems) for index, item in enumerate(value)]
    return value


MISSING_FILE_FIX = (
    "pass --config with the path of your servers.yaml (`mcp-spec-proxy shipped-config > servers.yaml` writes the"
    " shipped one to start from)"
)


def error_at(loc: tuple[str, ...], message: str, value: Any) -> ValidationError:
    """A validation error at `loc`, for a check that needs the whole file but names one key."""
    error = InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=value)
    return ValidationError.from_exception_data("ProxyConfig", [error])


def validation_problems(
    file: str,
    lines: Lines,
    data: Any,
    exc: ValidationError,
    *,
    keys: frozenset[str],
    suggestions: Sequence[str],
    unexpanded: Found = (),
) -> Found:
    """Every mistake pydantic found, each at the key the user wrote. A value whose `${VAR}` did not
    expand (`unexpanded`) fails its checks too: that is the same mistake, and is not told again;
    a key that is unknown or missing is its own mistake, whatever its value."""
    found: list[tuple[Loc, ConfigProblem]] = []
    gone = [at for at, _ in unexpanded]
    for error in _one_member_per_union(data, exc.errors(), keys):
        loc, _ = _written(data, error, keys)
        if error["type"] not in ("extra_forbidden", "missing") and any(_related(loc, at) for at in gone):
            continue
        # Servers arrive under `mcpServers` in Claude Desktop files; name the key the user wrote.
        shown = loc
        if loc and loc[0] == "servers" and "mcpServers" in lines.text and "servers:" not in lines.text:
            shown = ("mcpServers", *loc[1:])
        line = lines.of(shown)
        problem = _problem(f"{file}:{line}" if line else file, shown, error, suggestions)
        if all(problem != known for _, known in found):  # two union members can say one thing
            found.append((loc, problem))
    return found


def _problem(where: str, loc: Loc, error: ErrorDetails, suggestions: Sequence[str]) -> ConfigProblem:
    key, kind = ".".join(loc), error["type"]
    if kind == "extra_forbidden":
        return ConfigProblem(where, key, "unknown key", suggest(loc[-1], suggestions))
    if kind == "missing":
        return ConfigProblem(where, key, "required key is missing")
    if kind == "literal_error":
        expected = str(error.get("ctx", {}).get("expected", "one of the allowed values"))
        return ConfigProblem(where, key, f"{error['input']!r} is not allowed", f"use {expected}")
    return ConfigProblem(where, key, str(error["msg"]).removeprefix("Value error, "))


def _written(data: Any, error: ErrorDetails, keys: frozenset[str]) -> tuple[Loc, int | None]:
    """The error's key path as the user wrote it, and where in its `loc` a union member is named.
    Inside a union pydantic names the member it tried (`PostgresStore`, `literal['files']`) as if
    it were a key; such names are left out of the path."""
    loc = error["loc"]
    written: list[str] = []
    member: int | None = None
    node = data
    for index, part in enumerate(loc):
        # YAML keys need not be strings (`1:`, `yes:`); pydantic's path may name them either way.
        written_key = next((key for key in node if str(key) == str(part)), _NONE) if isinstance(node, dict) else _NONE
        if written_key is not _NONE:
            node = node[written_key]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        elif str(part) not in keys:  # a key left at its default, or one missing, is still a key
            member = index if member is None else member
            continue
        written.append(str(part))
    return tuple(written), member


def _one_member_per_union(data: Any, errors: list[ErrorDetails], keys: frozenset[str]) -> list[ErrorDetails]:
    """Where a value matches no member of a union, pydantic says why for each member; the user
    meant one of them: the one whose errors reach furthest into what they wrote (the first on a tie)."""
    chosen: dict[Loc, tuple[str, int]] = {}  # a union's key path: its member, how deep
    members: list[tuple[Loc, str] | None] = []
    for error in errors:
        written, index = _written(data, error, keys)
        if index is None:
            members.append(None)
            continue
        union, member = written[:index], str(error["loc"][index])  # every part before the first member is a key
        members.append((union, member))
        best = chosen.get(union)
        if best is None or len(written) > best[1]:
            chosen[union] = (member, len(written))
    return [
        error
        for error, tagged in zip(errors, members, strict=True)
        if tagged is None or chosen[tagged[0]][0] == tagged[1]
    ]


def every_problem(*found: Found) -> list[ConfigProblem]:
    """Every problem found, in the file's order (one with no line, about the whole file, first)."""

    def line(problem: ConfigProblem) -> int:
        number = problem.file.rpartition(":")[2]
        return int(number) if number.isdigit() else 0

    return sorted((problem for problems in found for problem in (p for _, p in problems)), key=line)


def _related(a: Loc, b: Loc) -> bool:
    """Whether one key path lies inside the other (or they are the same)."""
    return a[: len(b)] == b or b[: len(a)] == a


def suggest(key: str, suggestions: Sequence[str]) -> str:
    """The fix for an unknown key: the first of `suggestions` it looks like a typo of, if any."""
    if key in _CLIENT_KEY_FIXES:
        return _CLIENT_KEY_FIXES[key]
    close = [name for name in suggestions if _similar(key, name)]
    if close:
        return f"did you mean `{close[0]}`?"
    return f"remove it or check its spelling against {CONFIG_REFERENCE}"


def _similar(a: str, b: str) -> bool:
    if a == b:
        return False
    a, b = a.lower(), b.lower()
    if a.replace("-", "_") == b or a in b or b in a:
        return True
    # One edit apart is a typo worth naming.
    if abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        # One letter changed, or two neighbours swapped (`oltp`, `tiemout`).
        return len(differ) <= 1 or (
            len(differ) == 2
            and differ[1] == differ[0] + 1
            and a[differ[0]] == b[differ[1]]
            and a[differ[1]] == b[differ[0]]
        )
    # A letter dropped or added anywhere (`timout`, `commmand`), not only at the end.
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


class Lines:
    """The 1-based line of each key path in a file's YAML/JSON text (JSON is YAML). The text is
    composed once, when a line is first asked for: a file with many mistakes is read once, not
    once per mistake."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._root: yaml.Node | None = None
        self._composed = False

    def of(self, loc: Loc) -> int | None:
        """The line of `loc`, or of the deepest part of it that is written; None where none is."""
        if not self._composed:
            self._composed = True
            try:
                self._root = yaml.compose(self.text)
            except yaml.YAMLError:
                self._root = None
        node, line = self._root, None
        for part in loc:
            if isinstance(node, yaml.MappingNode):
                for key_node, value_node in node.value:
                    if key_node.value == part or (part == "servers" and key_node.value == "mcpServers"):
                        line = key_node.start_mark.line + 1
                        node = value_node
                        break
                else:
                    return line
            elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
                node = node.value[int(part)]
                line = node.start_mark.line + 1
            else:
                return line
        return line


def fields_of(model: type[BaseModel]) -> frozenset[str]:
    """Every key `model` and the models inside it define."""
    names: set[str] = set()
    pending: list[Any] = [model]
    seen: set[Any] = set()
    while pending:
        kind = pending.pop()
        if kind in seen:
            continue
        seen.add(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names.update(kind.model_fields)
            pending.extend(field.annotation for field in kind.model_fields.values())
        else:
            pending.extend(get_args(kind))
    return frozenset(names)
