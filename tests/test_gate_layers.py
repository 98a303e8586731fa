"""The gate is composed, not mixed in: it holds its policy, read door and stages, and no module of
`calls/` imports one that imports it back (type-only imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import mcp_spec_proxy.calls
from mcp_spec_proxy.calls.gate import Gate
from mcp_spec_proxy.calls.policy import Policy
from mcp_spec_proxy.calls.reads import Reads
from mcp_spec_proxy.calls.stages import WriteStages

CALLS = Path(mcp_spec_proxy.calls.__file__).parent
PREFIX = "mcp_spec_proxy.calls."


def _imports(path: Path) -> set[str]:
    """The `calls/` modules `path` imports anywhere in it, `if TYPE_CHECKING:` blocks and functions included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            found.add(node.module.removeprefix(PREFIX).split(".")[0])
        elif isinstance(node, ast.Import):
            found |= {a.name.removeprefix(PREFIX).split(".")[0] for a in node.names if a.name.startswith(PREFIX)}
    return found


def _graph() -> dict[str, set[str]]:
    return {path.stem: _imports(path) for path in CALLS.glob("*.py")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the modules, as the path that closes it; None when there is none."""
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph.get(module, ())):
            if (found := visit(imported, [*path, module])) is not None:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        if (found := visit(module, [])) is not None:
            return found
    return None


def test_no_module_of_the_gate_imports_one_that_imports_it_back() -> None:
    graph = _graph()
    assert "gate" not in graph["policy"] and "gate" not in graph["stages"]  # the policy knows the call, not the gate
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_finds_a_cycle_where_there_is_one() -> None:
    graph = {**_graph(), "policy": {*_graph()["policy"], "gate"}}  # the import the gate and policy once shared
    assert _cycle(graph) is not None


def test_the_gate_holds_its_policy_read_door_and_stages_and_inherits_none_of_them() -> None:
    assert Gate.__mro__ == (Gate, object)
    assert not issubclass(Gate, (Policy, Reads, WriteStages))
    assert {"policy", "reads", "_stages", "_audit", "drain"} <= set(Gate.__init__.__code__.co_names)
