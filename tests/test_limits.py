"""Run limits, SPEC §6: validation, nano-credit rounding, overrides and the effective ceilings."""

from __future__ import annotations

import math
from typing import Any

import pytest

from celery_durable import WorkflowDefinitionError
from celery_durable.workflows.limits import (
    LIMIT_KEYS,
    MAX_TIMEOUT_SECONDS,
    effective_limits,
    merge_limits,
    nano_credits,
    validate_limits,
)

SUBAGENT_KEYS = ["max_concurrent_subagents", "max_total_subagents"]


def check(limits: Any, *, allow_none: bool = False) -> dict[str, Any]:
    return validate_limits(limits, allow_none=allow_none)


def test_limit_keys_are_the_spec_keys() -> None:
    assert set(LIMIT_KEYS) == {"max_concurrent_subagents", "max_total_subagents", "max_ai_credits", "timeout_seconds"}
    assert MAX_TIMEOUT_SECONDS == 2147483.647


def test_valid_limits_are_returned_as_a_copy() -> None:
    limits = {"max_concurrent_subagents": 2, "max_total_subagents": 10, "max_ai_credits": 1.5, "timeout_seconds": 60}
    checked = check(limits)
    assert checked == limits
    assert checked is not limits


def test_empty_limits_are_valid() -> None:
    assert check({}) == {}


@pytest.mark.parametrize("limits", [None, [], [("timeout_seconds", 5)], "timeout_seconds=5"], ids=repr)
def test_limits_must_be_a_dict(limits: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="must be a dict"):
        check(limits)


@pytest.mark.parametrize("allow_none", [False, True])
def test_unknown_key_is_rejected_by_name(allow_none: bool) -> None:
    with pytest.raises(WorkflowDefinitionError, match="Unknown key in limits: retries"):
        check({"timeout_seconds": 5, "retries": 3}, allow_none=allow_none)


def test_errors_name_the_key_and_where() -> None:
    with pytest.raises(WorkflowDefinitionError, match=r"overrides\.max_total_subagents"):
        validate_limits({"max_total_subagents": 0}, allow_none=True, where="overrides")


def test_invalid_limits_are_value_errors() -> None:
    with pytest.raises(ValueError):
        check({"timeout_seconds": 0})


# --- subagent counts: ints > 0 ---------------------------------------------------------------


@pytest.mark.parametrize("key", SUBAGENT_KEYS)
@pytest.mark.parametrize("value", [1, 2, 4096, 10**12])
def test_subagent_counts_accept_positive_ints(key: str, value: int) -> None:
    assert check({key: value}) == {key: value}


@pytest.mark.parametrize("key", SUBAGENT_KEYS)
@pytest.mark.parametrize("value", [0, -1, True, False, 1.0, 2.5, math.inf, math.nan, "3"], ids=repr)
def test_subagent_counts_reject_everything_else(key: str, value: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match=key):
        check({key: value})


# --- max_ai_credits: rounds to at least one nano-credit --------------------------------------


@pytest.mark.parametrize(
    ("credits", "nanos"),
    [
        (6e-10, 1),
        (4e-10, 0),
        (5e-10, 0),  # half-to-even: 0.5 rounds to 0
        (1.5e-9, 2),  # 1.5 rounds to 2
        (2.5e-9, 2),  # 2.5 rounds to 2
        (3.5e-9, 4),
        (1e-9, 1),
        (1, 10**9),
        (0.25, 250_000_000),
        (1e20, 10**29),
    ],
)
def test_nano_credits_round_half_to_even(credits: float, nanos: int) -> None:
    assert nano_credits(credits) == nanos


@pytest.mark.parametrize(
    "value", [6e-10, 1e-9, 1.5e-9, 0.25, 1, 1000, 1e20, 1e300, pytest.param(10**400, id="10**400")], ids=repr
)
def test_max_ai_credits_accepts_at_least_one_nano_credit(value: float) -> None:
    assert check({"max_ai_credits": value}) == {"max_ai_credits": value}


@pytest.mark.parametrize(
    "value", [4e-10, 5e-10, 1e-12, 0, 0.0, -1, -1e-9, math.inf, -math.inf, math.nan, True, "1", [1]], ids=repr
)
def test_max_ai_credits_rejects_non_positive_tiny_or_non_finite(value: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="max_ai_credits"):
        check({"max_ai_credits": value})


# --- timeout_seconds: 0 < t <= 2147483.647 ---------------------------------------------------


@pytest.mark.parametrize("value", [2147483.647, 2147483, 1, 0.001, 1e-9], ids=repr)
def test_timeout_seconds_accepts_the_range(value: float) -> None:
    assert check({"timeout_seconds": value}) == {"timeout_seconds": value}


