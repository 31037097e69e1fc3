"""SPEC §5c against §4: a failure is run again by a later attempt, unless that
attempt began compensating after it. The attempt here dies right after its
first compensation is journaled; the next replays to there and must resume
the compensations, not run the failure again (which passes now)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from celery_durable import StepFailed, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment

calls: Counter[str] = Counter()


def did(key: str) -> str:
    calls[key] += 1
    return key


def fails_first_time(key: str) -> str:
    did(key)
    if calls[key] == 1:
        raise RuntimeError(f"{key} fails the first time")
    return f"{key}-passed"


@workflow(name="saga-fanout", description="A saga around a fan-out whose branch fails", phases=[])
def saga_fanout(ctx: WorkflowContext) -> Any:
    try:
        with ctx.saga() as saga:
            ctx.step("a0", lambda: did("a0"))
            saga.compensate("undo-a0", lambda: did("undo-a0"))
            saga.compensate("undo-a1", lambda: did("undo-a1"))
            ctx.parallel(
                [lambda: ctx.step("a", lambda: did("a")), lambda: ctx.step("b", lambda: fails_first_time("b"))],
                errors="raise",
            )
            return "booked"
    except StepFailed as failed:
        return f"undone after {failed.key}"


def test_a_fanout_failure_a_saga_began_to_undo_stands_in_the_next_attempt() -> None:
    calls.clear()
    env = WorkflowTestEnvironment([saga_fanout])
    env.crash_after("undo-a1")
    crashed = env.run(saga_fanout)
    assert (crashed.status, crashed.attempt) == ("running", 1)
    assert calls == Counter({"a0": 1, "a": 1, "b": 1, "undo-a1": 1})
    resumed = env.resume(crashed.run_id)
    assert (resumed.status, resumed.attempt, resumed.result) == ("completed", 2, "undone after b")
    assert calls == Counter({"a0": 1, "a": 1, "b": 1, "undo-a1": 1, "undo-a0": 1}), "b is not run again"
