"""``define_workflow`` and ``@workflow``: the meta rules of SPEC §2, the handle, the code hash."""

from __future__ import annotations

import dataclasses
import re
from types import MappingProxyType
from typing import Any

import jsonschema
import pytest
import referencing

from celery_durable import Engine, Phase, Settings, Workflow, WorkflowDefinitionError, define_workflow, workflow
from celery_durable.workflows.definition import check_unique_names
from celery_durable.workflows.json_schemas import unresolved_ref


def run_fn(ctx: Any) -> None:
    return None


def other_run_fn(ctx: Any) -> int:
    return 1


def make_meta(**overrides: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "code-review",
        "description": "Reviews changed files",
        "phases": [{"title": "Analyze", "detail": "Inspect changed files"}, {"title": "Summarize"}],
    }
    meta.update(overrides)
    return meta


def define(**overrides: Any) -> Workflow:
    return define_workflow(make_meta(**overrides), run_fn)


def without(key: str) -> dict[str, Any]:
    meta = make_meta()
    del meta[key]
    return meta


# --- the happy path --------------------------------------------------------------------------


def test_define_workflow_returns_a_validated_handle() -> None:
    handle = define(limits={"max_total_subagents": 3}, args_schema={"type": "object"})

    assert isinstance(handle, Workflow)
    assert handle.name == "code-review"
    assert handle.description == "Reviews changed files"
    assert handle.phases == (
        Phase(phase_id="phase-1", title="Analyze", detail="Inspect changed files"),
        Phase(phase_id="phase-2", title="Summarize", detail=None),
    )
    assert dict(handle.limits) == {"max_total_subagents": 3}
    assert handle.args_schema is not None
    assert dict(handle.args_schema) == {"type": "object"}
    assert handle.run is run_fn
    assert re.fullmatch(r"[0-9a-f]+", handle.code_hash)


def test_optional_keys_default_to_empty_limits_and_no_schema() -> None:
    handle = define()
    assert dict(handle.limits) == {}
    assert handle.args_schema is None


def test_phase_named_finds_declared_phases_only() -> None:
    handle = define()
    phase = handle.phase_named("Summarize")
    assert phase is not None
    assert phase.phase_id == "phase-2"
    assert handle.phase_named("Deploy") is None


def test_workflow_decorator_is_define_workflow() -> None:
    @workflow(
        name="backfill",
        description="Backfills historical data",
        phases=[{"title": "Fetch"}, {"title": "Write", "detail": "Persist rows"}],
        limits={"timeout_seconds": 60},
        args_schema={"type": "object"},
    )
    def backfill(ctx: Any) -> None:
        return None

    assert isinstance(backfill, Workflow)
    assert backfill.name == "backfill"
    assert backfill.description == "Backfills historical data"
    assert [(p.title, p.detail) for p in backfill.phases] == [("Fetch", None), ("Write", "Persist rows")]
    assert dict(backfill.limits) == {"timeout_seconds": 60}
    assert backfill.args_schema is not None
    assert callable(backfill.run)
    assert backfill.run.__name__ == "backfill"

    same = define_workflow(
        {
            "name": "backfill",
            "description": "Backfills historical data",
            "phases": [{"title": "Fetch"}, {"title": "Write", "detail": "Persist rows"}],
            "limits": {"timeout_seconds": 60},
            "args_schema": {"type": "object"},
        },
        backfill.run,
    )
    assert same.code_hash == backfill.code_hash


def test_workflow_decorator_validates_meta() -> None:
    decorate = workflow(name="bad name", description="d", phases=[])
    with pytest.raises(WorkflowDefinitionError, match="name"):
        decorate(run_fn)


def test_workflow_decorator_names_a_missing_key_as_define_workflow_does() -> None:
    with pytest.raises(WorkflowDefinitionError) as info:

        @workflow(name="backfill", description="d")
        def backfill(ctx: Any, args: Any) -> None: ...

    assert str(info.value) == "Workflow meta is missing required key: phases"


