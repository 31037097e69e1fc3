"""An engine that subprocess workers load by import path in the tests."""

from __future__ import annotations

import os
import time
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


@workflow(name="fan", description="Sleeps in parallel branches", phases=[{"title": "Fan"}])
def fan(ctx: WorkflowContext) -> Any:
    ctx.phase("Fan")
    count = int(ctx.args.get("count", 4))
    seconds = float(ctx.args.get("seconds", 0.5))
    return ctx.parallel(
        [lambda i=i: ctx.step(f"sleep-{i}", lambda: (time.sleep(seconds), os.getpid())[1]) for i in range(count)]
    )


engine = Engine(workflows=[fan])
celery_app = engine.celery
