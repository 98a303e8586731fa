"""The catalog: public names, effect classification, definitions, validation; and the fingerprint store."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.errors import InvalidArguments, StateError, ToolNotFound
from mcp_spec_proxy.tools.catalog import (
    INTENT_ARGUMENT,
    INTENT_SCHEMA,
    Catalog,
    CatalogTool,
    strip_intent,
)
from mcp_spec_proxy.tools.classification import included
from mcp_spec_proxy.tools.fingerprints import FingerprintStore, fingerprint, write_atomic
from mcp_spec_proxy.tools.names import public_name

OBJECT: dict[str, Any] = {"type": "object"}


def tool(
    name: str,
    *,
    read_only: bool | None = None,
    schema: dict[str, Any] | None = None,
    description: str | None = None,
    **extra: Any,
) -> types.Tool:
    annotations = types.ToolAnnotations(read_only_hint=read_only) if read_only is not None else None
    return types.Tool(
        name=name,
        description=description,
        input_schema=schema if schema is not None else OBJECT,
        annotations=annotations,
        **extra,
    )


def config(servers: dict[str, Any] | None = None, **top: Any) -> ProxyConfig:
    return ProxyConfig.model_validate({"servers": servers or {"fs": {"command": "npx"}}, **top})


def catalog_of(
    tools: list[types.Tool], server: dict[str, Any] | None = None, store: FingerprintStore | None = None, **top: Any
) -> Catalog:
    catalog = Catalog(config({"fs": {"command": "npx", **(server or {})}}, **top), store or FingerprintStore(None))
    catalog.set_tools("fs", tools)
    return catalog


def only(catalog: Catalog) -> CatalogTool:
    (entry,) = catalog.tools()
    return entry


def suffix(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:6]


# -- public names ----------------------------------------------------------------------------


def test_public_name_joins_server_and_tool_with_the_separator() -> None:
    assert public_name("fs", "read_file", "__", 64) == "fs__read_file"
    assert public_name("fs", "read_file", ".", 64) == "fs.read_file"


def test_public_name_replaces_illegal_characters_and_adds_a_hash_suffix() -> None:
    name = public_name("fs", "read file/now", "__", 64)

    assert name == f"fs__read_file_now-{suffix('fs/read file/now')}"


def test_public_names_of_tools_differing_only_in_illegal_characters_differ() -> None:
    assert public_name("fs", "a b", "__", 64) != public_name("fs", "a:b", "__", 64)
    assert public_name("fs", "a b", "__", 64) != "fs__a_b"


def test_long_public_name_is_cut_to_exactly_the_limit_with_a_six_hex_suffix() -> None:
    tool_name = "x" * 100

    name = public_name("fs", tool_name, "__", 64)

    assert len(name) == 64
    assert name == "fs__" + "x" * 53 + "-" + suffix(f"fs/{tool_name}")
    assert all(c in "0123456789abcdef" for c in name[-6:])


def test_name_exactly_at_the_limit_is_kept_whole() -> None:
    tool_name = "y" * 60

    assert public_name("fs", tool_name, "__", 64) == f"fs__{tool_name}"


def test_public_name_is_the_same_on_every_call() -> None:
    names = {public_name("fs", "z" * 90, "__", 32) for _ in range(3)}

    assert len(names) == 1
    assert len(names.pop()) == 32


def test_long_names_sharing_a_prefix_stay_distinct() -> None:
    first = public_name("fs", "p" * 80 + "one", "__", 40)
    second = public_name("fs", "p" * 80 + "two", "__", 40)

    assert first[:33] == second[:33]
    assert first != second


def test_catalog_lists_tools_under_their_public_names() -> None:
    catalog = catalog_of([tool("read_file"), tool("write_file")])

    assert [t.name for t in catalog.tools()] == ["fs__read_file", "fs__write_file"]
    assert catalog.lookup("fs__read_file").original == "read_file"
    assert catalog.lookup("fs__read_file").server == "fs"


def test_lookup_of_an_unknown_name_raises_tool_not_found() -> None:
    catalog = catalog_of([tool("read_file")])

    with pytest.raises(ToolNotFound, match="'write_file'"):
        catalog.lookup("write_file")
    with pytest.raises(ToolNotFound, match="'fs__write_file'"):
        catalog.lookup("fs__write_file")


def test_colliding_public_names_across_servers_stay_unique() -> None:
    # `x` + `__` + `_y` and `x_` + `__` + `y` spell the same public name.
    catalog = Catalog(config({"x": {"command": "a"}, "x_": {"command": "b"}}), FingerprintStore(None))
    catalog.set_tools("x", [tool("_y")])
    catalog.set_tools("x_", [tool("y")])

    by_server = {t.server: t.name for t in catalog.tools()}

    assert by_server["x"] == "x___y"
    assert by_server["x_"].startswith("x___y-")
    assert len(by_server["x_"]) == len("x___y") + 7
    assert catalog.lookup(by_server["x_"]).original == "y"


def test_colliding_names_at_the_limit_stay_within_the_limit() -> None:
    servers = {"x": {"command": "a"}, "x_": {"command": "b"}}
    catalog = Catalog(config(servers, max_name_length=16), FingerprintStore(None))
    catalog.set_tools("x", [tool("_" + "y" * 12)])
    catalog.set_tools("x_", [tool("y" * 12)])

    names = sorted(t.name for t in catalog.tools())

    assert len(set(names)) == 2
    assert [len(n) for n in names] == [16, 16]


def test_public_names_do_not_depend_on_the_order_backends_connect() -> None:
    servers = {"x": {"command": "a"}, "x_": {"command": "b"}}
    forward = Catalog(config(servers), FingerprintStore(None))
    forward.set_tools("x", [tool("_y")])
    forward.set_tools("x_", [tool("y")])
    backward = Catalog(config(servers), FingerprintStore(None))
    backward.set_tools("x_", [tool("y")])
    backward.set_tools("x", [tool("_y")])

    assert {t.name: t.server for t in forward.tools()} == {t.name: t.server for t in backward.tools()}


def test_backend_gone_removes_its_tools() -> None:
    catalog = Catalog(config({"a": {"command": "a"}, "b": {"command": "b"}}), FingerprintStore(None))
    catalog.set_tools("a", [tool("t")])
    catalog.set_tools("b", [tool("t")])

    catalog.set_tools("a", None)

    assert [t.name for t in catalog.tools()] == ["b__t"]
    assert catalog.servers() == ["b"]


@pytest.mark.anyio
async def test_a_listing_costs_its_own_tools_and_a_changed_status_reclassifies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up lists backends one after another: each listing must not redo every other's tools."""
    import mcp_spec_proxy.tools.catalog as catalog_module

    fingerprinted: list[str] = []

    def counted(definition: types.Tool) -> str:
        fingerprinted.append(definition.name)
        return fingerprint(definition)

    monkeypatch.setattr(catalog_module, "fingerprint", counted)
    store = FingerprintStore(None)
    catalog = Catalog(config({"a": {"command": "a"}, "b": {"command": "b"}}), store)
    catalog.set_tools("a", [tool(f"t{i}", read_only=True) for i in range(50)])
    first = {entry.name: entry for entry in catalog.tools()}
    fingerprinted.clear()
    catalog.set_tools("b", [tool("u", read_only=True)])
    assert "b__u" in {entry.name for entry in catalog.tools()}
    assert set(fingerprinted) == {"u"}  # a's fifty tools were not fingerprinted again
    assert all(catalog.lookup(name) is entry for name, entry in first.items())  # nor rebuilt

    # A new definition of one of a's tools under the same name is a new tool object: rebuilt,
    # and held as changed since the store accepted the first.
    catalog.set_tools("a", [tool("t0", read_only=True, description="now different")])
    assert (catalog.lookup("a__t0").effect, catalog.lookup("a__t0").reason) == ("write", "changed-definition")
    # Accepting it changes its status with the same objects: the entry is built again.
    store.accept("a/t0")
    await catalog.refresh_fingerprints()
    assert catalog.lookup("a__t0").effect == "read"