def test_workflow_decorator_refuses_an_unknown_keyword_by_name() -> None:
    decorate = workflow(name="backfill", description="d", phases=[], retries=3)
    with pytest.raises(WorkflowDefinitionError) as info:
        decorate(run_fn)
    assert str(info.value) == "Unknown key in workflow meta: retries"


def test_definition_error_is_a_value_error() -> None:
    assert issubclass(WorkflowDefinitionError, ValueError)
    with pytest.raises(ValueError):
        define(name="")


def test_run_must_be_callable() -> None:
    with pytest.raises(WorkflowDefinitionError, match="callable"):
        define_workflow(make_meta(), "not a function")  # type: ignore[arg-type]


@pytest.mark.parametrize("meta", [None, [("name", "x")], "code-review"])
def test_meta_must_be_a_mapping(meta: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="meta must be a dict"):
        define_workflow(meta, run_fn)


# --- required keys ---------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["name", "description", "phases"])
def test_required_keys(key: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=key):
        define_workflow(without(key), run_fn)


# --- name ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "code-review", "Code.Review_2-x", "0", "x" * 128])
def test_valid_names(name: str) -> None:
    assert define(name=name).name == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "   ",
        "code review",
        "x" * 129,
        "naïve",
        "a/b",
        "a:b",
        "abc\n",
        "\nabc",
        "tab\there",
    ],
    ids=repr,
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match="name"):
        define(name=name)


@pytest.mark.parametrize("name", [None, 7, b"bytes", ["a"]])
def test_name_must_be_a_string(name: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="name must be a string"):
        define(name=name)


# --- description -----------------------------------------------------------------------------


@pytest.mark.parametrize("description", ["", " ", "\n\t "], ids=repr)
def test_blank_description_is_rejected(description: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match="description must not be blank"):
        define(description=description)


@pytest.mark.parametrize("description", [None, 3, ["text"]])
def test_description_must_be_a_string(description: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="description must be a string"):
        define(description=description)


# --- phases ----------------------------------------------------------------------------------


def test_phases_may_be_empty() -> None:
    assert define(phases=[]).phases == ()


def test_phases_may_be_any_sequence_of_mappings() -> None:
    declared = ({"title": "A"}, MappingProxyType({"title": "B", "detail": "b"}))
    for phases in (declared, iter(declared)):
        assert [(p.title, p.detail) for p in define(phases=phases).phases] == [("A", None), ("B", "b")]
    meta = MappingProxyType(make_meta())
    assert define_workflow(meta, run_fn).code_hash == define().code_hash


@pytest.mark.parametrize("phases", ["Analyze", b"Analyze", {"title": "Analyze"}, None, 3], ids=repr)
def test_phases_must_be_a_list(phases: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="phases must be a list"):
        define(phases=phases)


@pytest.mark.parametrize("phase", ["Analyze", ["Analyze"], None])
def test_each_phase_must_be_a_dict(phase: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="phase 0 must be a dict"):
        define(phases=[phase])


@pytest.mark.parametrize(
    "phase",
    [{}, {"title": ""}, {"title": "   "}, {"title": None}, {"title": 3}, {"detail": "no title"}],
    ids=repr,
)
def test_phase_title_is_required_and_non_blank(phase: dict[str, Any]) -> None:
    with pytest.raises(WorkflowDefinitionError, match="title"):
        define(phases=[{"title": "First"}, phase])


def test_duplicate_phase_title_has_the_spec_message() -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        define(phases=[{"title": "Analyze"}, {"title": "Summarize"}, {"title": "Analyze", "detail": "again"}])
    assert str(info.value) == "Workflow phase title is declared more than once: Analyze"
    long = "A" * 300
    with pytest.raises(WorkflowDefinitionError) as info:
        define(phases=[{"title": long}, {"title": long}])
    assert str(info.value) == f"Workflow phase title is declared more than once: {long}"


