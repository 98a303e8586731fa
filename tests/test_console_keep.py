"""Saving a console decision as a rule of servers.yaml: the page offers the session rule a person set
as a `rules:` entry, and that entry, loaded as the operator would load it and evaluated by the
proxy's own CEL, admits the calls the session rule admits and none that it refuses."""

from __future__ import annotations

import re
from html import unescape
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import yaml

from mcp_spec_proxy.calls.rules import Decision, Rules
from mcp_spec_proxy.config.schema import parse_config_text
from mcp_spec_proxy.review.rules import Rule, config_rule
from mcp_spec_proxy.tools.catalog import CatalogTool
from tests.console_world import console_world
from tests.test_console_attacks import opened
from tests.test_console_rules import ruled

pytestmark = pytest.mark.anyio

HOSTILE = [
    "notes/../../../etc/cron.d/ev.md",
    "notes/..",
    "notes/.",
    "notes/.hidden",
    "notes/",
    "notes/a/b.md",
    "notes/..\\..\\etc",
    "notes/ev.md\n* * * * * root sh /tmp/x",
    "notes/ev\x00.md",
    "notes/ev\u202edm.exe",
    "notes/%2e%2e",
    "notes/\uff0e\uff0e",
    "other/a.md",
    "notes/" + "a" * 5000,
]


def kept_rules(text: str) -> Rules:
    """The page's YAML, loaded as servers.yaml would be (its review default: a person)."""
    config = parse_config_text(text + "review: {default: human}\n", {})
    return Rules(config.rules, config.review.default)


def toy_record() -> CatalogTool:
    definition = types.Tool(name="record", input_schema={"type": "object"})
    return CatalogTool("toy__record", "toy", "record", definition, "write", "default", "", None, None, "", False)


def allowed(rules: Rules, arguments: dict[str, Any]) -> bool:
    return rules.decide(toy_record(), arguments, None, "any") == Decision("console: toy__record", "allow")


async def test_the_page_offers_a_session_rule_as_a_servers_yaml_rule_that_admits_no_more(tmp_path: Path) -> None:
    async with console_world(tmp_path) as world:
        await ruled(world, "notes/a.md", {"value": "notes/*"})
        async with opened(world) as client:
            page = (await client.get("/")).text
    [block] = re.findall(r'<details class="keep">.*?<pre>(.*?)</pre>', page, re.S)
    text = unescape(block)
    assert yaml.safe_load(text)["rules"][0]["review"] == "allow"
    kept = kept_rules(text)
    assert allowed(kept, {"value": "notes/b.md"}) and allowed(kept, {"value": "notes/x..y.md"})
    assert [value for value in HOSTILE if allowed(kept, {"value": value})] == []
    assert not allowed(kept, {"value": "notes/b.md", "more": 1})  # the same keys, as the session rule asks


def test_an_exact_rule_is_kept_as_that_value_and_its_kind() -> None:
    exact: dict[str, Any] = {"value": 'a "quoted" \u00e9 \U0001f600 \\ line', "n": 3, "tags": ["x", {"k": None}]}
    rule = Rule("s1", "toy__record", "f", dict.fromkeys(exact), exact)
    text = config_rule(rule)
    assert text is not None
    kept = kept_rules(text)
    assert allowed(kept, exact)
    for changed in ({"n": 4}, {"n": "3"}, {"value": exact["value"] + " "}, {"tags": ["x"]}, {"n": True}):
        assert not allowed(kept, {**exact, **changed}), changed


def test_a_term_with_no_exact_cel_form_leaves_the_rule_unoffered() -> None:
    assert config_rule(Rule("s1", "toy__record", "f", {"value": None}, {"value": 2**70})) is None
    assert config_rule(Rule("s1", "toy__record", "f", {"value": None}, {"value": "\ud800"})) is None
    assert config_rule(Rule("s1", "toy__record", "f", {"value": "notes/%2a*"})) is None
    assert config_rule(Rule("s1", "toy__record", "f", {"value": "notes/é*"})) is None