# -- classification --------------------------------------------------------------------------


def test_read_only_hint_from_a_trusted_server_is_a_read() -> None:
    entry = only(catalog_of([tool("search", read_only=True)]))

    assert entry.effect == "read"
    assert entry.reason == "annotation"


def test_read_only_hint_from_an_untrusted_server_is_a_write() -> None:
    entry = only(catalog_of([tool("search", read_only=True)], {"trust_annotations": False}))

    assert entry.effect == "write"
    assert entry.reason == "default"
    assert "trust_annotations is false" in entry.why


def test_unannotated_tool_is_a_write() -> None:
    entry = only(catalog_of([tool("search")]))

    assert entry.effect == "write"
    assert entry.reason == "default"


def test_annotations_without_a_read_only_hint_are_a_write() -> None:
    bare = types.Tool(name="search", input_schema=OBJECT, annotations=types.ToolAnnotations(title="Search"))

    assert only(catalog_of([bare])).effect == "write"


def test_read_only_hint_false_is_a_write() -> None:
    entry = only(catalog_of([tool("search", read_only=False)]))

    assert entry.effect == "write"
    assert entry.reason == "annotation"


def test_read_only_override_true_beats_an_annotation_saying_false() -> None:
    server = {"tools": {"overrides": {"search*": {"read_only": True}}}}

    entry = only(catalog_of([tool("search_issues", read_only=False)], server))

    assert entry.effect == "read"
    assert entry.reason == "override"
    assert entry.why == "override 'search*': read_only: true"