def test_phase_titles_are_compared_exactly() -> None:
    handle = define(phases=[{"title": "Analyze"}, {"title": "analyze"}, {"title": "Analyze "}])
    assert [p.title for p in handle.phases] == ["Analyze", "analyze", "Analyze "]


def test_phase_detail_is_optional_but_must_be_text() -> None:
    assert define(phases=[{"title": "A", "detail": None}]).phases[0].detail is None
    with pytest.raises(WorkflowDefinitionError, match="detail"):
        define(phases=[{"title": "A", "detail": 5}])


# --- unknown keys ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"retries": 3},
        {"phases": [{"title": "Analyze", "retries": 3}]},
        {"limits": {"retries": 3}},
    ],
    ids=["meta", "phase", "limits"],
)
def test_unknown_keys_are_rejected_by_name(overrides: dict[str, Any]) -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"Unknown key .*: retries$"):
        define(**overrides)


# --- limits and args_schema ------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits",
    [
        {"max_total_subagents": 0},
        {"max_concurrent_subagents": 1.5},
        {"max_ai_credits": 4e-10},
        {"timeout_seconds": 2147483.648},
        {"timeout_seconds": None},
        None,
        [("timeout_seconds", 5)],
    ],
    ids=repr,
)
def test_invalid_meta_limits_are_rejected_at_definition(limits: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="limits"):
        define(limits=limits)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "nope"},
        {"type": "object", "properties": 3},
        {"required": "path"},
        {"minLength": -1},
        "object",
        ["type", "object"],
    ],
    ids=repr,
)
def test_invalid_args_schema_is_rejected_at_definition(schema: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="args_schema"):
        define(args_schema=schema)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"$ref": "#/$defs/missing"}, "has a $ref that does not resolve within it: '#/$defs/missing'"),
        ({"properties": {"p": {"$ref": "#/properties/q"}}}, "does not resolve within it: '#/properties/q'"),
        # Never fetched: jsonschema would have fetched it over HTTP on every start_workflow.
        ({"items": {"$ref": "http://example.invalid/s.json"}}, "'http://example.invalid/s.json'"),
        ({"type": "object", "default": {1, 2}}, "must be a JSON value: set is not a JSON type"),
        # referencing raised a TypeError or its int() ValueError for these, not Unresolvable.
        ({"$defs": {"a": True}, "properties": {"x": {"$ref": "#/$defs/a/b"}}}, "within it: '#/$defs/a/b'"),
        ({"title": "t", "properties": {"x": {"$ref": "#/title/x"}}}, "within it: '#/title/x'"),
        ({"prefixItems": [{}], "properties": {"x": {"$ref": "#/prefixItems/x"}}}, "within it: '#/prefixItems/x'"),
    ],
    ids=["dangling", "sibling", "remote", "not-json", "through-boolean", "into-string", "array-by-name"],
)
def test_an_args_schema_that_cannot_be_used_is_rejected_at_definition(schema: Any, message: str) -> None:
    """SPEC §2: an invalid args_schema is rejected at definition, as a
    WorkflowDefinitionError. A dangling $ref passed the metaschema check, and
    start_workflow then raised jsonschema's private referencing error (not a
    ValueError); a set in the schema was a TypeError from the code hash."""
    with pytest.raises(WorkflowDefinitionError) as raised:
        define(args_schema=schema)
    assert str(raised.value).startswith("Workflow args_schema ")
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"n": {"type": "integer"}},
         "properties": {"x": {"$ref": "#/definitions/n"}}},
        {"$id": "https://example.test/root", "properties": {"x": {"$id": "sub", "$defs": {"n": {"type": "integer"}},
                                                              "$ref": "#/$defs/n"}}},
        {"properties": {"x": {"$ref": "https://json-schema.org/draft/2020-12/meta/validation#/$defs/nonNegativeInteger"}}},
        {"properties": {"$ref": {"type": "integer"}}},
    ],
    ids=["defs", "draft7-definitions", "nested-id", "metaschema", "property-named-ref"],
)
def test_an_args_schema_whose_refs_resolve_is_kept_and_followed(schema: Any) -> None:
    handle = define(args_schema=schema)
    handle.validate_args({"x": 1} if "$ref" not in schema.get("properties", {}) else {"$ref": 1})


