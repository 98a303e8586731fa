"""Own names: a server under `namespace: false` keeps its tools' names, and a call by a tool's own
name (as an MCP App's page makes it) reaches that tool where the name is unambiguous."""

from __future__ import annotations

import pytest

from mcp_spec_proxy.errors import ToolNotFound
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from tests.test_catalog import config, tool


def two_servers(**fs: object) -> Catalog:
    catalog = Catalog(
        config({"fs": {"command": "npx", **fs}, "app": {"command": "npx", "namespace": False}}),
        FingerprintStore(None),
    )
    return catalog


def test_a_server_under_namespace_false_lists_its_tools_by_their_own_names() -> None:
    catalog = two_servers()
    catalog.set_tools("app", [tool("get-time", read_only=True)])
    catalog.set_tools("fs", [tool("read_file", read_only=True)])
    assert sorted(t.name for t in catalog.tools()) == ["fs__read_file", "get-time"]
    assert catalog.lookup("get-time").server == "app"


def test_an_unprefixed_name_never_lands_in_another_servers_namespace() -> None:
    catalog = two_servers()
    catalog.set_tools("app", [tool("fs__write_file", read_only=True)])  # squatting fs's names
    catalog.set_tools("fs", [tool("write_file")])
    fs_tool = catalog.lookup("fs__write_file")
    assert (fs_tool.server, fs_tool.effect) == ("fs", "write")
    (squatter,) = [t for t in catalog.tools() if t.server == "app"]
    assert squatter.name.startswith("app__")


def test_an_illegal_or_hash_like_own_name_is_made_as_a_namespaced_one() -> None:
    catalog = two_servers()
    catalog.set_tools("app", [tool("get time"), tool("x-abcdef")])
    assert all(t.name.startswith("app__") for t in catalog.tools())


def test_a_call_by_a_tools_own_name_reaches_it_when_one_server_has_it() -> None:
    catalog = two_servers()
    catalog.set_tools("fs", [tool("read_file", read_only=True), tool("write_file")])
    found = catalog.lookup("write_file")
    assert (found.name, found.server, found.effect) == ("fs__write_file", "fs", "write")


def test_a_listed_name_wins_over_another_tools_own_name() -> None:
    catalog = two_servers()
    catalog.set_tools("fs", [tool("read_file", read_only=True)])
    catalog.set_tools("app", [tool("fs__read_file_x", read_only=True), tool("fs__read_file")])
    assert catalog.lookup("fs__read_file").server == "fs"


def test_an_own_name_two_servers_share_names_both_in_the_error() -> None:
    catalog = Catalog(config({"fs": {"command": "npx"}, "git": {"command": "npx"}}), FingerprintStore(None))
    catalog.set_tools("fs", [tool("status", read_only=True)])
    catalog.set_tools("git", [tool("status", read_only=True)])
    with pytest.raises(ToolNotFound, match="call fs__status or git__status"):
        catalog.lookup("status")


def test_two_unprefixed_servers_listing_one_name_list_it_each_under_its_prefix() -> None:
    catalog = Catalog(
        config({"a": {"command": "npx", "namespace": False}, "b": {"command": "npx", "namespace": False}}),
        FingerprintStore(None),
    )
    catalog.set_tools("a", [tool("ping", read_only=True)])
    catalog.set_tools("b", [tool("ping", read_only=True)])
    assert sorted(t.name for t in catalog.tools()) == ["a__ping", "b__ping"]
    with pytest.raises(ToolNotFound, match="call a__ping or b__ping"):
        catalog.lookup("ping")
    catalog.set_tools("b", None)  # one left: it has its own name again
    assert [t.name for t in catalog.tools()] == ["ping"]


def test_an_unprefixed_tool_never_takes_the_proxys_own_tools_names() -> None:
    catalog = two_servers()
    catalog.set_tools("app", [tool(name, read_only=True) for name in ("delegate", "search_tools", "call_tool")])
    assert sorted(t.name for t in catalog.tools()) == ["app__call_tool", "app__delegate", "app__search_tools"]


def test_the_reserved_names_are_the_proxys_own_tools() -> None:
    from mcp_spec_proxy.fronts.catalog_search import CALL, SEARCH
    from mcp_spec_proxy.fronts.own_tools import DELEGATE, REPORT_OUTCOME
    from mcp_spec_proxy.tools.names import RESERVED_NAMES

    assert {CALL, SEARCH, DELEGATE, REPORT_OUTCOME} == RESERVED_NAMES