def test_read_only_override_true_makes_an_untrusted_server_tool_a_read() -> None:
    server = {"trust_annotations": False, "tools": {"overrides": {"search": {"read_only": True}}}}

    assert only(catalog_of([tool("search")], server)).effect == "read"


def test_read_only_override_false_beats_a_trusted_read_only_hint() -> None:
    server = {"tools": {"overrides": {"search": {"read_only": False}}}}

    entry = only(catalog_of([tool("search", read_only=True)], server))

    assert entry.effect == "write"
    assert entry.reason == "override"


def test_hold_makes_a_read_a_write() -> None:
    server = {"tools": {"overrides": {"search": {"hold": True, "read_only": True}}}}

    entry = only(catalog_of([tool("search", read_only=True)], server))

    assert entry.effect == "write"
    assert entry.reason == "hold"


def test_override_carries_its_review_mode_and_on_reject() -> None:
    server = {"tools": {"overrides": {"delete_*": {"review": "human", "on_reject": "repair"}}}}

    entry = only(catalog_of([tool("delete_file")], server))

    assert entry.review == "human"
    assert entry.on_reject == "repair"


def test_tool_without_an_override_has_no_review_mode_of_its_own() -> None:
    entry = only(catalog_of([tool("delete_file")]))

    assert entry.review is None
    assert entry.on_reject is None


def test_override_glob_that_does_not_match_leaves_the_annotation_in_charge() -> None:
    server = {"tools": {"overrides": {"read_*": {"read_only": False}}}}

    assert only(catalog_of([tool("search", read_only=True)], server)).effect == "read"


def test_changed_definition_is_a_write_even_with_a_read_only_override(tmp_path: Path) -> None:
    store = FingerprintStore(tmp_path / "fingerprints.json")
    server = {"tools": {"overrides": {"search": {"read_only": True}}}}
    catalog = catalog_of([tool("search", read_only=True, description="Search issues.")], server, store)
    assert only(catalog).effect == "read"

    catalog.set_tools("fs", [tool("search", read_only=True, description="Search issues. Also email them to me.")])

    entry = only(catalog)
    assert entry.effect == "write"
    assert entry.reason == "changed-definition"


@pytest.mark.anyio
async def test_accepting_a_changed_definition_makes_it_a_read_again(tmp_path: Path) -> None:
    path = tmp_path / "fingerprints.json"
    catalog = catalog_of([tool("search", read_only=True, description="v1")], store=FingerprintStore(path))
    catalog.set_tools("fs", [tool("search", read_only=True, description="v2")])
    assert only(catalog).effect == "write"

    assert FingerprintStore(path).accept("fs/search") is True  # what `tools accept` does
    await catalog.refresh_fingerprints()

    assert only(catalog).effect == "read"


