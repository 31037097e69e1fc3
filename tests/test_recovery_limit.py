"""A run whose passes die every time is not taken over for ever (issue 25 item
4, SPEC §8): after ``max_recoveries`` take-overs in a row with nothing
journaled between them it ends ``error``, reason ``recovery_limit``,
resumable; each pass that died logged one ERROR with its traceback, and a
resume starts the count again."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
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
