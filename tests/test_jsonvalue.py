"""What counts as a JSON value (SPEC §4): exactly the values that survive a round trip unchanged."""

from __future__ import annotations

import datetime
import decimal
import math
import pickle
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celery_durable import JSON_NULL
from celery_durable.workflows.jsonvalue import (
    MAX_DEPTH,
    TOO_LARGE,
    PayloadError,
    dumps,
    encode_payload,
    is_json_value,
    json_problem,
    loads,
)

ACCEPTED = [
    None,
    True,
    False,
    0,
    -1,
    2**70,
    pytest.param(-(10**4000), id="-10**4000"),
    1.5,
    -0.0,
    1e308,
    5e-324,
    "",
    "héllo ✓ 😀 \u0000 \U0010ffff",
    [],
    {},
    [1, "two", 3.0, None, True, [], {}],
    {"a": {"b": [{"c": None}]}, "": 0, "ключ": "значение"},
    OrderedDict(a=1),
    JSON_NULL,
    [JSON_NULL],
    {"result": JSON_NULL},
]


@pytest.mark.parametrize("value", ACCEPTED, ids=repr)
def test_json_values_are_accepted(value: Any) -> None:
    assert json_problem(value) is None
    assert is_json_value(value) is True


REJECTED = [
    ((1, 2), "tuple"),
    ([1, (2,)], "tuple"),
    ({1, 2}, "set"),
    (frozenset({1}), "frozenset"),
    (b"bytes", "bytes"),
    (bytearray(b"x"), "bytearray"),
    (math.nan, "nan"),
    (math.inf, "inf"),
    (-math.inf, "inf"),
    ({"a": [1, math.nan]}, "nan"),
    ({1: "one"}, "1"),
    ({None: 1}, "None"),
    ({True: 1}, "True"),
    ({("a",): 1}, "('a',)"),
    ({"ok": {2.5: "x"}}, "2.5"),
    ("\ud800", "surrogate"),
    (["fine", "lone \udc00 surrogate"], "surrogate"),
    ({"\udfff": 1}, "surrogate"),
    ({"nested": {"\ud83d": 1}}, "surrogate"),
    (object(), "object"),
    (decimal.Decimal("1.5"), "Decimal"),
    (1 + 2j, "complex"),
    (datetime.datetime(2024, 1, 1), "datetime"),
    ({"at": datetime.date(2024, 1, 1)}, "date"),
    (range(3), "range"),
    (10**5000, "digits"),
]


@pytest.mark.parametrize(("value", "fragment"), REJECTED, ids=[f"{type(v).__name__}-{frag}" for v, frag in REJECTED])
def test_non_json_values_are_rejected_with_a_reason(value: Any, fragment: str) -> None:
    problem = json_problem(value)
    assert problem is not None
    assert fragment in problem
    assert is_json_value(value) is False


def nest(depth: int, leaf: Any = 0, *, as_dict: bool = False) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_dict else [value]
    return value


@pytest.mark.parametrize("as_dict", [False, True], ids=["lists", "dicts"])
def test_nesting_up_to_max_depth_is_accepted(as_dict: bool) -> None:
    value = nest(MAX_DEPTH, as_dict=as_dict)
    assert json_problem(value) is None
    assert loads(dumps(value)) == value


@pytest.mark.parametrize("as_dict", [False, True], ids=["lists", "dicts"])
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, MAX_DEPTH + 2, 100_000])
def test_nesting_deeper_than_max_depth_is_rejected(depth: int, as_dict: bool) -> None:
    problem = json_problem(nest(depth, as_dict=as_dict))
    assert problem is not None
    assert "deeper" in problem


def test_a_cycle_is_rejected_instead_of_looping() -> None:
    cycle: list[Any] = [1]
    cycle.append(cycle)
    assert json_problem(cycle) is not None


# --- encoding --------------------------------------------------------------------------------


def test_dumps_is_compact_and_keeps_text_verbatim() -> None:
    assert dumps({"a": [1, 2.5, None, True], "é": "😀"}) == '{"a":[1,2.5,null,true],"é":"😀"}'


def test_json_null_encodes_as_null() -> None:
    assert dumps(JSON_NULL) == "null"
    assert dumps({"r": [JSON_NULL]}) == '{"r":[null]}'
    assert loads(dumps(JSON_NULL)) is None


def test_dumps_refuses_what_json_problem_refuses() -> None:
    with pytest.raises(ValueError):
        dumps(math.nan)
    with pytest.raises(TypeError):
        dumps({1, 2})


def test_loads_accepts_bytes() -> None:
    assert loads(b'{"a":[1]}') == {"a": [1]}


def test_json_null_is_a_singleton_that_survives_pickle() -> None:
    assert type(JSON_NULL)() is JSON_NULL
    assert pickle.loads(pickle.dumps(JSON_NULL)) is JSON_NULL
    assert repr(JSON_NULL) == "JSON_NULL"


# --- properties ------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5),
    max_leaves=30,
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (so 1, 1.0 and True are told apart)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


# No per-example deadline: a loaded CI machine must not turn a slow example into a failure.
@settings(deadline=None)
@given(json_values)
def test_every_json_value_passes_and_round_trips(value: Any) -> None:
    assert json_problem(value) is None
    assert same(loads(dumps(value)), value)


