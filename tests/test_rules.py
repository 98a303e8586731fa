"""`rules:` as values: what each rule decides, how a rule that cannot be evaluated fails closed,
and how a rule that does not compile is told (one line, the file and the rule's line)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from mcp_spec_proxy.calls.rules import Decision, Rules, principal_variables
from mcp_spec_proxy.config.schema import ProxyConfig, ReviewMode, load_config, parse_config_text
from mcp_spec_proxy.errors import ConfigError
from mcp_spec_proxy.tools.catalog import CatalogTool

RULES: list[dict[str, Any]] = [
    {"when": 'tool == "fs__write_file" && args.path.startsWith("/srv/notes/")', "review": "allow"},
    {"when": 'server == "bank" && args.amount > 100', "review": "human"},
    {"when": '"admins" in principal.groups', "review": "strong"},
    {"when": 'tool == "git__git_push"', "deny": "pushes go through CI", "name": "no-push"},
    {"when": 'tool == "db__query" && !args.sql.startsWith("SELECT")', "effect": "write"},
]


def tool(name: str, effect: str = "write", review: ReviewMode | None = None, **annotations: Any) -> CatalogTool:
    hints = types.ToolAnnotations.model_validate(annotations) if annotations else None
    definition = types.Tool(name=name, input_schema={"type": "object"}, annotations=hints)
    server, _, original = name.partition("__")
    return CatalogTool(name, server, original, definition, effect, "default", "", review, None, "", False)  # type: ignore[arg-type]  # effect: a test's literal


def rules(*extra: dict[str, Any], default: ReviewMode = "deny") -> Rules:
    config = ProxyConfig.model_validate({"rules": [*RULES, *extra], "review": {"default": default}})
    return Rules(config.rules, config.review.default)


def decide(name: str, args: dict[str, Any], principal: object | None = None, **kw: Any) -> Decision:
    return rules().decide(tool(name, **kw), args, principal, "s1")


def test_first_matching_rule_decides_and_is_named() -> None:
    assert decide("fs__write_file", {"path": "/srv/notes/a.md"}) == Decision(1, "allow")
    assert decide("bank__pay", {"amount": 250}) == Decision(2, "human")
    assert decide("bank__pay", {"amount": 50}) == Decision()  # no rule: the tool's own reviewer
    denied = Decision("no-push", None, "denied by rule no-push: pushes go through CI", True)
    assert decide("git__git_push", {}) == denied
    assert decide("db__query", {"sql": "DROP TABLE t"}, effect="read") == Decision(5, None, None, True)
    assert decide("db__query", {"sql": "SELECT 1"}, effect="read") == Decision()


def test_principal_is_read_from_a_mapping_or_an_object_and_is_empty_when_absent() -> None:
    assert decide("x__y", {}, {"sub": "ann", "groups": ["admins"]}) == Decision(3, "strong")
    assert decide("x__y", {}, None) == Decision()

    class Who:
        sub = "bob"
        scopes = "read write"  # OAuth's space-separated scope

    assert principal_variables(Who()) == {"sub": "bob", "client_id": "", "scopes": ["read", "write"], "groups": []}


def test_annotations_are_the_tools_as_listed() -> None:
    annotated = rules({"when": "annotations.destructiveHint == true", "deny": "no destroying"})
    decision = annotated.decide(tool("x__rm", destructiveHint=True), {}, None, "s1")
    assert decision.deny == "denied by rule 6: no destroying"


@pytest.mark.parametrize("amount", [2**70, -(2**63) - 1], ids=["2**70", "below-int64"])
def test_a_number_cel_cannot_hold_fails_the_rule_that_reads_it_closed(amount: int) -> None:
    decision = rules(default="allow").decide(tool("bank__pay"), {"amount": amount}, None, "s1")
    # Rule 2 cannot read it; no later rule matches: the stricter of rule 2 (human) and the tool's own (allow).
    assert (decision.rule, decision.review, decision.deny) == (2, "human", None)
    assert decision.failed is not None and "out of range" in decision.failed


@pytest.mark.parametrize("amount", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_nan_or_infinity_in_the_arguments_fails_every_rule_closed(amount: float) -> None:
    # `NaN > 100` is false in CEL: the bank rule would quietly not match. Every rule could have:
    # the strictest of them all decides, here rule 4's refusal.
    decision = rules(default="allow").decide(tool("bank__pay"), {"amount": amount}, None, "s1")
    assert decision.deny is not None and "pushes go through CI" in decision.deny and decision.write
    assert decision.rule == 1 and decision.failed is not None and "NaN" in decision.failed


def test_nan_deep_in_the_arguments_is_found_however_deep() -> None:
    deep: Any = math.nan
    for _ in range(5_000):
        deep = {"next": [deep]}
    decision = rules(default="allow").decide(tool("x__y"), {"deep": deep}, None, "s1")
    assert decision.failed is not None and decision.deny is not None


def test_text_that_is_not_unicode_fails_closed() -> None:
    decision = decide("fs__write_file", {"path": "/srv/notes/\ud800"})  # a lone surrogate, as JSON may carry
    # Rule 1 would allow it; it cannot say: the stricter of it and the tool's own reviewer (deny here).
    assert (decision.rule, decision.review) == (1, "deny") and decision.failed


def test_non_ascii_text_is_compared_as_text() -> None:
    assert decide("fs__write_file", {"path": "/srv/notes/ünïcödé €.md"}) == Decision(1, "allow")
    # A look-alike (Cyrillic U+043E for the o) is another path: no rule matches, the tool's reviewer decides.
    assert decide("fs__write_file", {"path": "/srv/n\u043etes/a.md"}) == Decision()


def test_a_rule_that_fails_takes_the_strictest_reviewer_of_the_rules_that_could_match() -> None:
    lenient = Rules(
        ProxyConfig.model_validate(
            {
                "rules": [
                    {"when": "args.amount > 100", "review": "human"},
                    {"when": 'tool == "bank__pay"', "review": "allow"},
                    {"when": 'tool == "other__tool"', "deny": "never"},
                ]
            }
        ).rules,
        "allow",
    )
    # Rule 1 throws (no such key); rule 2 matches; rule 3 cannot be reached: human, the strictest of 1 and 2.
    decision = lenient.decide(tool("bank__pay"), {}, None, "s1")
    assert (decision.rule, decision.review, decision.deny) == (1, "human", None)
    assert decision.failed is not None and "amount" in decision.failed
    # Rule 1 throws on a string; nothing later matches: the strictest of rule 1 and the tool's own (allow).
    decision = lenient.decide(tool("x__y"), {"amount": "1000"}, None, "s1")
    assert (decision.rule, decision.review) == (1, "human")


def test_a_rule_that_fails_on_a_read_makes_it_a_write_only_where_a_candidate_would() -> None:
    decision = decide("db__query", {"sql": 3}, effect="read")  # rule 5 throws: startsWith on an int
    # Rule 5 could have made it a write: it is one, and meets the tool's reviewer (deny in these tests).
    assert (decision.rule, decision.review, decision.write) == (5, "deny", True)
    quiet = Rules(ProxyConfig.model_validate({"rules": [{"when": "args.n > 1", "review": "human"}]}).rules, "deny")
    assert not quiet.decide(tool("r__read", effect="read"), {}, None, "s1").write


def test_rules_are_substituted_like_every_value_of_the_file() -> None:
    text = "rules:\n  - when: 'args.path.startsWith(\"${NOTES}/\")'\n    review: allow\n"
    config = parse_config_text(text, {"NOTES": "/home/ann/notes"})
    assert config.rules[0].when == 'args.path.startsWith("/home/ann/notes/")'


@pytest.mark.parametrize(
    ("when", "problem"),
    [
        ('tool == "a" &&', "Syntax error"),
        ("tool > 3", "no matching overload"),
        ("nosuch == 1", "the variables are tool, server, args, annotations, principal and session"),
        ('"text"', "gives a string, not true or false"),
    ],
)
def test_a_rule_that_does_not_compile_is_one_line_naming_file_and_line(tmp_path: Path, when: str, problem: str) -> None:
    config = tmp_path / "servers.yaml"
    config.write_text(f"servers: {{}}\nreview: {{default: human}}\nrules:\n  - review: allow\n    when: '{when}'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config, {})
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{config}:5: rules.0.when: `when`") and problem in message
    assert " — " in message  # the fix


def test_a_rule_must_decide_one_thing() -> None:
    with pytest.raises(ConfigError, match="either chooses a reviewer"):
        parse_config_text("rules: [{when: 'true', review: allow, deny: no way}]", {})
    with pytest.raises(ConfigError, match="must say what it decides"):
        parse_config_text("rules: [{when: 'true'}]", {})


def test_a_rules_reviewer_must_be_one_the_config_can_build() -> None:
    config = ProxyConfig.model_validate({"rules": [{"when": "true", "review": "strong"}]})
    assert config.review_modes()["rules.0.review"] == "strong"


def test_a_read_is_checked_only_against_the_rules_up_to_the_last_that_could_make_it_a_write() -> None:
    before = Rules(
        ProxyConfig.model_validate(
            {
                "rules": [
                    {"when": "true", "review": "human", "name": "everyone"},
                    {"when": 'tool == "db__query"', "effect": "write"},
                ]
            }
        ).rules,
        "allow",
    )
    # The first match still wins for a read: a reviewer's rule before a write rule keeps the read a read.
    assert before.decide(tool("db__query", effect="read"), {}, None, "s1") == Decision("everyone", "human")
    after = Rules(
        ProxyConfig.model_validate(
            {
                "rules": [
                    {"when": 'tool == "db__query" && !args.sql.startsWith("SELECT")', "effect": "write"},
                    {"when": "args.nosuch > 1", "review": "human", "name": "late"},
                ]
            }
        ).rules,
        "allow",
    )
    # Past the last write rule nothing can act on a read: rule "late" (which would fail) is not evaluated.
    assert after.decide(tool("db__query", effect="read"), {"sql": "SELECT 1"}, None, "s1") == Decision()
    assert after.decide(tool("db__query", effect="read"), {"sql": "DROP t"}, None, "s1") == Decision(
        1, None, None, True
    )
    # A write meets every rule, and a rule that fails before the cut fails closed over the later ones too.
    assert after.decide(tool("db__query"), {"sql": "SELECT 1"}, None, "s1").failed is not None
    failed = after.decide(tool("db__query", effect="read"), {"sql": 3}, None, "s1")
    assert (failed.rule, failed.review, failed.write) == (1, "human", True)
    reviewers_only = Rules(ProxyConfig.model_validate({"rules": [{"when": "true", "review": "human"}]}).rules, "allow")
    assert reviewers_only.decide(tool("x__read", effect="read"), {}, None, "s1") == Decision()
    assert reviewers_only.decide(tool("x__write"), {}, None, "s1") == Decision(1, "human")


def test_text_with_a_nul_fails_closed_rather_than_being_cut_short_by_the_runtime() -> None:
    # The CEL runtime reads text up to its first NUL: unchecked, rule 1 would allow this path.
    decision = decide("fs__write_file", {"path": "/srv/notes/a.md\x00/../../../etc/cron.d/x"})
    assert decision.failed is not None and "NUL" in decision.failed and decision.review != "allow"
    assert decision.deny is not None  # the strictest rule that could have matched: no-push's deny
    assert decide("fs__write_file", {"path": "/srv/notes/a.md"}) == Decision(1, "allow")
    assert decide("x__y", {"k\x00": 1}).failed is not None  # in a key too