def test_args_schema_is_read_in_the_draft_its_schema_keyword_declares() -> None:
    """Full JSON Schema via jsonschema (SPEC §2): a draft-07 schema is valid and checked as draft-07."""
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}},
        "dependencies": {"a": ["b"]},
    }
    handle = define(args_schema=draft7)
    handle.validate_args({"pair": ["x", 1], "a": 1, "b": 2})
    with pytest.raises(ValueError, match="'b' is a dependency of 'a'"):
        handle.validate_args({"a": 1})
    with pytest.raises(ValueError, match=r"\$\['pair'\]\[1\]"):
        handle.validate_args({"pair": ["x", "y"]})


# --- the handle is immutable -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", "other"),
        ("description", "x"),
        ("phases", ()),
        ("limits", {"x": 1}),
        ("run", other_run_fn),
        ("code_hash", "0"),
    ],
)
def test_handle_fields_cannot_be_assigned(field: str, value: Any) -> None:
    handle = define()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(handle, field, value)
    assert getattr(handle, field) != value


def test_handle_mappings_and_phases_are_read_only() -> None:
    handle = define(limits={"max_total_subagents": 3}, args_schema={"type": "object"})
    with pytest.raises(TypeError):
        handle.limits["max_total_subagents"] = 99  # type: ignore[index]
    assert handle.args_schema is not None
    with pytest.raises(TypeError):
        handle.args_schema["type"] = "array"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        handle.phases[0].title = "Other"  # type: ignore[misc]


def test_handle_does_not_share_state_with_the_meta_it_was_built_from() -> None:
    meta = make_meta(limits={"max_total_subagents": 3}, args_schema={"type": "object"})
    handle = define_workflow(meta, run_fn)
    before = handle.code_hash
    meta["limits"]["max_total_subagents"] = 99
    meta["args_schema"]["type"] = "array"
    meta["phases"].append({"title": "Late"})
    assert dict(handle.limits) == {"max_total_subagents": 3}
    assert handle.args_schema == {"type": "object"}
    assert [p.title for p in handle.phases] == ["Analyze", "Summarize"]
    assert handle.code_hash == before


def test_handle_does_not_share_the_nested_args_schema_of_its_meta() -> None:
    """SPEC §2: an immutable handle. The schema was copied one level deep, so
    a change to the caller's nested dicts changed what the handle validated,
    while its code hash still said the workflow was the same."""
    def schema() -> dict[str, Any]:
        return {"type": "object", "properties": {"n": {"type": "integer"}}}

    meta = make_meta(args_schema=schema())
    handle = define_workflow(meta, run_fn)
    meta["args_schema"]["properties"]["n"]["type"] = "string"
    meta["args_schema"]["properties"]["m"] = {"type": "integer"}
    assert handle.args_schema == schema()
    handle.validate_args({"n": 1})
    with pytest.raises(ValueError, match=r"\$\['n'\]: 'one' is not of type 'integer'"):
        handle.validate_args({"n": "one"})
    assert handle.code_hash == define(args_schema=schema()).code_hash


# --- code hash -------------------------------------------------------------------------------


def test_code_hash_is_stable_for_the_same_function_and_meta() -> None:
    first = define_workflow(make_meta(limits={"timeout_seconds": 5}), run_fn)
    second = define_workflow(make_meta(limits={"timeout_seconds": 5}), run_fn)
    assert first.code_hash == second.code_hash


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "code-review-2"},
        {"description": "Reviews changed files carefully"},
        {"phases": [{"title": "Analyze"}, {"title": "Summarize"}]},
        {"phases": [{"title": "Summarize"}, {"title": "Analyze", "detail": "Inspect changed files"}]},
        {"limits": {"timeout_seconds": 5}},
        {"args_schema": {"type": "object"}},
        {"version": "2"},
    ],
    ids=["name", "description", "phase-detail", "phase-order", "limits", "args_schema", "version"],
)
def test_code_hash_changes_when_meta_changes(overrides: dict[str, Any]) -> None:
    assert define(**overrides).code_hash != define().code_hash


