"""The display name a branch task takes in Flower once it has run (``tasks/flower_names.py``)."""

from __future__ import annotations

from celery_durable.tasks.flower_names import display_name


def test_a_task_that_ran_one_step_is_named_after_it() -> None:
    assert display_name("order", ["charge-card"]) == "order · step charge-card"
    assert display_name("order", ["charge-card", "charge-card"]) == "order · step charge-card"  # a retry, once


def test_a_few_steps_are_listed_and_many_are_the_first_and_a_count() -> None:
    assert display_name("order", ["a", "b", "c"]) == "order · steps a, b, c"
    assert display_name("order", [f"fetch-{i}" for i in range(12)]) == "order · steps fetch-0 +11"
    long = ["x" * 50, "y" * 50, "z" * 50]
    assert display_name("order", long) == f"order · steps {'x' * 50} +2"


def test_a_task_that_ran_no_step_keeps_its_name() -> None:
    assert display_name("order", []) is None