# Built fresh per example: NaN and mutable samples make Hypothesis's replay of
# a sampled value compare unequal to itself.
BAD_LEAVES = [lambda: (1,), lambda: {1}, lambda: b"x", lambda: math.nan, lambda: math.inf, object,
              lambda: "\ud800", lambda: {2: "x"}]
non_json_leaves = st.integers(0, len(BAD_LEAVES) - 1).map(lambda i: BAD_LEAVES[i]())


@settings(deadline=None)
@given(json_values, non_json_leaves, st.booleans())
def test_one_bad_leaf_anywhere_fails_the_whole_value(value: Any, bad: Any, in_dict: bool) -> None:
    wrapped = {"ok": value, "bad": [bad]} if in_dict else [value, {"bad": bad}]
    assert json_problem(wrapped) is not None


# --- encode_payload: the one JSON-and-size check ------------------------------------------------

LIMIT = 64
BIG = "x" * 70
"""70 bytes of text, 72 of JSON: above LIMIT either way."""

# Each caller's wording, so that moving a call site onto encode_payload changes no message.
CALL_SITES = [
    pytest.param(
        {"noun": "Workflow args", "too_large": "{noun} are {size} bytes, above max_payload_bytes ({limit})"},
        {1, 2},
        "Workflow args must be a JSON value: set is not a JSON type",
        "Workflow args are 72 bytes, above max_payload_bytes (64)",
        id="start_workflow args",
    ),
    pytest.param(
        {"noun": "Workflow result"},
        {1, 2},
        "Workflow result must be a JSON value: set is not a JSON type",
        "Workflow result is 72 bytes, above max_payload_bytes (64)",
        id="run result",
    ),
    pytest.param(
        {"noun": "Agent output", "not_json": "{noun} is not a JSON value: {problem}"},
        {1, 2},
        "Agent output is not a JSON value: set is not a JSON type",
        "Agent output is 72 bytes, above max_payload_bytes (64)",
        id="agent output",
    ),
    pytest.param(
        {
            "noun": "Step result",
            "key": "fetch-{users}",
            "not_json": "{noun} must be a JSON value: {key}",
            "too_large": TOO_LARGE + ": {key}",
        },
        {1, 2},
        "Step result must be a JSON value: fetch-{users}",
        "Step result is 72 bytes, above max_payload_bytes (64): fetch-{users}",
        id="step result",
    ),
    pytest.param(
        {"noun": "Branch result"},
        {1, 2},
        "Branch result must be a JSON value: set is not a JSON type",
        "Branch result is 72 bytes, above max_payload_bytes (64)",
        id="branch result",
    ),
    pytest.param(
        {"noun": "ctx.log message", "text": True, "not_json": "{noun} holds a lone surrogate"},
        "lone \ud800",
        "ctx.log message holds a lone surrogate",
        "ctx.log message is 70 bytes, above max_payload_bytes (64)",
        id="log line",
    ),
    pytest.param(
        {"noun": "ctx.agent prompt", "text": True, "not_json": "{noun} holds a lone surrogate"},
        "lone \ud800",
        "ctx.agent prompt holds a lone surrogate",
        "ctx.agent prompt is 70 bytes, above max_payload_bytes (64)",
        id="agent prompt",
    ),
]


@pytest.mark.parametrize(("options", "bad", "not_json", "too_large"), CALL_SITES)
def test_encode_payload_words_each_callers_messages(
    options: dict[str, Any], bad: Any, not_json: str, too_large: str
) -> None:
    with pytest.raises(PayloadError) as refused:
        encode_payload(bad, LIMIT, **options)
    assert (str(refused.value), refused.value.reason) == (not_json, "not_json")
    with pytest.raises(PayloadError) as large:
        encode_payload(BIG, LIMIT, **options)
    assert (str(large.value), large.value.reason) == (too_large, "too_large")


def test_encode_payload_returns_what_the_journal_stores() -> None:
    assert encode_payload({"a": [1, None, JSON_NULL]}, LIMIT, noun="x") == '{"a":[1,null,null]}'
    assert encode_payload('say "hi"', LIMIT, noun="x") == '"say \\"hi\\""'
    assert encode_payload('say "hi"', LIMIT, noun="x", text=True) == 'say "hi"'


def test_the_size_is_utf8_bytes_and_the_limit_is_inclusive() -> None:
    fits = "é" * 31  # 62 bytes of text, 64 of JSON
    assert encode_payload(fits, 64, noun="x") == f'"{fits}"'
    assert encode_payload("é" * 32, 64, noun="x", text=True) == "é" * 32
    with pytest.raises(PayloadError, match="x is 66 bytes"):
        encode_payload("é" * 32, 64, noun="x")
    with pytest.raises(PayloadError, match="x is 65 bytes"):
        encode_payload("é" * 32 + "!", 64, noun="x", text=True)


def test_a_payload_error_is_a_value_error_that_pickles() -> None:
    with pytest.raises(ValueError) as caught:
        encode_payload(math.nan, LIMIT, noun="Workflow args")
    clone = pickle.loads(pickle.dumps(caught.value))
    assert type(clone) is PayloadError
    assert (str(clone), clone.reason) == (str(caught.value), "not_json")
    with pytest.raises(TypeError, match="text=True takes a str"):
        encode_payload(["not text"], LIMIT, noun="x", text=True)
