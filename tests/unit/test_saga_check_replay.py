"""``check_replay`` against a run a saga compensated in an earlier attempt:
the failure that started compensating stands in the attempts after it
(``Cursor.compensated_after``), so a replay check takes its outcome as the
run does, and does not stop there as at a failure the run would run again."""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from tests.support.producers import calls, did, fails, fails_first


@workflow(name="saga-check-replay", description="Hotel and flight undone after the car fails", phases=[])
def trip(ctx: WorkflowContext) -> Any:
    with ctx.saga() as saga:
        ctx.step("book-flight", lambda: did("book-flight"))
        saga.compensate("cancel-flight", lambda: did("cancel-flight"))
        ctx.step("book-hotel", lambda: did("book-hotel"))
        saga.compensate("cancel-hotel", lambda: fails_first("cancel-hotel"))
        ctx.step("book-car", lambda: fails("book-car"))


CAR_ERROR = "StepFailed: step 'book-car' raised RuntimeError: book-car"


def verdicts(env: WorkflowTestEnvironment, run_id: str) -> list[tuple[str, str]]:
    return [(check.verdict, check.message) for check in env.client.check_replay([run_id])]


def test_a_run_whose_failed_compensation_ran_again_checks_ok() -> None:
    calls.clear()
    env = WorkflowTestEnvironment([trip])
    failed = env.run(trip)
    assert verdicts(env, failed.run_id) == [("ok", "")]
    resumed = env.resume(failed.run_id)
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 2, CAR_ERROR)
    assert verdicts(env, failed.run_id) == [("ok", "")]


def test_a_run_that_compensated_across_a_crash_checks_ok() -> None:
    calls.clear()
    calls["cancel-hotel"] = 1  # it passes
    env = WorkflowTestEnvironment([trip])
    env.crash_after("cancel-hotel")
    crashed = env.run(trip)
    assert (crashed.status, crashed.attempt) == ("running", 1)
    resumed = env.resume(crashed.run_id)
    assert (resumed.status, resumed.attempt, resumed.error) == ("error", 2, CAR_ERROR)
    assert verdicts(env, crashed.run_id) == [("ok", "")]