def test_a_version_is_kept_and_each_one_hashes_apart() -> None:
    first, second = define(version="2024-06"), define(version="2024-07")
    assert (first.version, second.version, define().version) == ("2024-06", "2024-07", None)
    assert len({first.code_hash, second.code_hash, define().code_hash}) == 3
    assert define(version="x" * 64).version == "x" * 64


@pytest.mark.parametrize(
    ("version", "error"),
    [
        ("", "Workflow version must not be blank"),
        ("  ", "Workflow version must not be blank"),
        ("x" * 65, "Workflow version must be at most 64 characters, got 65"),
        (2, "Workflow version must be a string"),
    ],
    ids=repr,
)
def test_a_bad_version_is_rejected_at_definition(version: Any, error: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=error):
        define(version=version)


def test_the_decorator_takes_a_version() -> None:
    @workflow(name="versioned", description="d", phases=[], version="3")
    def versioned(ctx: Any) -> None:
        return None

    assert versioned.version == "3"


def test_code_hash_changes_when_the_function_changes() -> None:
    assert define_workflow(make_meta(), other_run_fn).code_hash != define_workflow(make_meta(), run_fn).code_hash


# --- args validation -------------------------------------------------------------------------

ARGS_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "items": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["path"],
    "additionalProperties": False,
}


def test_validate_args_accepts_matching_args() -> None:
    define(args_schema=ARGS_SCHEMA).validate_args({"path": "src", "items": [1, 2]})


