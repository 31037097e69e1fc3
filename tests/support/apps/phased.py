"""A workflow with three declared phases, logs, a fan-out and a result, for
the CLI, progress and Flower tests (loaded by import path in subprocesses).

``args``: ``pause`` seconds inside every step (default 0.2), ``fail`` true
to make the last step raise, ``logs`` extra log lines in the Crunch phase.
"""

from __future__ import annotations

import time
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


def _slow(value: Any, seconds: float) -> Any:
    time.sleep(seconds)
    return value


@workflow(
    name="phased",
    description="Fetches, crunches and reports, one phase each",
    phases=[
        {"title": "Fetch", "detail": "Read the inputs"},
        {"title": "Crunch"},
        {"title": "Report", "detail": "Write the summary"},
    ],
)
def phased(ctx: WorkflowContext) -> Any:
    pause = float(ctx.args.get("pause", 0.2))
    ctx.phase("Fetch")
    ctx.log("fetching 3 items")
    items = ctx.step("fetch", lambda: _slow([1, 2, 3], pause))
    ctx.phase("Crunch")
    ctx.log(f"crunching {len(items)} items")
    for i in range(int(ctx.args.get("logs", 0))):
        ctx.log(f"note {i}")
    squares = ctx.parallel([lambda i=i: ctx.step(f"square-{i}", lambda i=i: _slow(i * i, pause)) for i in items])
    ctx.phase("Report")
    ctx.log("writing the report")

    def report() -> dict[str, Any]:
        if ctx.args.get("fail"):
            raise RuntimeError("the printer is on fire")
        return _slow({"total": sum(squares)}, pause)

    return ctx.step("report", report)


engine = Engine(workflows=[phased])


def make_engine() -> Engine:
    """The engine with settings read now: in-process CLI tests (``--app
    tests.support.apps.phased:make_engine``) set the environment per test."""
    return Engine(workflows=[phased])
