"""The exception tree drawn in `errors.py` is the tree the package defines, and signals stay out of it.

Every module of the package is imported, every subclass of `ProxyError` is walked, and the drawing
must name each one under its own parent (and, for a class defined elsewhere, the module it lives
in); a name drawn that no class has is an error too. `InputNeeded` is control flow, not an error:
no handler of the proxy's errors may take it for one (STYLE.md, rule 16).
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

import mcp_spec_proxy
from mcp_spec_proxy import errors
from mcp_spec_proxy.errors import ConfigError, ProxyError
from mcp_spec_proxy.review import InputNeeded

BRANCH = re.compile(r"^(?P<indent>(?:│   |    )*)(?:├── |└── )(?P<name>\w+)\s+(?P<what>.*)$")


def drawn() -> dict[str, tuple[str, str]]:
    """The drawing in `errors.py`'s docstring: each class, its parent and the words beside it."""
    lines = [line.removeprefix("    ") for line in (errors.__doc__ or "").splitlines()]
    roots = [line for line in lines if line.startswith("ProxyError ")]
    assert len(roots) == 1, "the drawing starts at one ProxyError line"
    tree: dict[str, tuple[str, str]] = {}
    parents = ["ProxyError"]  # the chain of names above the branch being read, by depth
    for line in lines[lines.index(roots[0]) + 1 :]:
        match = BRANCH.match(line)
        if match is None:
            break  # the drawing ends at the first line that is no branch
        depth = len(match["indent"]) // 4
        parents = [*parents[: depth + 1], match["name"]]
        tree[match["name"]] = (parents[depth], match["what"])
    return tree


def defined() -> dict[str, type[ProxyError]]:
    """Every subclass of `ProxyError` the package defines, once all of its modules are imported."""
    for module in pkgutil.walk_packages(mcp_spec_proxy.__path__, "mcp_spec_proxy."):
        importlib.import_module(module.name)
    found: dict[str, type[ProxyError]] = {}
    pending = list(ProxyError.__subclasses__())
    while pending:
        cls = pending.pop()
        assert cls.__name__ not in found or found[cls.__name__] is cls, f"two classes named {cls.__name__}"
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


def module_path(cls: type) -> str:
    """How the drawing names a module: `models.py`, `review/` (a package), `review/console.py`."""
    module = importlib.import_module(cls.__module__)
    relative = cls.__module__.removeprefix("mcp_spec_proxy.").replace(".", "/")
    return f"{relative}/" if (module.__file__ or "").endswith("__init__.py") else f"{relative}.py"


def test_the_drawn_tree_names_every_proxy_error_under_its_own_parent() -> None:
    tree, classes = drawn(), defined()

    assert sorted(tree) == sorted(classes), "the drawing and the package disagree on which classes exist"
    for name, cls in classes.items():
        parent = cls.__bases__[0].__name__
        assert tree[name][0] == parent, f"{name} is drawn under {tree[name][0]}, but its parent is {parent}"


def test_a_class_defined_outside_errors_py_is_drawn_with_its_module() -> None:
    tree = drawn()
    for name, cls in defined().items():
        if cls.__module__ == errors.__name__:
            continue
        assert tree[name][1].startswith(f"{module_path(cls)}: "), f"{name} lives in {module_path(cls)}"


def test_every_drawn_wire_code_is_the_class_own() -> None:
    classes = defined()
    for name, (_, what) in drawn().items():
        code = re.search(r"\s(-32\d{3})$", what)
        own = getattr(classes[name], "code", None)
        if code is not None and name != "ToolNotFound":  # Invalid Params, chosen by `wire_error`
            assert own == int(code[1]), f"{name} is drawn with {code[1]} but carries {own}"


def test_input_needed_is_a_signal_outside_the_error_tree() -> None:
    assert issubclass(InputNeeded, Exception)
    assert not issubclass(InputNeeded, ProxyError)

    # A handler of the proxy's own errors lets the signal pass on to the one that answers it.
    with pytest.raises(InputNeeded):
        try:
            raise InputNeeded("approval", "may I?", {})
        except ProxyError:
            pytest.fail("InputNeeded was taken for a proxy error")


def test_one_config_problem_reads_as_one_line() -> None:
    error = ConfigError("servers.yaml:4", "servers.fs.timout", "unknown key", "did you mean `timeout`?")

    assert str(error) == "servers.yaml:4: servers.fs.timout: unknown key — did you mean `timeout`?"
    assert [str(problem) for problem in error.problems] == [str(error)]
