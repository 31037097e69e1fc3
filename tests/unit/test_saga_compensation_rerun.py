"""SPEC §4 against §5c: a resumed run runs a failed step again, and a
compensation is a step. A saga undoes in reverse (undo-2, then undo-1); when
undo-2 raised and undo-1 passed, the run ended ``CompensationFailed``. Once
what made undo-2 fail is fixed, ``resume_workflow`` must run undo-2 again
(else the hotel stays booked), in place: undo-1, journaled after it, is not
run again, nor is the failure that started compensating, which stands.
With no undo failing now, the original exception goes on, as if undo-2 had
passed the first time."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

from celery_durable import CompensationFailed, StepFailed, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from tests.support.producers import BROKEN, calls, did, fails_first


def car_fails() -> str:
    did("book-car")
    raise RuntimeError("no car left")


def book_and_fail(ctx: WorkflowContext) -> None:
    """Hotel and flight, each with its undo (the hotel's fails first), then the car fails."""
    with ctx.saga() as saga:
        ctx.step("book-flight", lambda: did("book-flight"))
        saga.compensate("cancel-flight", lambda: did("cancel-flight"))
        ctx.step("book-hotel", lambda: did("book-hotel"))
        saga.compensate("cancel-hotel", lambda: fails_first("cancel-hotel"))
        ctx.step("book-car", car_fails)


@workflow(name="saga-undo-rerun", description="A saga whose last-registered undo fails the first time", phases=[])
def trip(ctx: WorkflowContext) -> Any:
    book_and_fail(ctx)


BOOKED = Counter({"book-flight": 1, "book-hotel": 1, "book-car": 1})
FIRST = BOOKED + Counter({"cancel-hotel": 1, "cancel-flight": 1})
CAR_ERROR = "StepFailed: step 'book-car' raised RuntimeError: no car left"


def hotel_error(run: int) -> str:
    return (
        "StepFailed: step 'cancel-hotel' raised CompensationFailed: Compensation failed: "
        f"cancel-hotel: RuntimeError: cancel-hotel failed on run {run}"
    )


def fresh() -> WorkflowTestEnvironment:
    calls.clear()
    BROKEN.clear()
    return WorkflowTestEnvironment(
        [trip, caught_trip, branch_trip, nested_trip, trip_with_a_caught_failure, then_the_bus]
    )


def test_a_failed_compensation_runs_again_on_resume_and_the_original_failure_goes_on() -> None:
    env = fresh()
    failed = env.run(trip)
    assert (failed.status, failed.error) == ("error", hotel_error(1))
    assert calls == FIRST
    resumed = env.resume(failed.run_id)
    assert calls == FIRST + Counter({"cancel-hotel": 1}), "only the failed undo runs again"
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 2, CAR_ERROR)
    steps = {step["key"]: step for step in env.detail(failed.run_id).to_dict()["steps"]}
    assert steps["cancel-hotel"]["status"] == "completed"


def test_a_compensation_that_fails_again_on_resume_is_compensation_failed_again() -> None:
    env = fresh()
    BROKEN.add("cancel-hotel")
    failed = env.run(trip)
    resumed = env.resume(failed.run_id)
    assert calls == FIRST + Counter({"cancel-hotel": 1})
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 2, hotel_error(2))
    BROKEN.clear()
    again = env.resume(failed.run_id)
    assert calls == FIRST + Counter({"cancel-hotel": 2})
    assert (again.status, again.attempt, again.error) == ("error", 3, CAR_ERROR)


def test_an_attempt_that_dies_after_the_rerun_undo_resumes_past_it() -> None:
    """Process death between the re-run undo and the end of compensating:
    the next attempt replays both undos from the journal."""
    env = fresh()
    failed = env.run(trip)
    env.crash_after("cancel-hotel")
    crashed = env.resume(failed.run_id)
    assert (crashed.status, crashed.attempt) == ("running", 2)
    assert calls == FIRST + Counter({"cancel-hotel": 1})
    resumed = env.resume(failed.run_id)
    assert calls == FIRST + Counter({"cancel-hotel": 1}), "nothing runs again"
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 3, CAR_ERROR)


@workflow(name="saga-undo-rerun-caught", description="Reacts to how the saga ended, with a step", phases=[])
def caught_trip(ctx: WorkflowContext) -> Any:
    try:
        book_and_fail(ctx)
    except CompensationFailed:
        ctx.step("page-oncall", lambda: did("page-oncall"))
        raise
    except StepFailed as failed:
        key = failed.key
        return ctx.step("tell-customer", lambda: did("tell-customer") and f"no trip: {key}")


def test_what_followed_the_failed_compensation_is_not_history_once_it_passes() -> None:
    """The older attempt paged on call after CompensationFailed; the undo
    passes now, so the block raises the car's failure, which the code meets
    with another step: a new future, not a divergence from the old one."""
    env = fresh()
    failed = env.run(caught_trip)
    assert failed.status == "error"
    assert calls == FIRST + Counter({"page-oncall": 1})
    resumed = env.resume(failed.run_id)
    assert (resumed.status, resumed.result) == ("completed", "no trip: book-car")
    assert calls == FIRST + Counter({"page-oncall": 1, "cancel-hotel": 1, "tell-customer": 1})


