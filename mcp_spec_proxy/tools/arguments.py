"""The arguments of a tool call, checked before anything is reviewed or forwarded.

First no value JSON cannot carry (a lone surrogate in a key or a string, NaN or an infinity),
however deep; then the tool's input schema, with its validator built once per tool. A problem is
an `InvalidArguments` that names every one found (up to five), so the caller can fix them at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mcp_spec_proxy.errors import InvalidArguments

if TYPE_CHECKING:
    import jsonschema  # loaded by the first call checked: a proxy starts without it

    from mcp_spec_proxy.tools.catalog import CatalogTool

_SURROGATE = re.compile(r"[\ud800-\udfff]")


def check_arguments(
    validators: dict[str, jsonschema.protocols.Validator], tool: CatalogTool, arguments: Mapping[str, Any]
) -> None:
    """Raise `InvalidArguments` naming every problem, with the tool's validator built once and cached.

    A value no JSON can carry is refused first, however deep: a lone surrogate (a key or a
    string) has no UTF-8 form, and NaN or an infinity is no JSON number (it passes any `minimum`
    and `maximum`, and is written `null` on the wire): a reviewer, the console and the audit would
    see one value and the backend get another.
    """
    found = _unsendable(arguments)
    if found is not None:
        where, what = found
        raise InvalidArguments(f"invalid arguments for {tool.name}: arguments contain {what} at {where}")
    validator = validators.get(tool.name)
    if validator is None:
        import jsonschema

        schema = dict(tool.input_schema)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError:
            # A tool with a broken schema still gets its calls: its server will judge them itself.
            cls = jsonschema.Draft202012Validator
            schema = {"type": "object"}
        validator = validators[tool.name] = cls(schema)
    errors = sorted(validator.iter_errors(dict(arguments)), key=lambda e: list(e.absolute_path))
    if errors:
        problems = "; ".join(_describe(error) for error in errors[:5])
        raise InvalidArguments(f"invalid arguments for {tool.name}: {problems}")


def _unsendable(arguments: Mapping[str, Any]) -> tuple[str, str] | None:
    """The path of a key or string holding a lone surrogate, or of a non-finite number, and which
    it is; None when there is none.

    Iterative, so arguments nested deeper than the recursion limit are checked too. The path
    shows keys with their surrogates escaped (`a.b\\udc80.2`), so the message itself is valid text.
    """
    stack: list[tuple[tuple[str, ...], Any]] = [((), arguments)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return ".".join(path) or "(the arguments)", _SURROGATE_WHAT
        elif isinstance(value, float):
            if not math.isfinite(value):
                return ".".join(path) or "(the arguments)", "a number JSON cannot carry (NaN or an infinity)"
        elif isinstance(value, Mapping):
            children: list[tuple[tuple[str, ...], Any]] = []
            for key, item in value.items():
                label = _printable(str(key))
                if isinstance(key, str) and _SURROGATE.search(key):
                    return ".".join((*path, label)), _SURROGATE_WHAT
                children.append(((*path, label), item))
            stack.extend(reversed(children))
        elif isinstance(value, list | tuple):
            stack.extend(reversed([((*path, str(index)), item) for index, item in enumerate(value)]))
    return None


_SURROGATE_WHAT = "invalid Unicode (a lone surrogate)"


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _describe(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    return f"{path}: {error.message}" if path else error.message


__all__ = ["check_arguments"]
