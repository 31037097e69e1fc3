"""A run whose passes die every time is not taken over for ever (issue 25 item
4, SPEC §8): after ``max_recoveries`` take-overs in a row with nothing
journaled between them it ends ``error``, reason ``recovery_limit``,
resumable; each pass that died logged one ERROR with its traceback, and a
resume starts the count again."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pytest

from celery_durable import ChildWorkflowFailed, FunctionRunner, StepFailed, Workflow, WorkflowContext, workflow
from celery_durable.testing.explorer import ExplorerEnvironment
from celery_durable.testing.tracer import Tracer
from tests.conftest import DurableFactory

LEASE = 2.0
DOOMED = {"on": True}


class Escape(BaseException):
    """Not an error workflow code can meet: it escapes the engine, as a worker
    killed by what it ran would, and the attempt dies."""


@workflow(name="doomed", description="Its pass dies every time, until the bug is fixed", phases=[])
def doomed(ctx: WorkflowContext) -> Any:
    first = ctx.step("first", lambda: "journaled once")
    if DOOMED["on"]:
        raise Escape("the pass dies here")
    return first


def test_a_run_whose_passes_always_die_stops_after_max_recoveries_and_resumes_once_fixed(
    durable: DurableFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    DOOMED["on"] = True
    # Two slots for four passes that die: a pass that dies gives its slot back (a
    # BaseException reaching Celery's threads pool used to take the slot for good).
    d = durable([doomed], concurrency=2, lease_seconds=LEASE, max_recoveries=3)
    run_id = d.client.start_workflow("doomed")
    # Attempt 1 dies, 2 to 4 are take-overs that die the same way: then it stops.
    stopped = d.client.wait_for_workflow_run(run_id, timeout=LEASE * 3 * 5 + 10)
    assert (stopped.status, stopped.reason, stopped.can_resume, stopped.attempt) == (
        "error", "recovery_limit", True, 4,
    )  # fmt: skip
    assert stopped.error is not None and "Taken over 3 times in a row" in stopped.error
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 4 and all("died of an unexpected error" in r.getMessage() and r.exc_info for r in errors), (
        "one ERROR line, with its traceback, per pass that died (Celery's own report of it is not a second one)",
        [r.getMessage()[:120] for r in errors],
    )
    DOOMED["on"] = False  # the fix is deployed
    resumed = d.client.resume_workflow(run_id, timeout=30)
    assert (resumed.status, resumed.result) == ("completed", "journaled once")


# -- a failure journaled again by every attempt is no progress ---------------------------
# A step fails and the workflow goes on; a later step kills the pass every
# time. Each take-over re-runs the failed step (a failure is retried by the
# next attempt, SPEC §4) and journals the same failure again: one failure in
# place of another is no new journal entry, so the take-overs still count to
# max_recoveries. In the explorer's environment: real scripts, virtual time.

PASSES: dict[str, int] = {}


def _ran(name: str) -> None:
    PASSES[name] = PASSES.get(name, 0) + 1


def _fails() -> Any:
    _ran("flaky")
    raise RuntimeError("fails in every attempt")


def _dies() -> Any:
    _ran("boom")
    raise Escape("the worker dies in this step")


@workflow(name="caught-then-dies", description="A failed step caught, then a step that dies", phases=[])
def caught_then_dies(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: _ran("first"))
    with contextlib.suppress(StepFailed):
        ctx.step("flaky", _fails)
    return ctx.step("boom", _dies)


@workflow(name="branch-fails-then-dies", description="A branch fails (a slot), then a step dies", phases=[])
def branch_fails_then_dies(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: _ran("first"))
    ctx.parallel([lambda: ctx.step("flaky", _fails), lambda: ctx.step("fine", lambda: 1)], errors="return")
    return ctx.step("boom", _dies)


@workflow(name="call-fails-then-dies", description="A called task fails, caught, then a step dies", phases=[])
def call_fails_then_dies(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: _ran("first"))
    with contextlib.suppress(StepFailed):
        ctx.call("flaky", "fleet.flaky")
    return ctx.step("boom", _dies)


@workflow(name="failing-child", description="A child run that ends error", phases=[])
def failing_child(ctx: WorkflowContext) -> Any:
    return ctx.step("flaky", _fails)


@workflow(name="child-fails-then-dies", description="A child that fails, caught, then a step that dies", phases=[])
def child_fails_then_dies(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: _ran("first"))
    with contextlib.suppress(ChildWorkflowFailed):
        ctx.child("flaky", failing_child)
    return ctx.step("boom", _dies)


@workflow(name="turn-fails-then-dies", description="An agent turn fails (None), then a step dies", phases=[])
def turn_fails_then_dies(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: _ran("first"))
    ctx.agent("fails in every attempt", label="flaky")
    return ctx.step("boom", _dies)


@pytest.mark.parametrize(
    ("doomed_run", "reruns"),
    [(caught_then_dies, True), (branch_fails_then_dies, True), (call_fails_then_dies, True),
     (turn_fails_then_dies, True),
     # The child ended error once; each attempt of the parent finds it so and journals its end again.
     (child_fails_then_dies, False)],
    ids=["step", "branch", "call", "agent", "child"],
)  # fmt: skip
def test_a_failure_every_attempt_journals_again_does_not_keep_a_dying_run_alive(
    doomed_run: Workflow, reruns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CELERY_DURABLE_MAX_RECOVERIES", "3")
    PASSES.clear()
    env = ExplorerEnvironment(
        [doomed_run, failing_child],
        Tracer(),
        tasks={"fleet.flaky": _fails},
        agent_runner=FunctionRunner(default=lambda request: _fails()),
    )
    limit = env.settings.max_recoveries
    run_id = env.client.start_workflow(doomed_run)
    for _ in range(limit + 2):  # the first attempt, its take-overs, and one to spare
        with contextlib.suppress(Escape):  # the pass's death reaches the environment's caller
            if env.recover(lambda: env.settled(run_id)):
                break
    run = env.client.get_workflow_run(run_id)
    assert (run.status, run.reason, run.can_resume, run.attempt) == ("error", "recovery_limit", True, limit + 1), (
        run.status, run.attempt, PASSES,
    )  # fmt: skip
    assert run.error is not None and f"Taken over {limit} times in a row" in run.error
    # Every attempt met the failure again (ran the failed step again, or the
    # failed child's end) and died at the next step; the first step ran once.
    assert (PASSES["first"], PASSES["flaky"], PASSES["boom"]) == (1, limit + 1 if reruns else 1, limit + 1), PASSES