def test_validate_args_without_schema_accepts_anything() -> None:
    define().validate_args({"anything": [1, "two"]})


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"path": 3}, "$['path']"),
        ({"path": "src", "items": [1, "two"]}, "$['items'][1]"),
        ({"items": []}, "'path' is a required property"),
        ({"path": "src", "extra": 1}, "'extra'"),
        ([], "is not of type 'object'"),
    ],
    ids=["wrong-type", "nested-item", "missing", "extra", "not-object"],
)
def test_validate_args_names_the_failing_path(args: Any, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        define(args_schema=ARGS_SCHEMA).validate_args(args)
    assert fragment in str(info.value)
    assert "code-review" in str(info.value)


# --- unique names ----------------------------------------------------------------------------


def test_check_unique_names_maps_names_to_handles() -> None:
    review, backfill = define(), define(name="backfill")
    assert check_unique_names([review, backfill]) == {"code-review": review, "backfill": backfill}


def test_check_unique_names_rejects_a_duplicate() -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        check_unique_names([define(), define(name="backfill"), define(description="Another")])
    assert str(info.value) == "Duplicate workflow name code-review"


def test_check_unique_names_rejects_non_handles() -> None:
    with pytest.raises(WorkflowDefinitionError, match="Expected a Workflow handle"):
        check_unique_names([define(), make_meta()])  # type: ignore[list-item]


def offline_settings() -> Settings:
    return Settings(redis_url="redis://127.0.0.1:1/0")


def test_engine_registers_its_workflows() -> None:
    review, backfill = define(), define(name="backfill")
    engine = Engine(workflows=[review, backfill], settings=offline_settings())
    assert dict(engine.workflows) == {"code-review": review, "backfill": backfill}


def test_the_workflows_setting_registers_every_workflow_of_the_modules_it_names(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC §10 ``workflows`` (modules to import): CELERY_DURABLE_WORKFLOWS='["flows_a"]' is enough."""
    (tmp_path / "flows_a.py").write_text(
        "from celery_durable import workflow\n"
        "@workflow(name='from-a', description='d', phases=[])\n"
        "def from_a(ctx):\n    return 1\n"
        "also = from_a  # the same handle twice counts once\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("CELERY_DURABLE_WORKFLOWS", '["flows_a"]')
    review = define()
    engine = Engine(workflows=[review], settings=offline_settings())
    assert sorted(engine.workflows) == ["code-review", "from-a"]
    with pytest.raises(WorkflowDefinitionError, match=r"Settings\.workflows names 'no_such_flows'"):
        Engine([], settings=offline_settings().model_copy(update={"workflows": ["no_such_flows"]}))
    with pytest.raises(WorkflowDefinitionError, match="Duplicate workflow name from-a"):
        Engine([define(name="from-a")], settings=offline_settings())


def test_engine_rejects_two_workflows_with_one_name() -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        Engine(workflows=[define(), define(description="Another")], settings=offline_settings())
    assert str(info.value) == "Duplicate workflow name code-review"


# --- the messages, word for word --------------------------------------------------------------


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (None, "Workflow meta must be a dict, got NoneType"),
        (without("name"), "Workflow meta is missing required key: name"),
        (make_meta(name=3), "Workflow name must be a string, got int"),
        (make_meta(name=" "), "Workflow name must not be blank"),
        (make_meta(name="a b"), "Workflow name must be 1-128 characters of [A-Za-z0-9._-]: 'a b'"),
        (make_meta(description=""), "Workflow description must not be blank"),
        (make_meta(phases="A"), "Workflow phases must be a list, got str"),
        (make_meta(phases=[{"title": "A"}, "B"]), "Workflow phase 1 must be a dict, got str"),
        (make_meta(phases=[{"title": ""}]), "Workflow phase 0 title must not be blank"),
        (make_meta(phases=[{"title": "A", "detail": 5}]), "Workflow phase 0 detail must be a string, got int"),
        (make_meta(phases=[{"title": "A", "x": 1}]), "Unknown key in workflow phase 0: x"),
        (make_meta(retries=1, name=3), "Unknown key in workflow meta: retries"),
        (make_meta(limits={"timeout_seconds": None}), "limits.timeout_seconds must be a number, not None"),
        (make_meta(limits={"max_total_subagents": 0}), "limits.max_total_subagents must be a positive integer, got 0"),
        (make_meta(args_schema=["object"]), "Workflow args_schema must be a dict, got list"),
        (
            make_meta(args_schema={"minLength": -1}),
            "Workflow args_schema is not a valid JSON Schema: -1 is less than the minimum of 0",
        ),
    ],
    ids=repr,
)
def test_each_problem_has_one_clear_message(meta: Any, message: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        define_workflow(meta, run_fn)
    assert str(info.value) == message


def test_the_refs_of_a_schema_with_many_anchors_and_ids_are_checked_with_one_crawl_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SPEC §2: the schema is checked at definition, when every worker and
    client imports the workflow (and ctx.agent checks its schema at every call,
    on every replay). Each $ref to an $anchor or an embedded $id crawled the
    whole schema again (referencing crawls a registry not crawled yet at each
    such lookup): these thousand took about twenty seconds. Counted, not
    timed: the crawls of the real library."""
    crawls = 0
    crawl = referencing.Registry.crawl

    def counted(registry: referencing.Registry[Any]) -> referencing.Registry[Any]:
        nonlocal crawls
        crawls += 1
        return crawl(registry)

    monkeypatch.setattr(referencing.Registry, "crawl", counted)
    n = 500
    defs = {f"a{i}": {"$anchor": f"a{i}", "type": "object", "properties": {"next": {"$ref": f"#a{(i + 1) % n}"}}}
            for i in range(n)}
    defs |= {f"i{i}": {"$id": f"i{i}", "properties": {"next": {"$ref": f"i{(i + 1) % n}"}}} for i in range(n)}
    schema = {"$id": "https://example.test/root", "$defs": defs, "$ref": "#a0"}
    assert unresolved_ref(jsonschema.Draft202012Validator, schema) is None
    assert crawls == 1
    defs["a7"]["properties"]["next"]["$ref"] = "#a-none"
    assert unresolved_ref(jsonschema.Draft202012Validator, schema) == "#a-none"
