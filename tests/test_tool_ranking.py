"""How `rank: words` orders tools (`toolwords`): synonyms of API verbs and nouns, field weights,
and the read/write cue of a request's verb. Each test builds a small catalog where the piece under
test decides the order, so it fails without it."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from mcp_spec_proxy.tools.search import ToolIndex
from mcp_spec_proxy.tools.words import cue, expand, words

pytestmark = pytest.mark.anyio

READ = types.ToolAnnotations(read_only_hint=True)


def tool(name: str, description: str = "", arguments: tuple[str, ...] = (), **more: Any) -> types.Tool:
    schema = {"type": "object", "properties": {argument: {"type": "string"} for argument in arguments}}
    return types.Tool(name=name, description=description, input_schema=schema, **more)


async def ranked(query: str, group: bool = True, **servers: list[types.Tool]) -> list[str]:
    cfg = ProxyConfig.model_validate({"servers": {name: {"command": "x"} for name in servers}})
    catalog = Catalog(cfg, FingerprintStore(None))
    for name, tools in servers.items():
        catalog.set_tools(name, tools)
    hits = await ToolIndex(catalog.tools, None, "words").search(query, 5, group=group)
    return [hit.tool.name for hit in hits]


@pytest.mark.parametrize(
    ("query", "first"),
    [
        ("remove the old folder", "fs__delete_directory"),  # remove ~ delete, folder ~ directory
        ("make a new directory", "fs__create_directory"),  # make ~ create
        ("display the commit log", "git__log"),  # display ~ show: "Shows the commit logs"
    ],
)
async def test_a_request_in_other_words_finds_the_tool_through_its_synonyms(query: str, first: str) -> None:
    # Without synonyms the first request finds nothing, the second ranks `delete_directory` first
    # and the third `log_settings`.
    fs = [
        tool("delete_directory", "Delete a directory and every directory in it."),
        tool("create_directory", "Create a directory, with its parents where they are missing."),
        tool("read_file", "Read a file."),
    ]
    git = [tool("log", "Shows the commit logs of a repository."), tool("log_settings", "Commit log settings.")]

    assert (await ranked(query, fs=fs, git=git))[0] == first


async def test_the_literal_word_outranks_its_synonym() -> None:
    assert await ranked("delete the item", a=[tool("remove_item"), tool("delete_item")]) == [
        "a__delete_item",
        "a__remove_item",
    ]
    assert expand(["delete"])["delete"] == 1.0 > expand(["delete"])["remove"] > 0


async def test_a_word_in_a_tool_s_name_counts_more_than_the_same_word_among_its_arguments() -> None:
    # Without the arguments' half weight, `tag`'s one short argument list outweighs the longer name.
    tools = [
        tool("tag", arguments=("label",)),
        tool("print_shipping_label_now"),
        tool("noop", arguments=("alpha", "beta", "gamma", "delta", "epsilon", "zeta")),
    ]

    assert (await ranked("label", a=tools))[:2] == ["a__print_shipping_label_now", "a__tag"]


async def test_the_request_s_verb_prefers_tools_of_the_effect_it_asks_for() -> None:
    # The same words on two servers, a read on one and a write on the other: only the verb decides.
    # (Ungrouped: grouped, two servers' tools of one name are look-alikes and one hit.)
    servers = {
        "looks": [tool("notes", "The team's notes.", annotations=READ)],
        "writes": [tool("notes", "The team's notes.")],
    }

    assert (await ranked("what notes does the team keep", False, **servers))[0] == "looks__notes"
    assert (await ranked("wipe and rewrite the team notes: delete them", False, **servers))[0] == "writes__notes"


def test_the_cue_is_a_question_or_the_first_verb_that_reads_or_changes() -> None:
    assert cue("What files are in docs?") == "read"
    assert cue("Please list the tables") == "read"
    assert cue("Could you delete the draft?") == "write"
    assert cue("The folder is missing, create it") == "write"  # `is` cues only a question
    assert cue("Bob and Carol") is None


def test_show_is_a_word_of_the_request_and_get_is_not() -> None:
    assert words("show me the log") == ["show", "log"]
    assert words("get me the log") == ["log"]
