"""SPEC §5c: a failed compensation runs again on resume (``Cursor.compensated_after``),
unless a compensation is journaled past its saga. There an enclosing or a
later saga already undid work for the exception the saga raised then: run
again and passing, the undo would change that exception, and the run could
end well with that work undone (the train cancelled, the run completed). So
it stands, as the failures that saga undid do."""

from __future__ import annotations

import contextlib
from typing import Any

from celery_durable import CompensationFailed, StepFailed, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from tests.support.producers import calls, did, fails, fails_first


@workflow(name="saga-rerun-later-saga", description="A caught saga, then a saga whose bus fails once", phases=[])
def later_saga(ctx: WorkflowContext) -> Any:
    with contextlib.suppress(StepFailed), ctx.saga() as saga:
        ctx.step("book-hotel", lambda: did("book-hotel"))
        saga.compensate("cancel-hotel", lambda: fails_first("cancel-hotel"))
        ctx.step("book-car", lambda: fails("book-car"))
    with ctx.saga() as saga:
        ctx.step("book-train", lambda: did("book-train"))
        saga.compensate("cancel-train", lambda: did("cancel-train"))
        ctx.step("book-bus", lambda: fails_first("book-bus"))
    return "trip booked"


@workflow(name="saga-rerun-nested-caught", description="An inner saga's car failure is caught", phases=[])
def nested_caught(ctx: WorkflowContext) -> Any:
    with ctx.saga() as outer:
        ctx.step("book-train", lambda: did("book-train"))
        outer.compensate("cancel-train", lambda: did("cancel-train"))
        try:
            with ctx.saga() as saga:
                ctx.step("book-hotel", lambda: did("book-hotel"))
                saga.compensate("cancel-hotel", lambda: fails_first("cancel-hotel"))
                ctx.step("book-car", lambda: fails("book-car"))
        except CompensationFailed:
            raise
        except StepFailed:
            pass  # no car, the hotel undone: the train is enough
    return "train only"


def test_a_later_sagas_compensated_failure_stands_when_an_earlier_undo_reruns() -> None:
    calls.clear()
    env = WorkflowTestEnvironment([later_saga])
    failed = env.run(later_saga)
    assert failed.status == "error"
    assert calls["cancel-train"] == 1
    resumed = env.resume(failed.run_id)
    assert calls["book-bus"] == 1, "the bus's failure, which cancelled the train, ran again"
    assert resumed.status == "error", "the run completed with its train cancelled"


def test_an_outer_saga_that_compensated_does_not_end_well_after_an_inner_undo_reruns() -> None:
    calls.clear()
    env = WorkflowTestEnvironment([nested_caught])
    failed = env.run(nested_caught)
    assert failed.status == "error"
    assert calls["cancel-train"] == 1
    resumed = env.resume(failed.run_id)
    assert resumed.status == "error", f"the run ended {resumed.status} ({resumed.result}) with its train cancelled"