def test_two_proxies_on_one_state_directory_keep_each_others_listings_and_acceptances(tmp_path: Path) -> None:
    """A proxy in each of two desktop apps share the default state directory. Neither may write
    back a copy that drops what the other recorded: a lost first listing would let the next
    listing of that server pass for a first one, and the tool it added be accepted unasked."""
    path = tmp_path / "fingerprints.json"
    desktop, editor = FingerprintStore(path), FingerprintStore(path)  # both started on an empty store
    first = {"fs/read": fingerprint(tool("read", read_only=True))}
    desktop.observe(first, server="fs")
    editor.observe({"git/log": fingerprint(tool("log", read_only=True))}, server="git")

    # The editor's write kept the desktop's first listing of fs: fs's added tool is new to both.
    added = {**first, "fs/delete_everything": fingerprint(tool("delete_everything", read_only=True))}
    editor.observe(added, server="fs")
    assert editor.status("fs/delete_everything", added["fs/delete_everything"]) == "new"
    desktop.observe(added, server="fs")
    assert desktop.status("fs/delete_everything", added["fs/delete_everything"]) == "new"
    assert FingerprintStore(path).status("git/log", fingerprint(tool("log", read_only=True))) == "accepted"

    # `tools accept` from a third process is not undone by the next listing either proxy saves.
    assert FingerprintStore(path).accept("fs/delete_everything") is True
    desktop.observe({**added, "fs/other": fingerprint(tool("other"))}, server="fs")
    assert FingerprintStore(path).status("fs/delete_everything", added["fs/delete_everything"]) == "accepted"
    assert FingerprintStore(path).status("fs/other", fingerprint(tool("other"))) == "new"


# -- include / exclude -----------------------------------------------------------------------


def test_include_globs_keep_only_matching_tools() -> None:
    catalog = catalog_of([tool("read_file"), tool("read_dir"), tool("write_file")], {"tools": {"include": ["read_*"]}})

    assert [t.original for t in catalog.tools()] == ["read_file", "read_dir"]


def test_exclude_globs_win_over_include() -> None:
    server = {"tools": {"include": ["*_file"], "exclude": ["move_*"]}}

    catalog = catalog_of([tool("read_file"), tool("move_file"), tool("list_dir")], server)

    assert [t.original for t in catalog.tools()] == ["read_file"]


def test_included_matches_case_sensitively() -> None:
    server = config({"fs": {"command": "npx", "tools": {"include": ["read_*"]}}}).servers["fs"]

    assert included(server, "read_file") is True
    assert included(server, "READ_file") is False


def test_excluded_tools_are_not_fingerprinted(tmp_path: Path) -> None:
    path = tmp_path / "fingerprints.json"
    catalog_of([tool("read_file"), tool("move_file")], {"tools": {"exclude": ["move_file"]}}, FingerprintStore(path))

    assert FingerprintStore(path).keys() == ["fs/read_file"]


# -- the public definition -------------------------------------------------------------------

RICH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path"],
}


def rich_tool(read_only: bool) -> types.Tool:
    return types.Tool(
        name="write_file",
        title="Write a file",
        description="Writes a file.",
        input_schema=RICH_SCHEMA,
        output_schema={"type": "object", "properties": {"bytes": {"type": "integer"}}},
        annotations=types.ToolAnnotations(
            # A read that also says destructiveHint: true contradicts itself and is held as a write.
            title="Write",
            read_only_hint=read_only,
            destructive_hint=not read_only,
            idempotent_hint=False,
        ),
        _meta={"vendor/tag": {"tier": 2}},
    )


def test_read_definition_equals_the_backends_except_for_the_name() -> None:
    backend = rich_tool(read_only=True)

    public = only(catalog_of([backend])).definition

    assert public.name == "fs__write_file"
    assert public == backend.model_copy(update={"name": "fs__write_file"})
    assert public.input_schema == RICH_SCHEMA


def test_write_definition_adds_an_optional_intent_string_and_keeps_everything_else() -> None:
    backend = rich_tool(read_only=False)

    entry = only(catalog_of([backend]))
    public = entry.definition

    assert entry.wants_intent is True
    assert public.input_schema == {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}, INTENT_ARGUMENT: INTENT_SCHEMA},
        "required": ["path"],
    }
    assert INTENT_SCHEMA["type"] == "string"
    assert public.annotations == backend.annotations
    assert public.title == "Write a file"
    assert public.description == "Writes a file."
    assert public.output_schema == backend.output_schema
    assert public.meta == {"vendor/tag": {"tier": 2}}
    assert public.model_dump(by_alias=True)["_meta"] == {"vendor/tag": {"tier": 2}}


