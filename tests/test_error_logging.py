"""Every run that ends ``error`` says so at WARNING, once, naming the run, its
workflow and the reason (issue 25 item 14): a run that stopped on
nondeterminism logged nothing above INFO, and Flower showed its pass as a
task that succeeded."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
from tests.conftest import DurableFactory
from tests.support.poll import RUN_BOUND, poll

SHAPE = {"first": "a"}


@workflow(name="shifty", description="Asks for another step on its second pass", phases=[])
def shifty(ctx: WorkflowContext) -> Any:
    ctx.step(SHAPE["first"], lambda: 1)
    SHAPE["first"] = "b"  # the next pass (after the wait) replays a different first step
    ctx.sleep(0.01)
    return ctx.step("last", lambda: 2)


@workflow(name="raises", description="Its code raises", phases=[])
def raises(ctx: WorkflowContext) -> Any:
    raise ValueError("bad input")


@pytest.mark.parametrize(("name", "reason"), [("shifty", "nondeterminism"), ("raises", "exception")])
def test_a_run_that_ends_error_logs_one_warning_naming_it(
    durable: DurableFactory, caplog: pytest.LogCaptureFixture, name: str, reason: str
) -> None:
    SHAPE["first"] = "a"
    caplog.set_level(logging.WARNING, logger="celery_durable")
    d = durable([shifty, raises])
    run_id = d.client.start_workflow(name)
    envelope = d.client.wait_for_workflow_run(run_id, timeout=30)
    assert (envelope.status, envelope.reason) == ("error", reason)
    def said() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.levelno == logging.WARNING and run_id in r.getMessage()]

    # its pass logs it right after settling
    poll(said, within=RUN_BOUND, what="the warning, logged once the run is settled")
    assert len(said()) == 1, [r.getMessage() for r in said()]
    assert f"'{name}'" in said()[0].getMessage() and reason in said()[0].getMessage()
