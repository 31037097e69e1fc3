"""Workflows that wait, for worker processes the waits tests start and kill."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

import redis

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


def rang_key(prefix: str) -> str:
    """The list every ring of ``alarm`` appends its run id to (the test's key prefix)."""
    return f"{prefix}:test:rang"


def _ring(run_id: str) -> str:
    """A side effect outside the journal: how many times the step after the timer ran."""
    client = redis.Redis.from_url(os.environ["CELERY_DURABLE_REDIS_URL"])
    try:
        client.rpush(rang_key(os.environ["CELERY_DURABLE_KEY_PREFIX"]), run_id)
    finally:
        client.close()
    return "rang"


@workflow(name="alarm", description="Sleeps until an instant, then rings once", phases=[])
def alarm(ctx: WorkflowContext) -> Any:
    ctx.sleep_until(datetime.fromtimestamp(int(ctx.args["at_ms"]) / 1000, UTC))
    run_id = ctx.run_id
    return ctx.step("ring", lambda: _ring(run_id))


engine = Engine(workflows=[await_signal, nap, alarm])
celery_app = engine.celery


def make_approval_engine() -> Engine:
    """The approval example's workflow on an engine built when the command runs,
    from the test's environment (the example's module-level engine reads it at import)."""
    from examples.approval import expense_approval

    return Engine(workflows=[expense_approval])


def make_engine() -> Engine:
    """This module's workflows on an engine built when the command runs, from
    the test's environment (in-process CLI tests: ``--app tests.support.apps.waits:make_engine``)."""
    return Engine(workflows=[await_signal, nap])