@workflow(name="saga-undo-rerun-branch", description="A branch's saga whose undo fails the first time", phases=[])
def branch_trip(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda: ctx.step("other", lambda: did("other")), lambda: book_and_fail(ctx)], errors="raise")


def test_a_failed_compensation_in_a_branch_runs_again_on_resume() -> None:
    env = fresh()
    failed = env.run(branch_trip)
    assert (failed.status, failed.error) == ("error", hotel_error(1))
    assert calls == FIRST + Counter({"other": 1})
    resumed = env.resume(failed.run_id)
    assert calls == FIRST + Counter({"other": 1, "cancel-hotel": 1})
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 2, CAR_ERROR)


@workflow(name="saga-undo-rerun-nested", description="The trip's saga inside one that books a train", phases=[])
def nested_trip(ctx: WorkflowContext) -> Any:
    with ctx.saga() as outer:
        ctx.step("book-train", lambda: did("book-train"))
        outer.compensate("cancel-train", lambda: did("cancel-train"))
        book_and_fail(ctx)


def test_an_inner_sagas_failed_compensation_stands_once_the_outer_saga_undid_after_it() -> None:
    """The inner saga raised CompensationFailed, and the outer one undid the
    train for it. Run again and passing, the inner undo would raise the
    car's failure instead, which the outer saga never met: the hotel's undo
    stands (``Cursor.compensated_after``), and so does the run's error."""
    env = fresh()
    failed = env.run(nested_trip)
    assert (failed.status, failed.error) == ("error", hotel_error(1))
    assert calls == FIRST + Counter({"book-train": 1, "cancel-train": 1})
    resumed = env.resume(failed.run_id)
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 2, hotel_error(1))
    assert calls == FIRST + Counter({"book-train": 1, "cancel-train": 1}), "nothing runs again"


@workflow(name="saga-undo-rerun-caught-first", description="The trip, a failure caught before the hotel", phases=[])
def trip_with_a_caught_failure(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        ctx.step("book-flight", lambda: did("book-flight"))
        saga.compensate("cancel-flight", lambda: did("cancel-flight"))
        with contextlib.suppress(StepFailed):
            ctx.step("seat", lambda: fails_first("seat"))
        ctx.step("book-hotel", lambda: did("book-hotel"))
        saga.compensate("cancel-hotel", lambda: fails_first("cancel-hotel"))
        ctx.step("book-car", car_fails)


def test_an_attempt_that_dies_as_the_undo_runs_again_keeps_the_failures_before_it_standing() -> None:
    """The attempt that runs the hotel's undo again dies as it starts (its
    re-run begun, not journaled). The next attempt must still find the
    compensations journaled after the failures of the block, so that they
    stand: the caught seat failure (before the hotel's undo was registered)
    and the car's are not run again."""
    env = fresh()
    failed = env.run(trip_with_a_caught_failure)
    assert calls == FIRST + Counter({"seat": 1})
    env.crash_before("cancel-hotel")
    crashed = env.resume(failed.run_id)
    assert (crashed.status, crashed.attempt) == ("running", 2)
    resumed = env.resume(failed.run_id)
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 3, CAR_ERROR)
    assert calls == FIRST + Counter({"seat": 1, "cancel-hotel": 1}), "neither the seat nor the car runs again"


def bus_fails() -> str:
    did("book-bus")
    raise RuntimeError("no bus left")


@workflow(name="saga-undo-rerun-then-bus", description="The trip's saga caught, then a saga around a bus", phases=[])
def then_the_bus(ctx: WorkflowContext) -> Any:
    with contextlib.suppress(StepFailed):
        book_and_fail(ctx)
    with contextlib.suppress(StepFailed):
        ctx.step("log", lambda: fails_first("log"))
    with ctx.saga() as saga:
        ctx.step("book-train", lambda: did("book-train"))
        saga.compensate("cancel-train", lambda: did("cancel-train"))
        ctx.step("book-bus", bus_fails)


def test_a_failed_compensation_stands_once_a_later_saga_undid_work() -> None:
    """The trip's failure was caught and the run went on; a later saga then
    undid the train for the bus's failure. Run again, the hotel's undo would
    cut what followed it, the train's cancellation with it, and the bus
    would run again: it stands, and every resume ends as the run did."""
    env = fresh()
    BROKEN.add("log")
    failed = env.run(then_the_bus)
    bus_error = "StepFailed: step 'book-bus' raised RuntimeError: no bus left"
    assert (failed.status, failed.error) == ("error", bus_error)
    ran = FIRST + Counter({"log": 1, "book-train": 1, "book-bus": 1, "cancel-train": 1})
    assert calls == ran
    resumed = env.resume(failed.run_id)
    assert (resumed.status, resumed.error, calls) == ("error", bus_error, ran)
    again = env.resume(failed.run_id)
    assert (again.status, again.attempt, again.error, calls) == ("error", 3, bus_error, ran)