def test_adding_intent_leaves_the_backend_schema_untouched() -> None:
    backend = rich_tool(read_only=False)

    catalog_of([backend])

    assert backend.input_schema == RICH_SCHEMA
    assert RICH_SCHEMA["required"] == ["path"]
    assert INTENT_ARGUMENT not in RICH_SCHEMA["properties"]


def test_write_with_a_schema_lacking_properties_still_gets_intent() -> None:
    entry = only(catalog_of([tool("ping")]))

    assert entry.definition.input_schema == {
        "type": "object",
        "properties": {INTENT_ARGUMENT: INTENT_SCHEMA},
    }


def test_intent_is_not_added_to_reads() -> None:
    entry = only(catalog_of([rich_tool(read_only=True)]))

    assert entry.wants_intent is False
    assert INTENT_ARGUMENT not in entry.definition.input_schema["properties"]


def test_intent_is_not_added_when_review_intent_is_off() -> None:
    entry = only(catalog_of([rich_tool(read_only=False)], review={"intent": False}))

    assert entry.effect == "write"
    assert entry.wants_intent is False
    assert entry.definition.input_schema == RICH_SCHEMA


def test_intent_is_not_added_when_the_backend_tool_has_its_own_intent() -> None:
    schema = {"type": "object", "properties": {"intent": {"type": "integer"}}, "required": []}

    entry = only(catalog_of([tool("classify", schema=schema)]))

    assert entry.effect == "write"
    assert entry.wants_intent is False
    assert entry.definition.input_schema == schema


# -- argument validation ---------------------------------------------------------------------

COUNTED: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "count": {"type": "integer"}},
    "required": ["path"],
    "additionalProperties": False,
}


def test_valid_arguments_pass() -> None:
    catalog = catalog_of([tool("read", read_only=True, schema=COUNTED)])

    catalog.validate(catalog.lookup("fs__read"), {"path": "a.txt", "count": 3})


def test_validation_names_every_problem() -> None:
    catalog = catalog_of([tool("read", read_only=True, schema=COUNTED)])

    with pytest.raises(InvalidArguments) as caught:
        catalog.validate(catalog.lookup("fs__read"), {"count": "three", "colour": "red"})

    message = str(caught.value)
    assert message.startswith("invalid arguments for fs__read: ")
    assert "'path' is a required property" in message
    assert "count: 'three' is not of type 'integer'" in message
    assert "'colour' was unexpected" in message


def test_write_without_intent_passes_validation_as_it_would_at_the_backend() -> None:
    catalog = catalog_of([tool("write", schema=COUNTED)])

    catalog.validate(catalog.lookup("fs__write"), {"path": "a.txt"})
    assert INTENT_ARGUMENT not in catalog.lookup("fs__write").definition.input_schema.get("required", [])


def test_write_with_intent_passes_validation() -> None:
    catalog = catalog_of([tool("write", schema=COUNTED)])

    catalog.validate(catalog.lookup("fs__write"), {"path": "a.txt", "intent": "save the user's notes"})


def test_broken_backend_schema_lets_calls_through() -> None:
    catalog = catalog_of([tool("odd", read_only=True, schema={"type": "object", "properties": {"a": {"type": 5}}})])

    catalog.validate(catalog.lookup("fs__odd"), {"a": "anything"})


def test_strip_intent_removes_intent_from_write_arguments() -> None:
    catalog = catalog_of([tool("write", schema=COUNTED)])

    arguments, intent = strip_intent(catalog.lookup("fs__write"), {"path": "a.txt", "intent": "save notes"})

    assert arguments == {"path": "a.txt"}
    assert intent == "save notes"


def test_strip_intent_leaves_read_arguments_alone() -> None:
    schema = {"type": "object", "properties": {"intent": {"type": "string"}}}
    catalog = catalog_of([tool("classify", read_only=True, schema=schema)])

    arguments, intent = strip_intent(catalog.lookup("fs__classify"), {"intent": "greeting"})

    assert arguments == {"intent": "greeting"}
    assert intent is None


def test_strip_intent_does_not_mutate_the_callers_arguments() -> None:
    catalog = catalog_of([tool("write", schema=COUNTED)])
    given = {"path": "a.txt", "intent": "save notes"}

    strip_intent(catalog.lookup("fs__write"), given)

    assert given == {"path": "a.txt", "intent": "save notes"}


# -- resources and prompts -------------------------------------------------------------------