@pytest.mark.parametrize(
    "value",
    [2147483.648, 2147484, 0, 0.0, -1, math.inf, -math.inf, math.nan, pytest.param(10**400, id="10**400"), True, "60"],
    ids=repr,
)
def test_timeout_seconds_rejects_outside_the_range(value: Any) -> None:
    with pytest.raises(WorkflowDefinitionError, match="timeout_seconds"):
        check({"timeout_seconds": value})


# --- None: refused in meta, "unlimited" in overrides -----------------------------------------


@pytest.mark.parametrize("key", LIMIT_KEYS)
def test_meta_limits_refuse_none(key: str) -> None:
    with pytest.raises(WorkflowDefinitionError, match=key):
        check({key: None}, allow_none=False)


@pytest.mark.parametrize("key", LIMIT_KEYS)
def test_overrides_accept_none(key: str) -> None:
    assert check({key: None}, allow_none=True) == {key: None}


def test_overrides_still_validate_numbers() -> None:
    with pytest.raises(WorkflowDefinitionError, match="max_total_subagents"):
        check({"timeout_seconds": None, "max_total_subagents": 0}, allow_none=True)


# --- merge_limits: omitted keeps, number replaces, None clears -------------------------------

BASE = {"max_total_subagents": 5, "timeout_seconds": 60}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (None, BASE),
        ({}, BASE),
        ({"max_total_subagents": 10}, {"max_total_subagents": 10, "timeout_seconds": 60}),
        ({"timeout_seconds": None}, {"max_total_subagents": 5}),
        ({"max_ai_credits": 2.5}, {**BASE, "max_ai_credits": 2.5}),
        ({"max_ai_credits": None}, BASE),
        ({"max_total_subagents": None, "timeout_seconds": None}, {}),
    ],
    ids=["none", "empty", "replace", "clear", "add", "clear-absent", "clear-all"],
)
def test_merge_limits(override: dict[str, Any] | None, expected: dict[str, Any]) -> None:
    base = dict(BASE)
    assert merge_limits(base, override) == expected
    assert base == BASE


# --- effective_limits: concurrency falls back to the total -----------------------------------


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({}, {}),
        ({"max_total_subagents": 5}, {"max_total_subagents": 5, "max_concurrent_subagents": 5}),
        (
            {"max_total_subagents": 5, "max_concurrent_subagents": 2},
            {"max_total_subagents": 5, "max_concurrent_subagents": 2},
        ),
        ({"max_concurrent_subagents": 2}, {"max_concurrent_subagents": 2}),
        ({"timeout_seconds": 9}, {"timeout_seconds": 9}),
    ],
    ids=["empty", "fallback", "explicit", "concurrent-only", "unrelated"],
)
def test_effective_limits(limits: dict[str, Any], expected: dict[str, Any]) -> None:
    before = dict(limits)
    assert effective_limits(limits) == expected
    assert limits == before


def test_clearing_the_concurrency_override_falls_back_to_the_total() -> None:
    meta = {"max_total_subagents": 8, "max_concurrent_subagents": 2}
    merged = merge_limits(meta, {"max_concurrent_subagents": None})
    assert effective_limits(merged)["max_concurrent_subagents"] == 8


# --- the messages, word for word --------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (None, "limits must be a dict, got NoneType"),
        ({"retries": 1, "timeout_seconds": 0}, "Unknown key in limits: retries"),
        ({7: 1}, "Unknown key in limits: 7"),
        ({"max_total_subagents": 0}, "limits.max_total_subagents must be a positive integer, got 0"),
        ({"max_concurrent_subagents": 1.5}, "limits.max_concurrent_subagents must be a positive integer, got 1.5"),
        ({"max_ai_credits": math.inf}, "limits.max_ai_credits must be a finite number above 0, got inf"),
        ({"max_ai_credits": 4e-10}, "limits.max_ai_credits rounds to zero nano-credits: 4e-10"),
        ({"timeout_seconds": True}, "limits.timeout_seconds must be a finite number above 0, got True"),
        ({"timeout_seconds": 2147483.648}, "limits.timeout_seconds must be at most 2147483.647, got 2147483.648"),
        ({"timeout_seconds": None}, "limits.timeout_seconds must be a number, not None"),
    ],
    ids=repr,
)
def test_each_problem_has_one_clear_message(limits: Any, message: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        check(limits)
    assert str(info.value) == message


def test_overrides_name_where_they_come_from() -> None:
    with pytest.raises(WorkflowDefinitionError) as info:
        validate_limits({"max_ai_credits": -1}, allow_none=True, where="overrides")
    assert str(info.value) == "overrides.max_ai_credits must be a finite number above 0, got -1"
