"""Workflows that wait, for worker processes the waits tests start and kill."""

from __future__ import annotations

from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


@workflow(name="await-signal", description="Waits for the signal 'go'", phases=[])
def await_signal(ctx: WorkflowContext) -> Any:
    before = ctx.step("before", lambda: "journaled")
    signal = ctx.wait_for_signal("go")
    return {"before": before, "payload": signal.payload}


@workflow(name="nap", description="Sleeps", phases=[])
def nap(ctx: WorkflowContext) -> Any:
    ctx.sleep(float(ctx.args.get("seconds", 1)))
    return ctx.now().isoformat()


engine = Engine(workflows=[await_signal, nap])
celery_app = engine.celery


def make_approval_engine() -> Engine:
    """The approval example's workflow on an engine built when the command runs,
    from the test's environment (the example's module-level engine reads it at import)."""
    from examples.approval import expense_approval

    return Engine(workflows=[expense_approval])


def make_engine() -> Engine:
    """The same workflows on an engine built when the command runs, from the
    test's environment (in-process CLI tests)."""
    return Engine(workflows=[await_signal, nap])