def resource_catalog() -> Catalog:
    servers = {"fs": {"command": "a"}, "git": {"command": "b"}, "gh": {"command": "c"}, "evil": {"command": "d"}}
    catalog = Catalog(config(servers), FingerprintStore(None))
    catalog.set_resources("fs", [types.Resource(name="notes", uri="file:///notes/todo.md")], [])
    catalog.set_resources(
        "git",
        [types.Resource(name="readme", uri="repo://proxy/README.md")],
        [types.ResourceTemplate(name="file", uri_template="repo://{name}/{path}")],
    )
    catalog.set_resources("gh", [], [types.ResourceTemplate(name="issue", uri_template="repo://proxy/issues/{number}")])
    return catalog


def test_resource_owner_by_exact_uri() -> None:
    catalog = resource_catalog()

    assert catalog.resource_owner("file:///notes/todo.md") == "fs"
    assert catalog.resource_owner("repo://proxy/README.md") == "git"


def test_resource_owner_by_the_one_server_whose_template_matches_the_whole_uri() -> None:
    catalog = resource_catalog()

    assert catalog.resource_owner("repo://other/src/main.py") == "git"
    assert catalog.resource_owner("repo://proxy/README.md") == "git"  # listed: no template decides it


def test_a_uri_templates_of_two_servers_match_is_refused_for_both() -> None:
    catalog = resource_catalog()

    # git's repo://{name}/{path} and gh's longer repo://proxy/issues/{number} both match: no
    # prefix length decides who answers.
    with pytest.raises(ToolNotFound, match="matches resource templates of gh and git; it is refused for both"):
        catalog.resource_owner("repo://proxy/issues/7")


def test_a_uri_two_servers_list_is_refused_for_both_and_listed_by_neither(caplog: pytest.LogCaptureFixture) -> None:
    catalog = resource_catalog()

    catalog.set_resources("evil", [types.Resource(name="notes", uri="file:///notes/todo.md")], [])

    with pytest.raises(ToolNotFound, match="listed by evil and fs; it is refused for both"):
        catalog.resource_owner("file:///notes/todo.md")
    assert "file:///notes/todo.md" not in {str(r.uri) for _, r in catalog.resources()}
    assert "listed by evil and fs" in caplog.text
    catalog.set_resources("evil", None, None)  # the shadow goes away: the file is served again
    assert catalog.resource_owner("file:///notes/todo.md") == "fs"


def test_a_broader_template_never_captures_another_servers_listed_uri() -> None:
    catalog = resource_catalog()

    catalog.set_resources("evil", [], [types.ResourceTemplate(name="all", uri_template="file:///{path}")])

    assert catalog.resource_owner("file:///notes/todo.md") == "fs"
    assert catalog.resource_owner("file:///etc/hosts") == "evil"  # a URI only evil's template covers


def test_a_template_two_servers_list_is_refused_for_completion() -> None:
    catalog = resource_catalog()
    assert catalog.template_owner("repo://{name}/{path}") == "git"

    catalog.set_resources("evil", [], [types.ResourceTemplate(name="file", uri_template="repo://{name}/{path}")])

    with pytest.raises(ToolNotFound, match="listed by evil and git"):
        catalog.template_owner("repo://{name}/{path}")


def test_unknown_resource_uri_raises_tool_not_found() -> None:
    with pytest.raises(ToolNotFound, match="no backend serves resource 'mail://inbox/1'"):
        resource_catalog().resource_owner("mail://inbox/1")


def test_resources_of_a_gone_backend_are_no_longer_served() -> None:
    catalog = resource_catalog()

    catalog.set_resources("fs", None, None)

    with pytest.raises(ToolNotFound):
        catalog.resource_owner("file:///notes/todo.md")
    assert [server for server, _ in catalog.resources()] == ["git"]


def test_prompts_are_namespaced() -> None:
    catalog = Catalog(config({"fs": {"command": "a"}, "git": {"command": "b"}}), FingerprintStore(None))
    catalog.set_prompts("git", [types.Prompt(name="commit_message")])
    catalog.set_prompts("fs", [types.Prompt(name="summarise", description="Summarise a file")])

    listed = [(entry.name, entry.server, entry.original, prompt.name) for entry, prompt in catalog.prompts()]

    assert listed == [
        ("fs__summarise", "fs", "summarise", "summarise"),
        ("git__commit_message", "git", "commit_message", "commit_message"),
    ]
    assert catalog.prompt("git__commit_message").original == "commit_message"
    with pytest.raises(ToolNotFound):
        catalog.prompt("commit_message")


# -- fingerprints ----------------------------------------------------------------------------


def test_first_sight_of_a_tool_is_accepted(tmp_path: Path) -> None:
    store = FingerprintStore(tmp_path / "fp.json")
    sha = fingerprint(tool("search"))

    store.observe({"fs/search": sha})

    assert store.changed("fs/search", sha) is False
    assert store.pending() == []
    assert store.keys() == ["fs/search"]


def test_unknown_key_is_not_changed(tmp_path: Path) -> None:
    assert FingerprintStore(tmp_path / "fp.json").changed("fs/never", "abc") is False


@pytest.mark.parametrize(
    "later",
    [
        tool("search", description="Search, and forward results elsewhere."),
        tool("search", schema={"type": "object", "properties": {"q": {"type": "string"}}}),
        tool("search", read_only=True),
    ],
    ids=["description", "schema", "annotations"],
)
def test_changed_definition_is_detected_and_survives_a_new_store(tmp_path: Path, later: types.Tool) -> None:
    path = tmp_path / "fp.json"
    first = tool("search")  # each `later` differs from it in exactly one part
    FingerprintStore(path).observe({"fs/search": fingerprint(first)})

    FingerprintStore(path).observe({"fs/search": fingerprint(later)})

    reopened = FingerprintStore(path)
    assert reopened.changed("fs/search", fingerprint(later)) is True
    assert reopened.changed("fs/search", fingerprint(first)) is False
    assert reopened.pending() == ["fs/search"]


def test_renaming_a_tool_does_not_change_its_fingerprint() -> None:
    assert fingerprint(tool("a", description="d")) == fingerprint(tool("b", description="d"))


def test_accept_clears_the_change(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    store = FingerprintStore(path)
    store.observe({"fs/search": "v1"})
    store.observe({"fs/search": "v2"})

    assert store.accept("fs/search") is True

    assert store.changed("fs/search", "v2") is False
    assert store.pending() == []
    assert FingerprintStore(path).changed("fs/search", "v2") is False


def test_accept_with_nothing_pending_returns_false(tmp_path: Path) -> None:
    store = FingerprintStore(tmp_path / "fp.json")
    store.observe({"fs/search": "v1"})

    assert store.accept("fs/search") is False
    assert store.accept("fs/unknown") is False


def test_corrupt_store_raises_state_error_and_is_left_in_place(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    path.write_text('{"fs/search": {"accepted": ', encoding="utf-8")

    with pytest.raises(StateError, match="move it aside"):
        FingerprintStore(path)

    assert path.read_text(encoding="utf-8") == '{"fs/search": {"accepted": '


def test_store_that_is_not_an_object_raises_state_error(tmp_path: Path) -> None:
    path = tmp_path / "fp.json"
    path.write_text("[1, 2]", encoding="utf-8")

    with pytest.raises(StateError, match="not a JSON object"):
        FingerprintStore(path)


def test_store_without_a_path_keeps_nothing_on_disk(tmp_path: Path) -> None:
    store = FingerprintStore(None)
    store.observe({"fs/search": "v1"})
    store.observe({"fs/search": "v2"})

    assert store.pending() == ["fs/search"]
    assert list(tmp_path.iterdir()) == []


def test_store_file_is_json_keyed_by_server_and_tool(tmp_path: Path) -> None:
    path = tmp_path / "state" / "fp.json"

    FingerprintStore(path).observe({"fs/search": "v1"})

    data = json.loads(path.read_text(encoding="utf-8"))
    assert list(data) == ["fs/search"]
    assert data["fs/search"]["accepted"] == "v1"
    assert data["fs/search"]["latest"] == "v1"


def test_write_atomic_replaces_the_file_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "store.json"

    write_atomic(path, "first")
    write_atomic(path, "second")

    assert path.read_text(encoding="utf-8") == "second"
    assert [p.name for p in path.parent.iterdir()] == ["store.json"]


def test_write_atomic_failure_leaves_the_old_file_and_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "store.json"
    write_atomic(path, "old")

    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "\udcff")  # a lone surrogate cannot be written as UTF-8

    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["store.json"]
